"""Methods side by side on the same held-out samples: accuracy by position, intervals, paired tests.

    scored = score_methods(lm, "multi_needle", {"vanilla": [1.0] * 30, "PI": pi, "LPES": scales},
                           num_samples=200)
    table = paired_table(scored)  # :mod:`.paired_table`: the tests, the markdown and the plot
    print(format_table(table)); plot_table(table, "positions.png")

Every method is scored on exactly the same samples (one :class:`PositionScorer`, the scales
changed in place between methods), so each one is compared with the baseline (the first
method, vanilla) per sample: exact McNemar per position, and over all positions pooled for
the average. A difference is marked significant only when p < ``alpha``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.analysis.baseline_rows import Baseline, load_baseline_lm, parse_baselines
from lpes_harness.analysis.paired_table import format_plain, paired_table, write_comparison
from lpes_harness.analysis.score_cache import ScoreCache
from lpes_harness.models import choose_dtype, default_device, positive_int
from lpes_harness.scaling import canonical, factors_per_layer, halves, held_per_half, identity, promote, uniform_factor


def lpes_methods(scales: Sequence[float], uniform: Sequence = (), held_layers: Sequence[int] = (),
                 scaling: str = "position", position_held_layers: Sequence[int] = ()) -> dict[str, list[float]]:
    """The comparison of a searched curve: vanilla (first: the baseline), PI (its mean, uniform),
    the curve itself, and any extra uniform scales.

    ``held_layers`` (a search's ``--layer-type``: Gemma-3's sliding-window layers) stay at 1 in the
    PI and uniform rows too, which move the layers the curve could move, as the search's sweep
    did: PI is the curve's mean over those layers, not over the held 1s, which say nothing of it.

    ``scaling="both"``: ``scales`` is the flat 2L list (positions, then bases); PI puts each half's
    mean on its half, and each ``uniform`` entry is a ``(position, base)`` pair.
    ``position_held_layers`` (``both`` only, ``--position-layer-type``) stay at 1 in the position half
    alone: PI and uniform rows move each half's own layers.
    """
    curves = halves(scales, scaling)
    n = len(curves[0])
    held = held_per_half(scaling, held_layers, position_held_layers)
    moved = [[layer for layer in range(n) if layer not in half_held] for half_held in held]
    if not all(moved):
        raise ValueError(f"every layer is held at 1 (held layers {sorted(set().union(*held))}): nothing is left to scale")

    def uniform_row(values: Sequence[float]) -> list[float]:
        return [1.0 if layer in half_held else float(value)
                for value, half_held in zip(values, held) for layer in range(n)]

    pi = [sum(curve[layer] for layer in half_moved) / len(half_moved) for curve, half_moved in zip(curves, moved)]
    methods = {"vanilla": identity(scaling, n), "PI": uniform_row(pi), "LPES": [float(s) for s in scales]}
    methods.update({uniform_name(value, scaling): uniform_row(uniform_values(value, scaling)) for value in uniform})
    return methods


def uniform_values(value, scaling: str) -> tuple[float, ...]:
    """A uniform row's factor(s): one number, or under scaling both a ``(position, base)`` pair."""
    if scaling != "both":
        return (float(value),)
    if isinstance(value, (int, float, str)) or len(value) != 2:
        raise ValueError(f"uniform {value!r}: a uniform row of scaling both is a (position, base) pair, e.g. 1.2:1 or 1:2")
    return float(value[0]), float(value[1])


def uniform_name(value, scaling: str = "position") -> str:
    """The row name of a uniform factor: ``uniform 1.2``; under scaling base ``uniform base 2`` (a table may
    hold a position row beside it); under scaling both ``uniform 1.2:2`` (position:base)."""
    kind = "base " if scaling == "base" else ""
    return f"uniform {kind}" + ":".join(f"{v:g}" for v in uniform_values(value, scaling))


