"""Does a position task measure retrieval on this model? Check before you spend hours searching.

    lpes-check --task multi_needle --num-samples 40
    lpes-check --task kv_retrieval --metadata '{"num_pairs": 10}' --chat-template off

For each gold position it generates the model's answers (greedy, the task's own prompt and
metric, as ``lm_eval`` would) and prints accuracy with a 95 % interval, plus two controls:

- **gold removed**: the same samples with the gold item taken out. A task that measures
  retrieval scores near 0 there; a high score means the answer can be had without reading
  the context (or guessed).
- **copying**: on a sample answered wrongly at two gold positions, how often the two wrong
  answers are identical, and the most frequent answer overall. A model that copies a fixed
  item (the first KV value, say) gives the same wrong answer wherever the gold item sits.

Position effects measured on a task that fails these controls are noise: a search on it
cannot find a real gain.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping
from itertools import combinations
from pathlib import Path

from lpes_harness.analysis.stats import accuracy_with_interval

COPYING_RATE = 0.5  # identical wrong answers on more than half the pairs: the model copies
GOLD_REMOVED_MAX = 0.1  # accuracy without the gold item above this: no retrieval needed


def _normalise(answer: str) -> str:
    return " ".join(answer.strip().strip(".").lower().split())


def check_task(lm, task: str, *, num_samples: int, metadata: Mapping | None = None, split: str = "heldout",
               chat_template=None) -> dict:
    """Accuracy by position, the gold-removed control and the copying control; see the module docstring."""
    from lpes_harness.search.fitness import PositionScorer
    from lpes_harness.tasks.position import build_examples, resolve_options, resolve_task

    position_task = resolve_task(task)
    scorer = PositionScorer(lm, task, position_task.positions, metadata=metadata, split=split,
                            num_samples=num_samples, mode="generate", chat_template=chat_template)

    answers, correct = {}, {}
    for percent in position_task.positions:
        task_obj, docs = scorer.tasks[percent], scorer.docs[percent]
        answers[percent] = scorer.generate(task_obj, docs)
        correct[percent] = [float(next(iter(task_obj.process_results(d, [a]).values()))) for d, a in zip(docs, answers[percent])]

    # Gold removed: the same samples, rendered from their other items only.
    options, _ = resolve_options(position_task, {**(metadata or {}), "split": split, "num_samples": num_samples})
    examples = dict(build_examples(position_task, options))
    first = position_task.positions[0]
    task_obj = scorer.tasks[first]
    removed_docs = [
        {**doc, "prompt": position_task.render(list(examples[doc["sample_index"]].distractors), examples[doc["sample_index"]])}
        for doc in scorer.docs[first]
    ]
    removed_answers = scorer.generate(task_obj, removed_docs)
    removed = [float(next(iter(task_obj.process_results(d, [a]).values()))) for d, a in zip(removed_docs, removed_answers)]

    # Copying: identical wrong answers of one sample at two gold positions.
    same = pairs = 0
    for i in range(len(scorer.docs[first])):
        wrong = [_normalise(answers[p][i]) for p in position_task.positions if not correct[p][i]]
        for a, b in combinations(wrong, 2):
            pairs += 1
            same += a == b
    everything = Counter(_normalise(a) for p in position_task.positions for a in answers[p])
    top, top_count = everything.most_common(1)[0] if everything else ("", 0)
    by_position = {str(p): accuracy_with_interval(correct[p]) for p in position_task.positions}
    result = {
        "task": task, "split": split, "num_samples": len(scorer.docs[first]), "chat_template": scorer.chat_template,
        "metadata": dict(metadata or {}),
        "by_position": by_position,
        "average": accuracy_with_interval([v for p in position_task.positions for v in correct[p]]),
        "gold_removed": accuracy_with_interval(removed),
        "copying": {"identical_wrong_pairs": same, "wrong_pairs": pairs, "rate": same / pairs if pairs else 0.0,
                    "most_common_answer": top, "most_common_count": top_count, "answers": sum(everything.values())},
        "answers": {str(p): answers[p] for p in position_task.positions},
        "gold_removed_answers": removed_answers,
    }  # fmt: skip
    result["verdict"] = verdict(result)
    return result


def verdict(result: Mapping) -> str:
    """One line: does this task measure retrieval on this model?"""
    problems = []
    if result["gold_removed"]["accuracy"] > GOLD_REMOVED_MAX:
        problems.append(f"{result['gold_removed']['accuracy']:.2f} accuracy with the gold item removed")
    if result["copying"]["rate"] > COPYING_RATE:
        problems.append(f"the same wrong answer at different gold positions on {result['copying']['rate']:.0%} of pairs (copying)")
    # Not just "higher": at the floor (1 right of 40, 0 without the gold item) a position curve is
    # noise. The two 95 % intervals must not overlap.
    average, removed = result["average"], result["gold_removed"]
    if average["interval"][0] <= removed["interval"][1]:
        problems.append(f"not clearly better with the gold item than without it (average {average['accuracy']:.2f} "
                        f"[{average['interval'][0]:.2f}, {average['interval'][1]:.2f}], gold removed "
                        f"{removed['accuracy']:.2f} [{removed['interval'][0]:.2f}, {removed['interval'][1]:.2f}])")
    if problems:
        return "does NOT measure retrieval on this model: " + "; ".join(problems)
    return "measures retrieval: near 0 without the gold item, and wrong answers are not a copied fixed item"


def format_report(result: Mapping) -> str:
    lines = [f"{result['task']} ({result['split']} split, {result['num_samples']} samples per position, "
             f"chat template {'on' if result['chat_template'] else 'off'})",
             "| gold position | accuracy | 95 % interval |", "|---|---:|---|"]
    for percent, cell in result["by_position"].items():
        lines.append(f"| {percent} % | {cell['accuracy']:.3f} | [{cell['interval'][0]:.2f}, {cell['interval'][1]:.2f}] |")
    for name, cell in (("average", result["average"]), ("gold removed", result["gold_removed"])):
        lines.append(f"| {name} | {cell['accuracy']:.3f} | [{cell['interval'][0]:.2f}, {cell['interval'][1]:.2f}] |")
    copying = result["copying"]
    lines.append(f"copying: identical wrong answers on {copying['identical_wrong_pairs']} of {copying['wrong_pairs']} "
                 f"pairs of positions ({copying['rate']:.0%}); most common answer {copying['most_common_answer']!r} "
                 f"{copying['most_common_count']} of {copying['answers']}")
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lpes-check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help="a registered position task (multi_needle, kv_retrieval, mdqa, needle, ...)")
    p.add_argument("--num-samples", type=int, default=40, help="samples per gold position (default 40)")
    p.add_argument("--metadata", default="{}", help="task options as JSON (the --metadata keys of lm_eval)")
    p.add_argument("--split", default="heldout", choices=["search", "heldout"])
    p.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"],
                   help="auto follows the task (multi_needle: on)")
    p.add_argument("--pretrained", default=None, help="HF id, local dir or .gguf (default: bundled SmolLM2)")
    p.add_argument("--model-args", default="", help="extra lpes_hf arguments, 'k=v,k=v' (e.g. scales=1.2)")
    p.add_argument("--dtype", default="float32", help="model dtype (default float32)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the full result (with every answer) here")
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
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from lm_eval.utils import simple_parse_args_string

    from lpes_harness.lm import LPESLM

    lm = LPESLM(pretrained=args.pretrained, dtype=args.dtype, **simple_parse_args_string(args.model_args))
    chat = {"auto": None, "on": True, "off": False}[args.chat_template]
    result = check_task(lm, args.task, num_samples=args.num_samples, metadata=metadata, split=args.split, chat_template=chat)
    print(format_report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
