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
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.evaluation.stats import accuracy_with_interval
from lpes_harness.evaluation.wrong_answers import NOT_IN_CONTEXT, classify, gold_rank, place_name, summarise
from lpes_harness.core.models import check_dtype, positive_int

BEST_LOWER_MIN = 0.5  # the best position's 95 % interval starts here or above: clearly right somewhere
GOLD_REMOVED_MAX = 0.1  # accuracy without the gold item above this: no retrieval needed
EASY_MARGIN = 0.1  # positions within this of the best accuracy are where the model does best
NOT_IN_CONTEXT_MAX = 0.1  # empty or made-up answers at those positions, share of their answers
FIXED_PLACE_SHARE = 0.5  # wrong answers naming one fixed place: a policy, if it also explains the right ones


def check_task(lm, task: str, *, num_samples: int, metadata: Mapping | None = None, split: str = "heldout",
               chat_template=None) -> dict:
    """Generate the answers at every gold position and with the gold removed, then :func:`judge` them."""
    from tqdm.auto import tqdm

    from lpes_harness.lmeval.position_scorer import PositionScorer
    from lpes_harness.tasks.position import build_examples, resolve_options, resolve_task

    position_task = resolve_task(task)
    scorer = PositionScorer(lm, task, position_task.positions, metadata=metadata, split=split,
                            num_samples=num_samples, mode="generate", chat_template=chat_template)
    # Gold removed: the same samples, rendered from their other items only.
    options, _ = resolve_options(position_task, {**(metadata or {}), "split": split, "num_samples": num_samples})
    examples = dict(build_examples(position_task, options))
    first = position_task.positions[0]
    removed_docs = [
        {**doc, "prompt": position_task.render(list(examples[doc["sample_index"]].distractors), examples[doc["sample_index"]])}
        for doc in scorer.docs[first]
    ]
    jobs = [(p, scorer.tasks[p], scorer.docs[p]) for p in position_task.positions] + [("removed", scorer.tasks[first], removed_docs)]
    generated: dict = {key: [] for key, _, _ in jobs}
    with tqdm(total=sum(len(docs) for _, _, docs in jobs), desc=f"lpes-check {task}", unit="answer") as bar:
        for key, task_obj, docs in jobs:
            for start in range(0, len(docs), 8):  # a few at a time, for the progress bar
                generated[key] += scorer.generate(task_obj, docs[start:start + 8])
                bar.update(len(docs[start:start + 8]))
    removed_answers = generated.pop("removed")
    result = judge(task, generated, removed_answers, metadata=metadata, split=split, chat_template=scorer.chat_template)
    if hasattr(lm, "tok_encode"):  # an HF model (lm-eval's LM interface has no tokenizer)
        middle = min(position_task.positions, key=lambda p: abs(p - 50))
        tokens = [len(lm.tok_encode(scorer.prompt(scorer.tasks[middle], doc))) for doc in scorer.docs[middle]]
        result["prompt_tokens"] = round(sum(tokens) / len(tokens))  # mean, at the middle position, as the model sees it
    return result