def parse_uniform(text: str, scaling: str = "position") -> list:
    """``--uniform``: ``0.8,1.2``; under scaling both ``P:B`` pairs, e.g. ``1.2:1,1:2``. Each factor > 0."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
        values = [tuple(float(v) for v in item.split(":")) if scaling == "both" else float(item) for item in items]
        for value in values:
            uniform_values(value, scaling)
    except ValueError as err:
        form = "P:B pairs (position factor:base factor), e.g. 1.2:1,1:2" if scaling == "both" else "numbers, e.g. 0.8,1.2"
        raise ValueError(f"--uniform {text!r}: give {form} ({err})") from None
    if any(v <= 0 for value in values for v in uniform_values(value, scaling)):
        raise ValueError(f"--uniform {text!r}: every factor must be > 0")
    return values


def several_lpes_methods(curves: Mapping[str, Sequence[float]], with_pi: bool | Sequence[str] = True,
                         uniform: Sequence = (), held_layers: Sequence[int] = (),
                         scaling: str = "position", position_held_layers: Sequence[int] = ()) -> dict[str, list[float]]:
    """Vanilla, then each named curve as ``LPES <name>`` (and its ``PI <name>``): several searches on one sample set.

    ``with_pi``: every curve gets its PI row (True), none (False), or only the named curves.
    ``held_layers``: as in :func:`lpes_methods`, for every PI and uniform row; ``scaling`` and
    ``position_held_layers`` too.
    """
    pi_for = set(curves) if with_pi is True else set(with_pi or ())
    if pi_for - set(curves):
        raise ValueError(f"PI asked for unknown curves {sorted(pi_for - set(curves))}; the curves are {list(curves)}")
    size = len(next(iter(curves.values())))
    if any(len(c) != size for c in curves.values()):
        raise ValueError(f"the curves have different numbers of layers: { {k: len(c) for k, c in curves.items()} }")
    n = size // factors_per_layer(scaling)
    if any(not 0 <= layer < n for layer in (*held_layers, *position_held_layers)):
        raise ValueError(f"held layers {sorted({*held_layers, *position_held_layers})} are not all among the "
                         f"curves' {n} layers")
    held = {"held_layers": held_layers, "scaling": scaling, "position_held_layers": position_held_layers}
    flat = {name: uniform_factor(scales, scaling, held_layers, position_held_layers) for name, scales in curves.items()}
    if len(curves) == 1 and pi_for and flat[next(iter(curves))] is None:
        return lpes_methods(next(iter(curves.values())), uniform, **held)
    methods = {"vanilla": identity(scaling, n)}
    for name, scales in curves.items():
        single = lpes_methods(scales, **held)
        suffix = "" if name == "LPES" else f" {name}"  # one unnamed curve: plain "LPES", not "LPES LPES"
        if flat[name] is not None:  # a search whose best was a uniform factor: that is PI, not LPES
            methods[f"{uniform_name(flat[name], scaling)} (PI){suffix}"] = list(scales)
            continue
        if name in pi_for:
            methods[f"PI{suffix}"] = single["PI"]
        methods[f"LPES{suffix}"] = list(scales)
    methods.update({name: row for name, row in lpes_methods(identity(scaling, n), uniform, **held).items()
                    if name.startswith("uniform ")})
    return methods


CHUNK = 10  # samples scored between two cache writes: a killed run loses at most this many forwards
CACHE_FILE = "scores.cache.json"


def cache_identity(task: str, metadata, chat_template: str, pretrained: str | None, dtype: str,
                   scaling: str = "position") -> dict:
    """What held-out scores depend on, as a :class:`ScoreCache` records it. The search's own
    held-out table and this command build it alike, so either reuses the other's scores.

    Scores are keyed by scales, which mean other RoPEs under ``scaling="base"``: such a cache says so
    (and is refused by a position run); position caches keep their old identity, and share it with
    ``both`` runs, whose keys are the factors' canonical form (:func:`lpes_harness.scaling.canonical`:
    a both curve with base factors 1 is keyed as its position curve, the very same model)."""
    identity = {"task": task, "split": "heldout", "metadata": dict(metadata or {}), "chat_template": chat_template,
                "mode": "greedy", "pretrained": pretrained, "dtype": dtype}
    if scaling == "base":  # a both curve is keyed by its factors' canonical form, which position curves share
        identity["scaling"] = scaling
    return identity


@contextlib.contextmanager
def sample_bar(total: int, disable: bool | None = None):
    """A tqdm bar over scored samples; yields the ``progress`` callback of :func:`score_methods`."""
    import sys

    from tqdm.auto import tqdm

    # tqdm's own default (disable=None) goes silent when stderr is not a terminal, and a long run
    # sent to a log file then says nothing for an hour: there it writes a line a minute instead.
    logged = disable is None and not sys.stderr.isatty()
    # Cached samples count at once; the low smoothing lets the rate settle on the scored ones.
    bar = tqdm(total=total, desc="scoring", unit="sample", smoothing=0.05, disable=False if logged else disable,
               mininterval=60 if logged else 0.1)

    def progress(name, percent, count):
        bar.set_postfix_str(f"{name} @ {percent} %", refresh=False)
        bar.update(count)

    try:
        yield progress
    finally:
        bar.close()


def score_methods(lm, task: str, methods: Mapping[str, Sequence[float]], *, num_samples: int, split: str = "heldout",
                  metadata=None, chat_template=None, mode: str = "greedy", progress=None, cache=None,
                  baselines: Mapping[str, Baseline] | None = None, load_baseline=None, batch_size=1) -> dict:
    """Per-sample scores of each method at each gold position: {method: {percent: [0/1, ...]}}.

    ``cache`` (a :class:`ScoreCache`) keeps the scores every :data:`CHUNK` samples: a killed run
    resumes where it stopped, and a later run on the same samples reuses what it shares
    (vanilla, above all) instead of scoring it again. A run with more samples scores only the
    new ones: held-out samples are numbered, so 200 begin with the earlier 100.
    ``progress(name, percent, count)`` is told of every ``count`` samples done, cached ones included.

    ``baselines`` (rows after the scaled methods) are other lm-eval models, loaded one at a
    time by ``load_baseline(baseline)`` only when a block is missing. They are scored on the
    very same prompts (the scorer is shared, only its model changes) through lm-eval's own
    ``loglikelihood``: the path ``lm_eval --model mspoe_hf`` takes, which the fast shared-prefix
    scorer of ``lpes_hf`` is tested to agree with.
    """
    from lpes_harness.lmeval.position_scorer import PositionScorer
    from lpes_harness.tasks.position import resolve_task

    percents = list(resolve_task(task).positions)
    scorer = PositionScorer(lm, task, percents, metadata=metadata, split=split, num_samples=num_samples,
                            mode=mode, chat_template=chat_template, batch_size=batch_size)
    chunk = max(CHUNK, batch_size) if isinstance(batch_size, int) else CHUNK
    report = progress or (lambda name, percent, count: None)
    previous = list(lm.scales)
    scores: dict[str, dict[int, list[float]]] = {}
    try:
        for name, scales in methods.items():
            lm.set_scales(list(scales))
            key = canonical(scales, lm.scaling)  # a both curve with base factors 1 is its position curve
            scores[name] = _fill(scorer, key, percents, cache, functools.partial(report, name), chunk)
    finally:
        lm.set_scales(previous)
    for name, baseline in (baselines or {}).items():
        with _scored_by(scorer, baseline, percents, cache, load_baseline):
            scores[name] = _fill(scorer, baseline.spec, percents, cache, functools.partial(report, name), chunk)
    return {
        "task": task, "split": split, "num_samples": num_samples, "mode": mode,
        "chat_template": scorer.chat_template, "metadata": dict(metadata or {}),
        "methods": {**{name: list(s) for name, s in methods.items()},
                    **{name: b.spec for name, b in (baselines or {}).items()}},
        "scores": scores,
    }  # fmt: skip


def _fill(scorer, method, percents, cache, report, chunk: int = CHUNK) -> dict[int, list[float]]:
    """Every sample's score at each of ``percents`` for ``method`` (scales or a baseline's spec).

    What the cache lacks is scored about ``chunk`` samples at a time, each chunk saved before the
    next. A chunk holds the same samples at every position: a sample's prompts are the same text
    but where the gold item sits, and the scorer runs the text they share once
    (:meth:`PositionScorer.scores_at`). ``report(percent, count)`` is told of every count done.
    """
    docs = {percent: scorer.docs[percent] for percent in percents}
    known = {percent: cache.get(method, percent, docs[percent]) if cache is not None else [] for percent in percents}
    for percent in percents:
        report(percent, len(known[percent]))
    per_position = max(1, math.ceil(chunk / len(percents)))
    while any(len(known[p]) < len(docs[p]) for p in percents):
        todo = {p: list(range(len(known[p]), min(len(known[p]) + per_position, len(docs[p])))) for p in percents}
        new = scorer.scores_at({p: indices for p, indices in todo.items() if indices})
        for percent, scores in new.items():
            known[percent] = known[percent] + scores
            if cache is not None:
                cache.put(method, percent, docs[percent], known[percent])
            report(percent, len(scores))
    return known


@contextlib.contextmanager
def _scored_by(scorer, baseline: Baseline, percents, cache, load_baseline):
    """The shared scorer with ``baseline``'s model in place of the scaled one, through lm-eval's
    ``loglikelihood``; not loaded at all (25 s for the bundled model) when the cache has every block."""
    if cache is not None and all(len(cache.get(baseline.spec, p, scorer.docs[p])) >= len(scorer.docs[p])
                                 for p in percents):
        yield
        return
    own_lm, own_scorer = scorer.lm, scorer.scorer
    scorer.lm, scorer.scorer = load_baseline(baseline), "lm-eval"
    try:
        yield
    finally:
        scorer.lm, scorer.scorer = own_lm, own_scorer


def scores_from_lm_eval(results: Mapping, task: str) -> dict[int, list[float]]:
    """Per-sample scores by gold position from lm-eval results run with ``log_samples=True``.

    Ordered by ``doc_id``, so two runs over the same split pair up sample by sample.
    """
    from lpes_harness.tasks.position import resolve_task

    position_task = resolve_task(task)
    samples = results.get("samples") or {}
    by_position = {}
    for percent in position_task.positions:
        name = position_task.subtask_name(percent)
        if name not in samples:
            raise ValueError(f"no logged samples for {name}: run lm-eval with log_samples=True (--log_samples)")
        logged = sorted(samples[name], key=lambda s: s["doc_id"])
        by_position[percent] = [float(s[position_task.metric_name]) for s in logged]
    return by_position


def main(argv=None) -> None:
    """``python -m lpes_harness.analysis.paired --scales run/scales.json``: re-evaluate searched scales."""
    parser = argparse.ArgumentParser(
        prog="python -m lpes_harness.analysis.paired",
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
    parser.add_argument("--task", default="multi_needle", help="a registered position task (default multi_needle)")
    parser.add_argument("--num-samples", type=int, default=200, help="held-out samples per position (default 200)")
    parser.add_argument("--metadata", default="{}", help="task options as JSON; a new 'seed' gives fresh samples")
    parser.add_argument("--uniform", default="", help="extra uniform scales to compare, e.g. 0.8,1.2; for curves of "
                                                      "scaling both, position:base pairs, e.g. 1.2:1,1:2")
    parser.add_argument("--baseline", action="append", default=[], metavar="[NAME=]MODEL[:ARGS]",
                        help="another lm-eval model on the same samples, e.g. 'Ms-PoE rank=mspoe_hf:head_mapping=rank', "
                             "'MoICE=moice_hf:gates=results/moice/smollm2.gates.pt' or buckets_hf (ARGS as in "
                             "--model_args; it runs on --pretrained and --dtype unless ARGS say otherwise). "
                             "Repeatable. Scored through lm-eval's loglikelihood, one model loaded at a time; "
                             "Attention Buckets runs one forward per base (7 by default), so it costs 7 times as much")
    parser.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--pretrained", default=None, help="HF id, local dir or .gguf (default: bundled SmolLM2)")
    parser.add_argument("--dtype", default=None,
                        help="float32, bfloat16, float16 or auto (bfloat16 where the CPU runs it natively or on a "
                             "GPU); default: the dtype recorded in the first scales file, else float32")
    parser.add_argument("--threads", type=positive_int, default=None)
    parser.add_argument("--batch-size", default="1", type=batch_size_arg,
                        help="prompts per forward of the scaled rows (default 1; 'auto': as many as fit, on a GPU). "
                             "On a CPU a batch is no faster; on a GPU it is many times faster. In bfloat16 a padded "
                             "batch can flip a sample whose answer is a near-tie, so compare rows scored alike")
    parser.add_argument("--output", required=True, help="directory for heldout.{json,md,png} and scores.cache.json")
    parser.add_argument("--reuse-scores", action="append", default=[], metavar="PATH",
                        help="another run's scores.cache.json (or its directory) for the same samples, model and "
                             "dtype, e.g. a search's --output: its scored methods are taken in, not scored again. "
                             "Refused, with nothing changed, if its samples differ (repeatable)")
    args = parser.parse_args(argv)

    from lpes_harness.named_path import split_named_path
    from lpes_harness.scales_file import read_scales_and_scaling

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
        scalings = {path: read[path][1] or "position" for _, path in named}
        scaling = next(iter(scalings.values())) if len(set(scalings.values())) == 1 else "both"
        curves = {name: promote(values, scalings[path]) if scaling == "both" else values
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
    first = named[0][1]
    recorded = json.loads(Path(first).read_text()) if Path(first).is_file() else {}
    try:
        dtype = run_dtype(args.dtype, recorded)
    except ValueError as err:
        parser.error(str(err))
    chat = {"auto": None, "on": True, "off": False}[args.chat_template]
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
    from lpes_harness.lm import LPESLM

    try:
        lm = LPESLM(pretrained=args.pretrained, dtype=dtype, scaling=scaling)
    except OSError as err:  # a model that is not there (or its package missing): one line, nothing written
        parser.exit(2, f"{parser.prog}: error: --pretrained {args.pretrained}: {' '.join(str(err).split())}\n")
    try:
        with sample_bar((len(methods) + len(baselines)) * len(percents) * args.num_samples) as progress:
            scored = score_methods(lm, args.task, methods, num_samples=args.num_samples, metadata=metadata,
                                   chat_template=chat, cache=cache, progress=progress, baselines=baselines,
                                   load_baseline=lambda b: load_baseline_lm(b, args.pretrained, dtype),
                                   batch_size=args.batch_size)
    except ValueError as err:  # e.g. a cached block made for other samples: named, nothing else written
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    scored.update({"scales_files": {name: str(path) for name, path in named}, "dtype": dtype})
    if args.batch_size != 1:
        scored["batch_size"] = args.batch_size  # bfloat16 scores can depend on it (padding)
    if scaling != "position":
        scored["scaling"] = scaling
    if args.layer_type:
        scored["layer_type"] = args.layer_type  # what the PI and uniform rows moved
    if args.position_layer_type:
        scored["position_layer_type"] = args.position_layer_type
    table = paired_table(scored)
    files = write_comparison(table, scored, args.output)
    print(format_plain(table))
    print(f"written: {files['md']}, {files['json']}, {files['png']}")


def batch_size_arg(text: str):
    """``--batch-size``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"a positive integer or 'auto', got {text!r}") from None


def held_layers_of(pretrained: str | None, layer_type: str | None, flag: str = "--layer-type") -> tuple[int, ...]:
    """The layers ``--layer-type`` (or ``flag``) keeps at 1 in the PI and uniform rows, from the model's
    config (no weights); none without it. A type the model lacks is a ValueError naming its types."""
    if not layer_type:
        return ()
    from lpes_harness.analysis.layer_types import layers_not_of, model_layer_types

    return layers_not_of(model_layer_types(pretrained), layer_type, flag)


def run_dtype(requested: str | None, recorded) -> str:
    """The dtype this run scores in: ``--dtype``, else the first scales file's, else float32.
    ``auto`` is resolved here, so that the score cache records what actually ran and matches a
    search's cache (which records the resolved dtype) on the same machine."""
    dtype = requested or (recorded.get("dtype") if isinstance(recorded, dict) else None) or "float32"
    return choose_dtype(dtype, default_device())


def task_positions(task: str) -> list[int]:
    from lpes_harness.tasks.position import resolve_task

    return list(resolve_task(task).positions)


if __name__ == "__main__":
    main()
