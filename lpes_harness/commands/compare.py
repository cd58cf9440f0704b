"""``lpes-compare``: which fix for position bias works best on *my* model and *my* inputs? One command.

    lpes-compare --pretrained smollm2 --task multi_needle --budget 30m --output results/compare_smollm2

Every method of the table of methods that runs on the model (LPES, PI, Ms-PoE, Attention Buckets, MoICE with
trained routers, positional hidden-state scaling with its channel, Found in the Middle, STRING, PCD) is tuned
on the search split with the same number of forwards, by the same successive halving over its settings, then
all are scored on the same held-out samples of every condition, vanilla once; ``--stacks`` adds the LPES winner
under each stacking method's winner (``LPES lines + PCD tuned``), ``--authors-defaults`` each method untuned
(``PCD authors' defaults``). The run and its stages:
:mod:`lpes_harness.search.compare_run`; the board: :mod:`lpes_harness.evaluation.compare_board`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import textwrap
import time
from pathlib import Path

from lpes_harness.commands import flags
from lpes_harness.methods import METHODS

PROG = "lpes-compare"
DESCRIPTION = (
    "Tune every position-bias method on your model with one budget of forwards each (successive halving over "
    "its settings on the task's search split), score them all on the same held-out samples of every "
    "condition, and rank them: OUTPUT/leaderboard.{md,json} (accuracy with Wilson intervals, the paired "
    "difference with vanilla and with the best row, exact McNemar p, forwards per token, latency measured in "
    "this run), positions.png and gains.png. --budget covers the whole run; run the same command again to "
    "resume after a kill (OUTPUT/compare.json and the score caches)."
)
EPILOG = """\
examples:
  lpes-compare --budget 30m --output results/compare_smollm2                  # bundled SmolLM2, multi_needle
  lpes-compare --condition '120 sentences={"num_sentences": 120}' \\
               --condition '240 sentences={"num_sentences": 240}' --budget 1h --output DIR
  lpes-compare --methods lpes,pi,pcd --budget 20m --output DIR                 # a subset
  lpes-compare --budget 30m --output DIR --estimate                           # the plan only, nothing written
"""


def build_parser():
    from lpes_harness.search.compare_methods import COMPARED

    p = flags.CommandParser(prog=PROG, description=textwrap.fill(DESCRIPTION, 100), epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    flags.add_pretrained(p)
    flags.add_task(p, "multi_needle")
    flags.add_metadata(p)
    p.add_argument("--condition", action="append", default=[], metavar="NAME=JSON",
                   help="a condition the methods are tuned and scored on: task options over --metadata, e.g. "
                        "'240 sentences={\"num_sentences\": 240}' (repeatable; default: the task at --metadata)")
    p.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--budget", default="1h", help="wall time for the whole run, held-out table included: 600, 30m, "
                                                  "1.5h (default 1h)")
    p.add_argument("--output", type=flags.output_folder, required=True, help="folder for the board and the journal")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated subset of {','.join(COMPARED)} (default: all that run on the model)")
    p.add_argument("--heldout-samples", default="auto",
                   help="held-out samples per gold position per condition (default auto: what 35 %% of the budget "
                        "holds, at most 100)")
    p.add_argument("--tuning-forwards", type=int, default=None,
                   help="forwards each method is tuned on (default: what the budget holds after the held-out table)")
    p.add_argument("--stacks", action="store_true",
                   help="also score, for each method that stacks with LPES (pcd, fitm, poshidden, string), its "
                        "winner with the LPES winner's curve under it: rows 'LPES lines + PCD tuned' and so on, "
                        "the two halves as tuned alone (no tuning of their own; held-out forwards only)")
    p.add_argument("--authors-defaults", nargs="?", const="all", default=None, metavar="METHODS",
                   help="also score these methods (comma-separated; alone or 'all': every method of the run but "
                        "LPES and PI, which have none) at their authors' defaults, untuned: rows 'PCD authors' "
                        "defaults' and so on beside 'PCD tuned', to see what tuning bought (held-out forwards only)")
    p.add_argument("--lpes-draws", type=int, default=15, help="pairs of lines LPES races (default 15)")
    p.add_argument("--moice-gates", default=None, help="MoICE's routers trained on this model (without: no MoICE row)")
    p.add_argument("--poshidden-setting", default=None,
                   help="the positional channel of this model (without: no positional hidden-state scaling row)")
    p.add_argument("--estimate", action="store_true", help="time the model and print the plan; write nothing")
    flags.add_dtype(p, "auto")
    flags.add_seed(p)
    flags.add_threads(p)
    return p


def checked_args(parser, argv):
    """The command's settings, every one checked before the model loads (one line and exit 2 otherwise)."""
    from lpes_harness.evaluation.conditions import Condition, search_conditions
    from lpes_harness.evaluation.paired import run_dtype
    from lpes_harness.search.budget import parse_duration
    from lpes_harness.search.compare_methods import check_files, method_list
    from lpes_harness.search.compare_run import CompareArgs

    args = parser.parse_args(argv)
    try:
        budget = parse_duration(args.budget, "--budget")
        if budget == float("inf"):
            raise ValueError("--budget auto: give a duration, e.g. 30m")
        heldout = None if args.heldout_samples == "auto" else positive_or_none(args.heldout_samples)
        if args.tuning_forwards is not None and args.tuning_forwards < 1:
            raise ValueError(f"--tuning-forwards {args.tuning_forwards}: give a positive number")
        if args.lpes_draws < 2:
            raise ValueError(f"--lpes-draws {args.lpes_draws}: a race needs at least 2")
        metadata = json.loads(args.metadata)
        conditions = (search_conditions(args.condition, args.task, metadata, args.chat_template) if args.condition
                      else [Condition(args.task, args.task, metadata, args.chat_template)])
        check_files(args.moice_gates, args.poshidden_setting)
        settings = CompareArgs(
            pretrained=args.pretrained, task=args.task, conditions=conditions, methods=method_list(args.methods),
            budget=budget, heldout_samples=heldout, seed=args.seed, dtype=run_dtype(args.dtype, None),
            draws=args.lpes_draws, output=Path(args.output), command=shlex.join([PROG, *(argv or [])]),
            moice_gates=args.moice_gates, poshidden_setting=args.poshidden_setting,
            tuning_forwards=args.tuning_forwards, stacks=args.stacks)
        settings.authors_defaults = defaulted(args.authors_defaults, settings.methods)
        if settings.stacks and not settings.stacked_methods():
            raise ValueError("--stacks puts the LPES winner under a method that stacks: --methods needs lpes and one "
                             f"of {', '.join(methods_that_stack())}")
    except ValueError as err:
        parser.error(str(err))
    return args, settings


