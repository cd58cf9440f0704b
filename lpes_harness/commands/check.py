"""Does a position task measure retrieval on this model? Check before you spend hours searching.

    lpes-check --task multi_needle --num-samples 40
    lpes-check --task kv_retrieval --metadata '{"num_pairs": 10}' --chat-template off

For each gold position it generates the model's answers (greedy, the task's own prompt and
metric, as ``lm_eval`` would) and prints accuracy with a 95 % interval, the same samples with
the gold item removed, and what kind each wrong answer is: another item's value (with the
depth where that item sits), other text of the context, made up, or empty
(``lpes_harness.evaluation.wrong_answers``; no extra forward pass).

The verdict. A task measures retrieval on this model when
- the model is clearly right where it does best (that position's 95 % interval starts at 0.5
  or above),
- it scores near 0 with the gold item removed (at most 0.1),
- its average is clearly above the gold-removed one (the two 95 % intervals do not overlap),
- and its answers show that it reads the query. It does not when, at the positions where it
  does best, at least 10 % of its answers are empty or made up; or when at least half of
  its wrong answers name the item at one fixed place (the first pair, say) and the gold item
  sits at that place where it does best, so that this policy, not retrieval, explains its
  right answers.
Wrong answers in the middle that name another item are then the shape of the position effect
(the model picks the wrong item because the gold one sits where it attends badly), which a
search can fix, not a defect of the task.

``--answers-from FILE`` judges the answers of an earlier ``--json`` file again, with no model.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path

from lpes_harness.evaluation.conditions import apply_chat_template
from lpes_harness.evaluation.validity import check_task, format_report, judge
from lpes_harness.commands import flags
from lpes_harness.core.models import check_dtype


def build_parser() -> argparse.ArgumentParser:
    p = flags.CommandParser(prog="lpes-check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    flags.add_task(p)
    p.add_argument("--num-samples", type=int, default=40, help="samples per gold position (default 40)")
    flags.add_metadata(p)
    p.add_argument("--split", default="heldout", choices=["search", "heldout", "validation"])
    p.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"],
                   help="auto follows the task (multi_needle: on)")
    flags.add_pretrained(p)
    p.add_argument("--model-args", default="", help="extra lpes_hf arguments, 'k=v,k=v' (e.g. scales=1.2)")
    flags.add_dtype(p, None, "float32, unless --model-args gives dtype=")
    flags.add_threads(p)
    p.add_argument("--json", default=None, help="also write the full result (with every answer) here")
    p.add_argument("--grid", default=None, metavar="JSON",
                   help="calibrate: run the check at every combination of these task options, e.g. "
                        "'{\"num_sentences\": [120, 240], \"num_needles\": [8, 16]}'; prints one row per setting "
                        "(see lpes_harness/evaluation/calibration.py)")
    p.add_argument("--out", type=flags.output_folder, default=None, metavar="DIR",
                   help="with --grid: write each setting's result here as it finishes, and reuse the ones there "
                        "(a stopped grid resumes); also the table, calibration.md")
    p.add_argument("--answers-from", default=None, metavar="FILE",
                   help="judge the answers of an earlier --json file again (its task, metadata and split), "
                        "with no model: --task must name the same task")
    return p


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        metadata = json.loads(args.metadata)
    except json.JSONDecodeError as err:
        parser.error(f"--metadata is not valid JSON: {err.msg}")
    if not isinstance(metadata, dict):
        parser.error("--metadata must be a JSON object")
    if args.num_samples < 1:
        parser.error(f"--num-samples must be >= 1, got {args.num_samples}")
    from lpes_harness.tasks.data import TaskDataError
    from lpes_harness.tasks.position import resolve_options, resolve_task

    try:
        resolve_options(resolve_task(args.task), {**metadata, "split": args.split, "num_samples": args.num_samples})
    except TaskDataError as err:
        parser.error(str(err))
    args.model_kwargs = model_kwargs(parser, args)
    if args.grid is not None:
        return run_grid(parser, args, metadata)
    if args.answers_from:
        result = rejudge(parser, args.answers_from, args.task)
    else:
        result = check_task(load_lm(args), args.task, num_samples=args.num_samples, metadata=metadata,
                            split=args.split, chat_template=apply_chat_template(args.chat_template))
    print(format_report(result))
    if args.json:
        from lpes_harness.core.files import atomic_write_json

        atomic_write_json(Path(args.json), result, indent=1)


def model_kwargs(parser: argparse.ArgumentParser, args) -> dict:
    """lpes_hf's arguments: ``--model-args`` with ``--pretrained`` and ``--dtype`` folded in, checked
    before the model loads (a key given twice, a dtype torch lacks, a bad scale argument)."""
    from lm_eval.utils import simple_parse_args_string

    from lpes_harness.core.scales_args import check_model_args

    extra = simple_parse_args_string(args.model_args)
    for key in ("pretrained", "dtype"):
        if key in extra and getattr(args, key) is not None:
            parser.error(f"give the {key} once: --{key} or {key}= in --model-args")
    if args.dtype is None and "dtype" not in extra:
        args.dtype = "float32"  # also what a --grid folder's identity records
    kwargs = {"pretrained": args.pretrained, "dtype": args.dtype, **extra}
    try:
        check_dtype(kwargs["dtype"])
        check_model_args(kwargs)
    except ValueError as err:
        parser.error(" ".join(str(err).split()))
    return kwargs


def load_lm(args):
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.core.models import BundledModelMissing

    try:
        return LPESLM(**args.model_kwargs)
    except BundledModelMissing as err:
        print(f"lpes-check: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def run_grid(parser: argparse.ArgumentParser, args, metadata: Mapping) -> None:
    from lpes_harness.evaluation.calibration import calibrate, format_table, grid_settings
    from lpes_harness.core.files import atomic_write_text
    from lpes_harness.tasks.data import TaskDataError
    from lpes_harness.tasks.position import resolve_options, resolve_task

    if args.answers_from or args.json:
        parser.error("--grid writes one result per setting to --out; it takes neither --answers-from nor --json")
    try:
        grid = json.loads(args.grid)
        settings = grid_settings(grid)
        for setting in settings:  # every setting checked before the model loads
            resolve_options(resolve_task(args.task), {**metadata, **setting, "split": args.split, "num_samples": args.num_samples})
    except json.JSONDecodeError as err:
        parser.error(f"--grid is not valid JSON: {err.msg}")
    except (ValueError, TaskDataError) as err:
        parser.error(str(err))
    out = Path(args.out) if args.out else None
    lm = load_lm(args)
    identity = {"pretrained": args.pretrained, "dtype": args.dtype, "model_args": args.model_args, "task": args.task,
                "split": args.split, "num_samples": args.num_samples, "chat_template": args.chat_template}

    def check(setting_metadata: dict) -> dict:
        result = check_task(lm, args.task, num_samples=args.num_samples, metadata=setting_metadata, split=args.split,
                            chat_template=apply_chat_template(args.chat_template))
        print(format_report(result), flush=True)
        return result

    results = calibrate(check, settings, base_metadata=metadata, out=out, identity=identity)
    table = format_table(results, settings)
    print(table)
    if out:
        atomic_write_text(out / "calibration.md", table + "\n")


def rejudge(parser: argparse.ArgumentParser, path: str, task: str) -> dict:
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        if saved["task"] != task:
            parser.error(f"--answers-from {path} holds task {saved['task']!r}, not {task!r}")
        answers = {int(p): a for p, a in saved["answers"].items()}
        result = judge(task, answers, saved["gold_removed_answers"], metadata=saved["metadata"], split=saved["split"],
                       chat_template=saved["chat_template"])
    except (OSError, json.JSONDecodeError, KeyError, ValueError) as err:
        parser.error(f"--answers-from {path}: not an lpes-check --json file ({type(err).__name__}: {err})")
    if "prompt_tokens" in saved:  # measured with the model, which a re-judge does not load
        result["prompt_tokens"] = saved["prompt_tokens"]
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