def judge(task: str, answers: Mapping[int, Sequence[str]], removed_answers: Sequence[str], *,
          metadata: Mapping | None = None, split: str = "heldout", chat_template: bool | None = None) -> dict:
    """Accuracy by position, the gold-removed control, the kinds of wrong answer and the verdict.

    ``answers[p][i]`` is the answer to sample i with the gold item at p %; the samples are the
    task's own (rebuilt from ``metadata``, ``split`` and the number of answers), so no model is needed.
    """
    from lpes_harness.tasks.position import build_examples, place_gold, resolve_options, resolve_task

    position_task = resolve_task(task)
    positions = position_task.positions
    num_samples = len(removed_answers)
    if any(len(answers[p]) != num_samples for p in positions):
        raise ValueError(f"{task}: every position needs {num_samples} answers, got {[len(answers[p]) for p in positions]}")
    options, _ = resolve_options(position_task, {**(metadata or {}), "split": split, "num_samples": num_samples})
    examples = [example for _, example in build_examples(position_task, options)]

    correct, classified, gold_ranks = {}, {}, {}
    for p in positions:
        correct[p], classified[p] = [], []
        for example, answer in zip(examples, answers[p]):
            items, gold_at = place_gold(example, p)
            right = position_task.metric(answer, list(example.answers)) == 1
            correct[p].append(float(right))
            classified[p].append(classify(answer, right, items, gold_at, position_task.render(items, example), position_task))
        gold_ranks[p] = gold_rank(*place_gold(examples[0], p), position_task)
    removed = [float(position_task.metric(a, list(e.answers)) == 1) for e, a in zip(examples, removed_answers)]

    result = {
        "task": task, "split": split, "num_samples": num_samples, "chat_template": chat_template,
        "metadata": dict(metadata or {}),
        "by_position": {str(p): accuracy_with_interval(correct[p]) for p in positions},
        "average": accuracy_with_interval([v for p in positions for v in correct[p]]),
        "gold_removed": accuracy_with_interval(removed),
        "wrong_answers": summarise(classified, positions, gold_ranks),
        "answers": {str(p): list(answers[p]) for p in positions},
        "answer_kinds": {str(p): [c.as_dict() for c in classified[p]] for p in positions},
        "gold_removed_answers": list(removed_answers),
    }  # fmt: skip
    result["verdict"] = verdict(result)
    return result


def easy_positions(result: Mapping) -> list[str]:
    """The positions where the model does best: within ``EASY_MARGIN`` of the best accuracy."""
    best = max(cell["accuracy"] for cell in result["by_position"].values())
    return [p for p, cell in result["by_position"].items() if cell["accuracy"] >= best - EASY_MARGIN]


def verdict(result: Mapping) -> str:
    """One line: does this task measure retrieval on this model? (The rule is the module docstring's.)"""
    problems = []
    by_position = result["by_position"]
    best = max(by_position, key=lambda p: by_position[p]["accuracy"])
    if by_position[best]["interval"][0] < BEST_LOWER_MIN:
        cell = by_position[best]
        problems.append(f"not clearly right anywhere (best {cell['accuracy']:.2f} at {best} %, "
                        f"[{cell['interval'][0]:.2f}, {cell['interval'][1]:.2f}])")
    if result["gold_removed"]["accuracy"] > GOLD_REMOVED_MAX:
        problems.append(f"{result['gold_removed']['accuracy']:.2f} accuracy with the gold item removed")
    # Not just "higher": at the floor (1 right of 40, 0 without the gold item) a position curve is
    # noise. The two 95 % intervals must not overlap.
    average, removed = result["average"], result["gold_removed"]
    if average["interval"][0] <= removed["interval"][1]:
        problems.append(f"not clearly better with the gold item than without it (average {average['accuracy']:.2f} "
                        f"[{average['interval'][0]:.2f}, {average['interval'][1]:.2f}], gold removed "
                        f"{removed['accuracy']:.2f} [{removed['interval'][0]:.2f}, {removed['interval'][1]:.2f}])")
    problems += copying_problems(result)
    if problems:
        return "does NOT measure retrieval on this model: " + "; ".join(problems)
    wrong = result["wrong_answers"]
    shape = (f"; of the wrong answers in the middle, {wrong['middle_other_item']} of {wrong['middle_wrong']} "
             f"({wrong['middle_other_item_share']:.0%}) are another item's value: position bias"
             if wrong["middle_wrong"] else "")
    return "measures retrieval: right where it does best, near 0 without the gold item, and it reads the query" + shape


def copying_problems(result: Mapping) -> list[str]:
    """The answers show that the model does not read the query (the module docstring's last rule)."""
    problems = []
    easy = easy_positions(result)
    counts = result["wrong_answers"]["counts"]
    shown = sum(sum(counts[p].values()) for p in easy)
    absent = sum(counts[p][kind] for p in easy for kind in NOT_IN_CONTEXT)
    if shown and absent / shown >= NOT_IN_CONTEXT_MAX:
        problems.append(f"empty or made-up answers where it does best too ({absent} of {shown} at "
                        f"{', '.join(p + ' %' for p in easy)}): it does not read the query (copying)")
    fixed = result["wrong_answers"]["fixed_place"]
    explained = [p for p in easy if int(p) in fixed["gold_there_at"]] if fixed else []
    if fixed and fixed["share"] >= FIXED_PLACE_SHARE and explained:
        problems.append(f"{fixed['count']} of {fixed['wrong']} wrong answers ({fixed['share']:.0%}) are the value of "
                        f"{place_name(fixed)}, where the gold item sits at {', '.join(p + ' %' for p in explained)}: "
                        f"a fixed-place policy explains its right answers (copying)")
    return problems