def defaulted(text: str | None, methods: list[str]) -> tuple[str, ...]:
    """``--authors-defaults``' methods: 'all' is every method of the run that has defaults; a name must be one."""
    if text is None:
        return ()
    from lpes_harness.search.compare_methods import WITHOUT_DEFAULTS

    has_defaults = [m for m in methods if m not in WITHOUT_DEFAULTS]
    if text == "all":
        return tuple(has_defaults)
    names = [part.strip() for part in text.split(",") if part.strip()]
    wrong = [n for n in names if n not in has_defaults]
    if wrong or not names:
        raise ValueError(f"--authors-defaults {text!r}: {', '.join(wrong) or 'no name'} is not a method of this run "
                         f"with defaults ({', '.join(has_defaults) or 'none'}; LPES and PI have none)")
    return tuple(dict.fromkeys(names))


def methods_that_stack() -> list[str]:
    from lpes_harness.search.compare_methods import COMPARED

    return [m for m in COMPARED if METHODS[m].stacks_with_lpes]


def positive_or_none(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--heldout-samples {text}: give a positive number or auto")
    return int(text)


def main(argv=None) -> None:
    launched = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, settings = checked_args(parser, argv)
    from lpes_harness.search.compare_run import check_resumable

    try:
        journal = check_resumable(settings)
    except ValueError as err:
        parser.error(str(err))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from lpes_harness.lmeval.lpes_lm import LPESLM

    try:
        lm = LPESLM(pretrained=settings.pretrained, dtype=settings.dtype, scaling="both")
    except OSError as err:
        parser.exit(2, f"{PROG}: error: --pretrained {settings.pretrained}: {' '.join(str(err).split())}\n")
    run(parser, args, settings, lm, journal, launched)


def run(parser, args, settings, lm, journal, launched: float) -> None:
    from lpes_harness.core.models import machine_description
    from lpes_harness.evaluation.compare_board import build_board, write_board
    from lpes_harness.search.compare_run import Compare, board_rows, describe_plan, resolution

    compare = Compare(settings, lm, journal or {})
    try:
        plan = compare.plan(launched)
    except ValueError as err:
        parser.exit(2, f"{PROG}: error: {err}\n")
    print("\n".join(describe_plan(plan, settings.methods)), flush=True)
    if args.estimate:
        print(f"--estimate: nothing tuned, nothing written ({settings.output} not made or changed)")
        return
    compare.save()
    for method in plan["races"]:
        if method in compare.journal.get("tuned", {}):
            continue
        tuned = compare.tune(method)
        print(f"{method}: {tuned['setting']['text']} won, {tuned['accuracy']:.3f} on the search samples "
              f"({tuned['forwards']} forwards over {tuned['raced']} settings)", flush=True)
    heldout = compare.heldout()
    latency = compare.latency()
    notes = [f"{m} not run: {why}" for m, why in plan["skipped"].items()]
    notes.append(f"Each method tuned on {plan['tuning_forwards']} forwards of the search split "
                 f"(successive halving over its settings); held-out: {plan['heldout_samples']} samples per gold "
                 f"position per condition ({', '.join(c.name for c in settings.conditions)}), seed of the task's "
                 f"split as given. Latency: one prefill forward of a {latency['tokens']}-token held-out prompt.")
    notes.append(resolution(plan["heldout_samples"] * plan["blocks"]) + ".")
    title = f"lpes-compare: {settings.pretrained or 'smollm2 (the bundled SmolLM2-135M-Instruct)'} on {settings.task}"
    board = build_board(board_rows(compare, heldout, latency), title=title, command=settings.command,
                        machine=f"{machine_description(str(lm.device))}, {settings.dtype}", notes=notes)
    files = write_board(settings.output, board)
    # The first finish is the run's wall time; writing the board again later (a rerun) does not move it.
    compare.journal.setdefault("finished", time.time())
    compare.journal.setdefault("wall_seconds", round(compare.journal["finished"] - compare.journal["started"], 1))
    compare.save()
    print("\n".join(board["headline"]))
    print("written: " + ", ".join(str(p) for p in files.values()))


if __name__ == "__main__":
    main()
