"""Methods side by side on the same held-out samples: accuracy by position, intervals, paired tests.

    rows = {name: MethodSetup.of_scales(s) for name, s in {"vanilla": [1.0] * 30, "PI": pi, "LPES": scales}.items()}
    scored = score_methods(lm, "multi_needle", rows, num_samples=200)
    table = paired_table(scored)  # :mod:`.paired_table`: the tests, the markdown and the plot
    print(format_table(table)); plot_table(table, "positions.png")

Every method is scored on exactly the same samples (one :class:`PositionScorer`, the scales
changed in place between methods), so each one is compared with the baseline (the first
method, vanilla) per sample: exact McNemar per position, and over all positions pooled for
the average. A difference is marked significant only when p < ``alpha``.
"""

from __future__ import annotations

import json
from pathlib import Path

from lpes_harness.evaluation.baseline_rows import load_baseline_lm, parse_baselines
from lpes_harness.evaluation.conditions import apply_chat_template, refuse_own_keys
from lpes_harness.evaluation.paired_table import format_plain, paired_table, write_comparison
from lpes_harness.evaluation.score_cache import ScoreCache
from lpes_harness.commands import flags

# What a re-scoring runs in when --dtype is not given: the search's, so that its scores match the search's.
RECORDED_DTYPE = "the dtype recorded in the first scales file, else float32"
from lpes_harness.core.scaling import DEFAULT, SCALINGS, common_scaling
from lpes_harness.evaluation.paired import CACHE_FILE, CHUNK, batch_size_arg, cache_identity, held_layers_of, parse_uniform, run_dtype, sample_bar, score_methods, several_lpes_methods, task_positions


