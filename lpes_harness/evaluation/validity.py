"""Does a position task measure retrieval on this model? The answers, their kinds and the verdict (``lpes-check``).

:func:`check_task` generates the model's answers at each gold position (greedy, the task's own
prompt and metric, as ``lm_eval`` would) and on the same samples with the gold item removed;
:func:`judge` scores them, sorts each wrong answer by kind
(:mod:`lpes_harness.evaluation.wrong_answers`: another item's value, other text of the
context, made up, or empty) and gives the verdict. A task measures retrieval on this model when
- the model is clearly right where it does best (that position's 95 % interval starts at
  ``BEST_LOWER_MIN`` or above),
- it scores near 0 with the gold item removed (at most ``GOLD_REMOVED_MAX``),
- its average is clearly above the gold-removed one (the two 95 % intervals do not overlap),
- and its answers show that it reads the query. It does not when, at the positions where it
  does best, at least ``NOT_IN_CONTEXT_MAX`` of its answers are empty or made up; or when at
  least ``FIXED_PLACE_SHARE`` of its wrong answers name the item at one fixed place (the first
  pair, say) and the gold item sits at that place where it does best, so that this policy, not
  retrieval, explains its right answers.
Wrong answers in the middle that name another item are then the shape of the position effect
(the model picks the wrong item because the gold one sits where it attends badly), which a
search can fix, not a defect of the task.

The command is ``lpes-check`` (:mod:`lpes_harness.commands.check`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lpes_harness.evaluation.stats import accuracy_with_interval
from lpes_harness.evaluation.wrong_answers import NOT_IN_CONTEXT, classify, gold_rank, place_name, summarise

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