def format_report(result: Mapping) -> str:
    counts = result["wrong_answers"]["counts"]
    lines = [f"{result['task']} ({result['split']} split, {result['num_samples']} samples per position, "
             f"chat template {'on' if result['chat_template'] else 'off'})",
             "| gold position | accuracy | 95 % interval | other item | in context | made up | empty |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for percent, cell in result["by_position"].items():
        c = counts[percent]
        lines.append(f"| {percent} % | {cell['accuracy']:.3f} | [{cell['interval'][0]:.2f}, {cell['interval'][1]:.2f}] "
                     f"| {c['other_item']} | {c['in_context']} | {c['made_up']} | {c['empty']} |")
    for name, cell in (("average", result["average"]), ("gold removed", result["gold_removed"])):
        lines.append(f"| {name} | {cell['accuracy']:.3f} | [{cell['interval'][0]:.2f}, {cell['interval'][1]:.2f}] | | | | |")
    wrong = result["wrong_answers"]
    middle = ", ".join(f"{p} %" for p in wrong["middle_positions"])
    lines.append(f"wrong answers at {middle}: {wrong['middle_other_item']} of {wrong['middle_wrong']} "
                 f"({wrong['middle_other_item_share']:.0%}) are another item's value "
                 f"({wrong['middle_other_item_neighbours']} of them the gold item's neighbour; "
                 f"{wrong['middle_other_item_after']} after the gold item, {wrong['middle_other_item_before']} before it)")
    if wrong["middle_other_item_depths"]:
        depths = sorted(wrong["middle_other_item_depths"].items(), key=lambda kv: -kv[1])[:5]
        lines.append("  the items they name sit at depth " + ", ".join(f"{d} % ({n})" for d, n in depths))
    fixed = wrong["fixed_place"]
    if fixed:
        there = ", ".join(f"{p} %" for p in fixed["gold_there_at"]) or "no position"
        lines.append(f"most named place: {place_name(fixed)}, {fixed['count']} of {fixed['wrong']} wrong answers "
                     f"({fixed['share']:.0%}); the gold item sits there at {there}")
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lpes-check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help="a registered position task (multi_needle, kv_retrieval, mdqa, needle, ...)")
    p.add_argument("--num-samples", type=int, default=40, help="samples per gold position (default 40)")
    p.add_argument("--metadata", default="{}", help="task options as JSON (the --metadata keys of lm_eval)")
    p.add_argument("--split", default="heldout", choices=["search", "heldout", "validation"])
    p.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"],
                   help="auto follows the task (multi_needle: on)")
    p.add_argument("--pretrained", default=None,
                   help="HF id, local dir, .gguf, or a packaged model: smollm2 (the default), gemma3-270m")
    p.add_argument("--model-args", default="", help="extra lpes_hf arguments, 'k=v,k=v' (e.g. scales=1.2)")
    p.add_argument("--dtype", default=None, help="model dtype (default float32)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", default=None, help="also write the full result (with every answer) here")
    p.add_argument("--grid", default=None, metavar="JSON",
                   help="calibrate: run the check at every combination of these task options, e.g. "
                        "'{\"num_sentences\": [120, 240], \"num_needles\": [8, 16]}'; prints one row per setting "
                        "(see lpes_harness/evaluation/calibration.py)")
    p.add_argument("--out", default=None, metavar="DIR",
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
                            split=args.split, chat_template=CHAT[args.chat_template])
    print(format_report(result))
    if args.json:
        from lpes_harness.core.files import atomic_write_json

        atomic_write_json(Path(args.json), result, indent=1)


CHAT = {"auto": None, "on": True, "off": False}


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
                            chat_template=CHAT[args.chat_template])
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
