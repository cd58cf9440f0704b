"""What kind of wrong answer is it? Tells position bias from a model that ignores the query.

No forward pass: each wrong answer is read against the sample's own items, in the order the
model saw them at that gold position.

- ``other_item``: the answer another item of the context holds (another needle's number,
  another pair's value). The item's index, depth (percent of the way through the items),
  rank among the items that hold an answer (from the start and from the end) and offset from
  the gold item are kept. A model that reads the question but picks the wrong item, because
  the gold one sits where it attends badly, fails this way: that is position bias itself.
- ``in_context``: text of the context that no item holds as its answer (the asked key copied,
  a filler word).
- ``made_up``: found nowhere in the context (``10000000000``).
- ``empty``: nothing.

Across samples, the ``other_item`` answers that name the item at one fixed rank (the first
pair, the last needle) make a *fixed-place policy*: "answer the first value whatever was
asked". Such a policy also scores wherever the gold item sits at that rank, so a model that
follows it looks right at one end without reading the query.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lpes_harness.tasks.metrics import first_line, normalize_answer

KINDS = ("correct", "other_item", "in_context", "made_up", "empty")
NOT_IN_CONTEXT = ("made_up", "empty")

_WORD = re.compile(r"[\w-]+")


@dataclass(frozen=True)
class Classified:
    """One answer's kind; the ``item_*`` fields only for ``other_item``."""

    kind: str
    item_index: int | None = None
    depth: float | None = None  # percent of the way through the items
    rank: int | None = None  # among the items that hold an answer, 0 = first
    rank_from_end: int | None = None  # 0 = last
    offset: int | None = None  # item index - gold index

    def as_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


def classify(prediction: str, correct: bool, items: Sequence[Any], gold_index: int, prompt: str, task) -> Classified:
    """The kind of ``prediction`` for a sample whose items (final order) hold the gold at ``gold_index``."""
    if correct:
        return Classified("correct")
    if not prediction.strip():
        return Classified("empty")
    holders = _answer_holders(items, task)  # item index -> what that item would answer
    matched = _matching_item(prediction, holders, gold_index, task)
    if matched is not None:
        order = sorted(holders)
        rank = order.index(matched)
        depth = 100.0 * matched / (len(items) - 1) if len(items) > 1 else 0.0
        return Classified("other_item", item_index=matched, depth=round(depth, 1), rank=rank,
                          rank_from_end=len(order) - 1 - rank, offset=matched - gold_index)
    return Classified("in_context" if _in_prompt(prediction, prompt, task) else "made_up")


def _answer_holders(items: Sequence[Any], task) -> dict[int, str]:
    if task.item_answer is not None:
        holders = {i: task.item_answer(item) for i, item in enumerate(items)}
        return {i: value for i, value in holders.items() if value}
    if task.item_text is not None:
        return {i: task.item_text(item) for i, item in enumerate(items)}
    return {}


def gold_rank(items: Sequence[Any], gold_index: int, task) -> tuple[int, int]:
    """The gold item's rank among the items that hold an answer, from the start and from the end:
    where a fixed-place policy would be right. A task that says nothing of its items: every item holds one."""
    holders = sorted(_answer_holders(items, task)) or list(range(len(items)))
    rank = holders.index(gold_index)
    return rank, len(holders) - 1 - rank


def _matching_item(prediction: str, holders: Mapping[int, str], gold_index: int, task) -> int | None:
    if task.item_answer is not None:
        # The task's own substring rule (the metric that scored it wrong): the value whose text
        # starts earliest in the answer names the item.
        lowered = prediction.lower()
        found = [(lowered.find(value.lower()), i) for i, value in holders.items() if i != gold_index and value.lower() in lowered]
        return min(found)[1] if found else None
    # Text items (documents): the answer's normalised first line inside an item's normalised text.
    answer = normalize_answer(first_line(prediction))
    if not answer:
        return None
    for i, text in holders.items():
        if i != gold_index and answer in normalize_answer(text):
            return i
    return None


def _in_prompt(prediction: str, prompt: str, task) -> bool:
    if task.item_answer is not None:
        # A value answer is one word; its first word (quotes and full stop dropped) as a word of the prompt.
        words = _WORD.findall(prediction)
        return bool(words) and re.search(rf"(?<![\w-]){re.escape(words[0])}(?![\w-])", prompt, re.IGNORECASE) is not None
    answer = normalize_answer(first_line(prediction))
    return bool(answer) and answer in normalize_answer(prompt)


def summarise(classified: Mapping[int, Sequence[Classified]], positions: Sequence[int],
              gold_ranks: Mapping[int, tuple[int, int]]) -> dict:
    """Counts by gold position, the middle positions' share of other-item errors, the fixed-place policy.

    ``gold_ranks[p]`` is the gold item's (rank, rank from the end) among the answer holders at
    position ``p``: where a fixed-place policy would be right.
    """
    counts = {str(p): {kind: sum(c.kind == kind for c in classified[p]) for kind in KINDS} for p in positions}
    middle = [p for p in positions if p not in (positions[0], positions[-1])] or list(positions)
    middle_wrong = [c for p in middle for c in classified[p] if c.kind != "correct"]
    middle_other = [c for c in middle_wrong if c.kind == "other_item"]
    depths = Counter(c.depth for c in middle_other)

    wrong = [c for p in positions for c in classified[p] if c.kind != "correct"]
    places = Counter(place for c in wrong if c.kind == "other_item"
                     for place in (("first", c.rank), ("last", c.rank_from_end)))
    fixed = None
    if places:
        (side, rank), count = places.most_common(1)[0]
        right_at = [p for p in positions if gold_ranks[p][0 if side == "first" else 1] == rank]
        fixed = {"side": side, "rank": rank, "count": count, "wrong": len(wrong),
                 "share": count / len(wrong), "gold_there_at": right_at}
    return {
        "counts": counts,
        "middle_positions": middle,
        "middle_wrong": len(middle_wrong),
        "middle_other_item": len(middle_other),
        "middle_other_item_share": len(middle_other) / len(middle_wrong) if middle_wrong else 0.0,
        "middle_other_item_depths": {str(depth): n for depth, n in sorted(depths.items())},
        "middle_other_item_neighbours": sum(abs(c.offset) == 1 for c in middle_other),
        # Which side of the gold item the named ones sit on: mostly after it is a recency bias,
        # mostly before a primacy bias; a scaling can trade one for the other (16 needles, SmolLM2).
        "middle_other_item_before": sum(c.offset < 0 for c in middle_other),
        "middle_other_item_after": sum(c.offset > 0 for c in middle_other),
        "fixed_place": fixed,
    }


def place_name(fixed: Mapping) -> str:
    """'the first item', 'the 2nd item from the end', ..."""
    rank = fixed["rank"]
    if fixed["side"] == "first":
        return "the first item" if rank == 0 else f"item {rank + 1} from the start"
    return "the last item" if rank == 0 else f"item {rank + 1} from the end"
