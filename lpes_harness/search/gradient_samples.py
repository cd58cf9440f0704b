"""The gradient search's token samples, built from a position task's documents.

:func:`lpes_harness.search.gradient.token_samples` tokenises ``(context, gold, others)`` text; this module
gets that text from a position task exactly as the search's fitness scores it: the documents of the split
come from :class:`~lpes_harness.lmeval.position_scorer.PositionScorer` (lm-eval's own task objects, so the
prompt is lm-eval's ``fewshot_context``: the answer prefix, and the chat template where the task wants it),
and each (context, gold answer) pair is the one the scorer feeds the model (``answer_pairs``). A sample's
prompt tokens are therefore the tokens the fitness reads the same document with.

The other values (the margin loss's rivals) are what the document's other items would answer if they were
the gold one (the task's ``item_answer``: the other needles' numbers of ``multi_needle``, the other pairs'
values of ``kv_retrieval``); a task whose items hold no answer (``needle``'s filler, ``mdqa``'s documents)
gives none, and the margin loss falls back to the gold log-probability there.

One sample per drawn condition (:func:`lpes_harness.search.drawn_conditions.draw_conditions`): the
condition's options (``num_sentences``, ``num_needles``, ...) over the caller's ``metadata``, its document
the split's sample ``condition["sample"]``, its gold position drawn from ``percents`` with ``seed``.
"""

from __future__ import annotations

import random
from typing import Mapping, Sequence

from lpes_harness.search.gradient import TokenSample, token_samples


def position_token_samples(lm, task: str, split: str, conditions: Sequence[Mapping], percents: Sequence[int],
                           seed: int, *, metadata: Mapping | None = None,
                           chat_template: bool | None = None) -> list[TokenSample]:
    """One :class:`TokenSample` per condition, in the conditions' order; reproducible from ``seed``.

    ``lm``: the lm-eval model the fitness scores with (``lpes_hf`` / HFLM); only its tokenizer (and chat
    template) is used. ``conditions``: dicts of task options, with ``sample``, the document's index in the
    split (as ``draw_conditions`` gives them; without it, the condition's own index). ``percents``: the gold
    positions; the samples take them in turns, each turn in an order shuffled by ``seed``, so every position
    gets its share however few the samples. ``metadata``: task options every condition shares (the
    condition's own win). ``chat_template``: None, as the task prefers (and the tokenizer has one).

    A sample's ``condition`` is its condition with ``gold_percent`` added.
    """
    groups = _row_groups(lm, task, split, conditions, percents, seed, metadata, chat_template, every_item=False)
    return token_samples(lm, [group[0] for group in groups])


def position_question_groups(lm, task: str, split: str, conditions: Sequence[Mapping], percents: Sequence[int],
                             seed: int, *, metadata: Mapping | None = None,
                             chat_template: bool | None = None) -> list[list[TokenSample]]:
    """As :func:`position_token_samples`, each sample followed by the same prompt asked about every other item
    of it that answers something (the task's ``ask_item``; the racing stage's ``--every-item``): one group a
    condition, the drawn sample first. The group's prompts differ only in the question, so one forward of the
    text they share scores them all (:func:`lpes_harness.search.shared_prefix.group_log_probs`). A re-asked
    sample's ``condition`` has ``gold_percent`` where its item sits and ``asked_item``, the item's index."""
    groups = _row_groups(lm, task, split, conditions, percents, seed, metadata, chat_template, every_item=True)
    return [token_samples(lm, group) for group in groups]


def _row_groups(lm, task, split, conditions, percents, seed, metadata, chat_template, *, every_item: bool):
    if not percents:
        raise ValueError("position_token_samples needs at least one gold position")
    drawn = gold_percents(len(conditions), percents, seed)
    placed = [(dict(condition), percent) for condition, percent in zip(conditions, drawn)]
    for index, (condition, _) in enumerate(placed):
        condition.setdefault("sample", index)
    # One scorer (one lm-eval task load) per set of task options: the samples that share a length share it.
    groups: dict[tuple, list[int]] = {}
    for index, (condition, _) in enumerate(placed):
        groups.setdefault(_options_key(condition), []).append(index)
    rows: list[list | None] = [None] * len(placed)
    for members in groups.values():
        options = {**(metadata or {}), **_options(placed[members[0]][0])}
        wanted = {placed[i][0]["sample"] for i in members}
        for i, row in zip(members, _rows(lm, task, split, options, [placed[i] for i in members], 1 + max(wanted),
                                         chat_template, every_item)):
            rows[i] = row
    return rows


def gold_percents(count: int, percents: Sequence[int], seed: int) -> list[int]:
    """``count`` gold positions: ``percents`` in turns, each turn shuffled by ``random.Random(seed)``."""
    rng = random.Random(seed)
    drawn: list[int] = []
    while len(drawn) < count:
        turn = list(percents)
        rng.shuffle(turn)
        drawn += turn
    return drawn[:count]


def _rows(lm, task: str, split: str, options: Mapping, placed: Sequence[tuple[dict, int]], num_samples: int,
          chat_template: bool | None, every_item: bool) -> list[list[tuple]]:
    """Per placed condition (one options set), its ``(context, gold continuation, other continuations,
    condition)`` row, then with ``every_item`` the rows of the same prompt asked about its other items."""
    from lpes_harness.lmeval.position_scorer import PositionScorer
    from lpes_harness.tasks.position import build_examples, item_docs, resolve_options, resolve_task

    percents = sorted({percent for _, percent in placed})
    scorer = PositionScorer(lm, task, percents, metadata=options, split=split, num_samples=num_samples,
                            chat_template=chat_template)
    position_task = resolve_task(task)
    resolved, _ = resolve_options(position_task, {**options, "split": split, "num_samples": num_samples})
    examples = dict(build_examples(position_task, resolved))
    rows = []
    for condition, percent in placed:
        lm_eval_task, doc = scorer.tasks[percent], scorer.docs[percent][condition["sample"]]
        example = examples[doc["sample_index"]]
        asked = [doc] + (item_docs(position_task, example, percent, doc["sample_index"]) if every_item else [])
        delimiter = lm_eval_task.config.target_delimiter
        values = [*example.answers, *other_values(position_task, example)]  # every item's answer, the gold first
        group = []
        for one in asked:  # the prompt as the scorer feeds it (the same lm-eval task: only the question differs)
            pairs, _ = scorer.answer_pairs(lm_eval_task, [one])
            context, gold = pairs[0]  # the doc's first answer
            others = [delimiter + value for value in values if value not in one["answers"]]
            extra = {"asked_item": one["asked_item"]} if "asked_item" in one else {}
            group.append((context, gold, others, {**condition, "gold_percent": one["gold_percent"], **extra}))
        rows.append(group)
    return rows


def other_values(position_task, example) -> list[str]:
    """What the example's other items would answer (its distractor values), in their order, without repeats
    or the gold answers; none for a task that does not say what an item answers."""
    if position_task.item_answer is None:
        return []
    values: list[str] = []
    for item in example.distractors:
        value = position_task.item_answer(item)
        if value and value not in values and value not in example.answers:
            values.append(value)
    return values


def _options(condition: Mapping) -> dict:
    return {key: value for key, value in condition.items() if key != "sample"}


def _options_key(condition: Mapping) -> tuple:
    return tuple(sorted((key, repr(value)) for key, value in _options(condition).items()))
