"""Does a searched curve help on inputs its search never saw? One table over several conditions.

    python -m lpes_harness.commands.transfer --scales reference=results/.../scales.json \\
        --condition '2x length={"num_sentences": 120}' --condition 'no chat template={"chat_template": "off"}' \\
        --condition 'needle={"task": "needle"}' --num-samples 100 --seed 20261125 --output results/transfer

A condition (:mod:`lpes_harness.evaluation.conditions`) is a name and a JSON object of task options
(``--metadata`` keys), plus two keys of its own: ``task`` (another registered position task;
default multi_needle) and ``chat_template`` (on / off / auto). For each condition, vanilla, every curve and every
``--baseline`` model (Attention Buckets, Ms-PoE, MoICE, ...) are scored on the same held-out samples (``commands.paired``, in ``OUTPUT/<condition>/``, resumable there),
and the table gives, per condition and curve, the average with its 95 % interval, the paired
difference from vanilla with its 95 % interval, gained / lost samples, the exact McNemar p,
and the worst position before and after; with several conditions, ``OUTPUT/pooled.{md,json}``
pools each curve over all of them against vanilla (:mod:`lpes_harness.evaluation.pooled`). ``--seed``
sets the samples' metadata seed, so that they are drawn fresh (no search used it). No new search:
the curves are applied as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from lpes_harness.evaluation.conditions import parse_condition, refuse_own_keys, slug, task_metadata
from lpes_harness.evaluation.transfer import format_rows, paired_argv, plot_rows, rows
from lpes_harness.commands import flags
from lpes_harness.commands.paired import RECORDED_DTYPE


def main(argv=None) -> None:
    from lpes_harness.evaluation.paired import batch_size_arg

    parser = flags.CommandParser(prog="python -m lpes_harness.commands.transfer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", action="append", required=True, metavar="NAME=FILE",
                        help="a searched curve (scales.json); repeatable")
    parser.add_argument("--baseline", action="append", default=[], metavar="[NAME=]MODEL[:ARGS]",
                        help="another lm-eval model as a row of every condition, as commands.paired's --baseline "
                             "(e.g. a tuned Attention Buckets: 'Buckets tuned=buckets_hf:bases=0.5;1.0;1.5'); repeatable")
    parser.add_argument("--condition", action="append", required=True, metavar="NAME=JSON",
                        help="a condition: task options as JSON, plus 'task' and 'chat_template'; repeatable")
    parser.add_argument("--num-samples", type=int, default=100, help="held-out samples per position (default 100)")
    # The samples' metadata seed; a condition's own wins. 0 is the tasks' own default: no seed is added, so
    # a condition's metadata (and its score cache) stays what it was before --seed had a default.
    flags.add_seed(parser)
    flags.add_dtype(parser, None, RECORDED_DTYPE)
    flags.add_pretrained(parser)
    parser.add_argument("--batch-size", default="1", type=batch_size_arg,
                        help="as commands.paired: prompts per forward (default 1; 10 or more on a GPU)")
    parser.add_argument("--output", type=flags.output_folder, required=True, help="OUTPUT/<condition>/ per condition, OUTPUT/transfer.{md,json,png}, "
                        "and OUTPUT/pooled.{md,json} with several conditions")
    args = parser.parse_args(argv)
    try:
        conditions = [parse_condition(text) for text in args.condition]
        for name, options in conditions:
            refuse_own_keys(options, f"--condition {name!r}", "this command (the heldout split)")
    except ValueError as err:
        parser.error(str(err))
    if len({slug(name) for name, _ in conditions}) != len(conditions):
        parser.error("two conditions share a name (after lower-casing and dropping punctuation)")
    if args.num_samples < 1:
        parser.error(f"--num-samples must be >= 1, got {args.num_samples}")
    from lpes_harness.evaluation.baseline_rows import parse_baselines

    try:  # a misspelt model stops here, with this command's name, before any condition is scored
        parse_baselines(args.baseline)
    except ValueError as err:
        parser.error(str(err))
    from lpes_harness.tasks.data import TaskDataError
    from lpes_harness.tasks.position import resolve_options, resolve_task

    for name, options in conditions:  # every condition checked before the first one is scored
        try:
            resolve_options(resolve_task(options.get("task", "multi_needle")),
                            {**task_metadata(options), "split": "heldout", "num_samples": args.num_samples})
        except TaskDataError as err:
            parser.error(f"--condition {name!r}: {err}")
    from lpes_harness.commands import paired

    output = Path(args.output)
    table = []
    for name, options in conditions:
        folder = output / slug(name)
        print(f"== {name}: {folder}", flush=True)
        paired.main(paired_argv(options, args.scales, num_samples=args.num_samples, seed=args.seed or None, dtype=args.dtype,
                                pretrained=args.pretrained, output=folder, batch_size=args.batch_size,
                                baselines=args.baseline))
        table += rows(name, json.loads((folder / "heldout.json").read_text(encoding="utf-8")))
    from lpes_harness.core.files import atomic_write_json, atomic_write_text

    text = format_rows(table)
    print(text)
    atomic_write_text(output / "transfer.md", text + "\n")
    atomic_write_json(output / "transfer.json", table, indent=1)
    plot_rows(table, output / "transfer.png")
    if len(conditions) > 1:  # every curve over all conditions at once: one paired test (commands.pooled)
        from lpes_harness.evaluation import pooled

        tables = [pooled.load_table(output / slug(name)) for name, _ in conditions]
        results = pooled.pool(tables, [row for row in pooled.shared_rows(tables) if row != "vanilla"], ["vanilla"])
        text = pooled.format_results(results, tables)
        print(text)
        atomic_write_text(output / "pooled.md", text + "\n")
        atomic_write_json(output / "pooled.json", pooled.as_json(results, tables), indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
