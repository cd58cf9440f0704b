"""Conditions drawn from a range: each fitness sample gets its own length (and needle count), from a seed.

Three fixed lengths let a search fit the model at those lengths and break between them (issue 100: a
curve searched at 60, 120 and 240 sentences lost 6.6 points at 180). Drawing each sample's
``num_sentences`` uniformly from a range, such as 60 to 300, makes the fitness an estimate of
accuracy over the inputs a user sends. The draws come from ``random.Random(seed)`` alone, so one seed
gives the same conditions on every machine and in every run (a resumed search, a held-out table).

A drawn condition is a dict of task options (``--metadata`` keys, as :mod:`lpes_harness.evaluation.conditions`
takes them), plus ``sample``: the index of the sample it is for, so that two samples of one length stay apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class ConditionRange:
    """Where the drawn options come from: ``num_sentences`` uniform over an integer range, the needle count
    (``num_needles``) uniform over ``needles`` when given (a range ``(low, high)``, or a list of choices)."""

    num_sentences: tuple[int, int] = (60, 300)
    needles: tuple[int, int] | Sequence[int] | None = None

    def __post_init__(self):
        low, high = self.num_sentences
        if not (isinstance(low, int) and isinstance(high, int) and 0 < low <= high):
            raise ValueError(f"num_sentences range {self.num_sentences!r}: need integers 0 < low <= high")
        if self.needles is not None and not self._needle_choices():
            raise ValueError(f"needles {self.needles!r}: give (low, high) with 1 <= low <= high, or a list of counts")

    def _needle_choices(self) -> list[int]:
        needles = self.needles
        if isinstance(needles, tuple) and len(needles) == 2 and needles[0] <= needles[1]:
            return [n for n in range(needles[0], needles[1] + 1) if n >= 1]
        return [int(n) for n in needles if int(n) >= 1] if needles is not None else []


def draw_conditions(seed: int, count: int, space: ConditionRange = ConditionRange()) -> list[dict]:
    """``count`` conditions, one per fitness sample, drawn reproducibly from ``seed``."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(seed)  # its own generator: nothing else's draws move these
    choices = space._needle_choices() if space.needles is not None else None
    drawn = []
    for sample in range(count):
        options = {"sample": sample, "num_sentences": rng.randint(*space.num_sentences)}
        if choices:
            options["num_needles"] = rng.choice(choices)
        drawn.append(options)
    return drawn