def main(argv=None) -> None:
    """``python -m lpes_harness.commands.paired --scales run/scales.json``: re-evaluate searched scales."""
    parser = flags.CommandParser(
        prog="python -m lpes_harness.commands.paired",
        description="Vanilla, PI and searched scales (any uniform scales, and baseline models) on the same held-out samples of a "
                    "position task: accuracy by position with 95 % intervals, exact McNemar p against vanilla. "
                    f"Scores are kept in OUTPUT/scores.cache.json every {CHUNK} samples: run the same command "
                    "again to resume, with more --scales to add methods without scoring vanilla again, or with a "
                    "larger --num-samples to score only the samples that are new.",
    )
    parser.add_argument("--scales", required=True, action="append",
                        help="[NAME=]FILE: a scales file written by a search (scales.json); repeat it to compare "
                             "several searches on the same samples (rows 'LPES NAME' and 'PI NAME')")
    parser.add_argument("--no-pi", action="store_true", help="leave out each curve's PI (its mean as a uniform scale)")
    parser.add_argument("--pi", action="append", default=None, metavar="NAME",
                        help="give only these curves a PI row (repeatable; default: every curve)")
    parser.add_argument("--layer-type", default=None,
                        help="PI and --uniform rows scale only the layers of this attention type (the model config's "
                             "layer_types, e.g. full_attention for Gemma-3's global layers) and keep the others at 1, "
                             "as a search with the same --layer-type did; PI is the curve's mean over those layers")
    parser.add_argument("--position-layer-type", default=None, metavar="TYPE",
                        help="curves of scaling both: PI and --uniform rows put the position factor only on the "
                             "layers of this attention type (the base factor on every layer --layer-type moves), "
                             "as a search with the same --position-layer-type did")
    flags.add_task(parser, "multi_needle")
    parser.add_argument("--num-samples", type=int, default=200, help="held-out samples per position (default 200)")
    flags.add_metadata(parser)  # a new 'seed' gives fresh samples
    parser.add_argument("--uniform", default="", help="extra uniform scales to compare, e.g. 0.8,1.2; for curves of "
                                                      "scaling both, position:base pairs, e.g. 1.2:1,1:2")
    parser.add_argument("--baseline", action="append", default=[], metavar="[NAME=]MODEL[:ARGS]",
                        help="another lm-eval model on the same samples, e.g. 'Ms-PoE rank=mspoe_hf:head_mapping=rank', "
                             "'MoICE=moice_hf:gates=results/moice/smollm2.gates.pt' or buckets_hf (ARGS as in "
                             "--model_args; it runs on --pretrained and --dtype unless ARGS say otherwise). "
                             "Repeatable. Scored through lm-eval's loglikelihood, one model loaded at a time; "
                             "Attention Buckets runs one forward per base (7 by default), so it costs 7 times as much")
    parser.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"])
    flags.add_pretrained(parser)
    flags.add_dtype(parser, None, RECORDED_DTYPE)
    flags.add_threads(parser)
    parser.add_argument("--batch-size", default="1", type=batch_size_arg,
                        help="prompts per forward of the scaled rows (default 1; 'auto': as many as fit, on a GPU). "
                             "On a CPU a batch is no faster; on a GPU it is many times faster. In bfloat16 a padded "
                             "batch can flip a sample whose answer is a near-tie, so compare rows scored alike")
    parser.add_argument("--output", type=flags.output_folder, required=True, help="directory for heldout.{json,md,png} and scores.cache.json")
    parser.add_argument("--reuse-scores", action="append", default=[], metavar="PATH",
                        help="another run's scores.cache.json (or its directory) for the same samples, model and "
                             "dtype, e.g. a search's --output: its scored methods are taken in, not scored again. "
                             "Refused, with nothing changed, if its samples differ (repeatable)")
    args = parser.parse_args(argv)

    from lpes_harness.core.named_path import split_named_path
    from lpes_harness.core.scales_file import read_scales_and_scaling

    try:
        metadata = json.loads(args.metadata)
        named = [split_named_path(text) for text in args.scales]
        read = {path: read_scales_and_scaling(path) for _, path in named}
        curves = {(name or (Path(path).parent.name if len(named) > 1 else "LPES")): read[path][0]
                  for name, path in named}
        if len(curves) != len(named):
            raise ValueError("two --scales have the same name; give them NAME=FILE")
        # One loaded model scores every row: curves of different scalings are all stated as scaling both,
        # each with its other half at 1 (exactly its own scaling), and scored on a both model.
        scalings = {path: read[path][1] or DEFAULT for _, path in named}
        scaling = common_scaling(scalings.values())
        curves = {name: SCALINGS[scalings[path]].restate(values, SCALINGS[scaling])
                  for (name, values), (_, path) in zip(curves.items(), named)}
        uniform = parse_uniform(args.uniform, scaling)
        with_pi = False if args.no_pi else (args.pi if args.pi else True)
        held = held_layers_of(args.pretrained, args.layer_type)
        position_held = held_layers_of(args.pretrained, args.position_layer_type, "--position-layer-type")
        methods = several_lpes_methods(curves, with_pi=with_pi, uniform=uniform, held_layers=held, scaling=scaling,
                                       position_held_layers=position_held)
        baselines = parse_baselines(args.baseline)
        if set(baselines) & set(methods):
            raise ValueError("two rows have the same name; name each --baseline NAME=MODEL[:ARGS]")
        percents = task_positions(args.task)
    except (ValueError, OSError) as err:
        parser.error(str(err))
    if not isinstance(metadata, dict) or args.num_samples < 1:
        parser.error("--metadata must be a JSON object and --num-samples >= 1")
    try:
        refuse_own_keys(metadata, "--metadata", "this command (the heldout split)")
    except ValueError as err:
        parser.error(str(err))
    first = named[0][1]
    recorded = json.loads(Path(first).read_text()) if Path(first).is_file() else {}
    try:
        dtype = run_dtype(args.dtype, recorded)
    except ValueError as err:
        parser.error(str(err))
    chat = apply_chat_template(args.chat_template)
    identity = cache_identity(args.task, metadata, args.chat_template, args.pretrained, dtype, scaling)
    try:
        cache = ScoreCache(Path(args.output) / CACHE_FILE, identity)
        for path in args.reuse_scores:
            print(f"reused {cache.merge(path)} scored blocks from {path}")
    except (ValueError, OSError) as err:
        parser.error(str(err))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from lpes_harness.lmeval.lpes_lm import LPESLM

    try:
        lm = LPESLM(pretrained=args.pretrained, dtype=dtype, scaling=scaling)
    except OSError as err:  # a model that is not there (or its package missing): one line, nothing written
        parser.exit(2, f"{parser.prog}: error: --pretrained {args.pretrained}: {' '.join(str(err).split())}\n")
    try:
        rows = {**methods, **baselines}  # the scaled rows, then the other models'
        with sample_bar(len(rows) * len(percents) * args.num_samples) as progress:
            scored = score_methods(lm, args.task, rows, num_samples=args.num_samples, metadata=metadata,
                                   chat_template=chat, cache=cache, progress=progress,
                                   load_baseline=lambda b: load_baseline_lm(b, args.pretrained, dtype),
                                   batch_size=args.batch_size)
    except ValueError as err:  # e.g. a cached block made for other samples: named, nothing else written
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    scored.update({"scales_files": {name: str(path) for name, path in named}, "dtype": dtype})
    if args.batch_size != 1:
        scored["batch_size"] = args.batch_size  # bfloat16 scores can depend on it (padding)
    if scaling != DEFAULT:
        scored["scaling"] = scaling
    if args.layer_type:
        scored["layer_type"] = args.layer_type  # what the PI and uniform rows moved
    if args.position_layer_type:
        scored["position_layer_type"] = args.position_layer_type
    table = paired_table(scored)
    files = write_comparison(table, scored, args.output)
    print(format_plain(table))
    print(f"written: {files['md']}, {files['json']}, {files['png']}")


if __name__ == "__main__":
    main()
