"""Every method tuned alike: successive halving over its candidate settings on a budget of forwards.

``lpes-compare`` gives each method the same number of forwards on the search split and lets each spend it
the same way, so that a row's place on its leaderboard says how good the method is, not how many
settings it was allowed to try. A method's candidates are its settings (a grid of the table of methods,
uniform factors for PI, drawn pairs of lines for LPES); they are raced by successive halving:

- rung 0 scores every candidate on the first ``n0`` samples of every block (a block: one condition at one
  gold position); each later rung keeps the better half and doubles the samples, scoring only the new ones;
- the last rung, two candidates (or one), takes whatever the budget has left, so every method spends its
  budget to within one sample per block per finalist;
- rank: accuracy over every sample the candidates share (all blocks pooled, as the held-out table pools
  them), ties to the earlier candidate (grid order; the identity, where a grid holds one, comes first).

A grid too large for the budget to score each candidate once per block is thinned first (a seeded draw,
kept in grid order) and the plan says how many it kept. Scores come from a callback over blocks with a
cache underneath, so the race is deterministic given them: a resumed race replays its rungs from the cache
and ends where an uninterrupted one does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass(frozen=True)
class RacePlan:
    """How one method's race spends ``budget`` forwards: the candidates it keeps and its rungs."""

    kept: tuple[int, ...]  # indices into the method's candidate list, in list order
    rungs: tuple[tuple[int, int], ...]  # (candidates alive, samples per block so far), rung by rung
    blocks: int  # conditions x gold positions
    budget: int

    @property
    def forwards(self) -> int:
        return rung_forwards(self.rungs, self.blocks)

    def to_dict(self) -> dict:
        return {"kept": list(self.kept), "rungs": [list(r) for r in self.rungs], "blocks": self.blocks,
                "budget": self.budget, "forwards": self.forwards}

    @classmethod
    def from_dict(cls, saved: dict) -> RacePlan:
        return cls(tuple(saved["kept"]), tuple(tuple(r) for r in saved["rungs"]), saved["blocks"], saved["budget"])


def rung_forwards(rungs: Sequence[tuple[int, int]], blocks: int) -> int:
    """Forwards of a race: each rung's new samples for every candidate it keeps, in every block."""
    total, before = 0, 0
    for alive, seen in rungs:
        total += alive * (seen - before) * blocks
        before = seen
    return total


def halving(count: int, first: int) -> list[tuple[int, int]]:
    """Rungs from ``count`` candidates on ``first`` samples: halve (rounded up) and double until two are left."""
    rungs, alive, seen = [(count, first)], count, first
    while alive > 2:
        alive, seen = (alive + 1) // 2, seen * 2
        rungs.append((alive, seen))
    return rungs


def plan_race(count: int, budget: int, blocks: int, seed: int = 0, most: int | None = None) -> RacePlan:
    """The race of ``count`` candidates that spends ``budget`` forwards over ``blocks`` blocks.

    The largest ``n0`` whose halving fits, then the last rung grown by what is left; a grid that cannot give
    every candidate one sample per block with the halving after it is thinned to the most candidates that can.
    ``most``: the samples a block has (the search split's size); a budget that would need more is left unspent.
    """
    if count < 1 or blocks < 1:
        raise ValueError(f"a race needs candidates and blocks, got {count} and {blocks}")
    kept = list(range(count))
    while len(kept) > 1 and rung_forwards(halving(len(kept), 1), blocks) > budget:
        kept = sorted(random.Random(seed).sample(range(count), len(kept) - 1))
    if rung_forwards(halving(len(kept), 1), blocks) > budget:
        raise ValueError(f"a budget of {budget} forwards cannot score one candidate once in each of {blocks} blocks")
    first, most = 1, most or float("inf")
    while rung_forwards(halving(len(kept), first + 1), blocks) <= budget and halving(len(kept), first + 1)[-1][1] <= most:
        first += 1
    rungs = halving(len(kept), first)
    alive, seen = rungs[-1]
    if seen > most:
        raise ValueError(f"{len(kept)} candidates halved from one sample a block need {seen} samples a block; "
                         f"the split has {most}")
    extra = (budget - rung_forwards(rungs, blocks)) // (alive * blocks)
    rungs[-1] = (alive, min(seen + extra, most))
    return RacePlan(tuple(kept), tuple(rungs), blocks, budget)


@dataclass
class Raced:
    """One candidate in a race: its place in the method's list, and its scores per block so far."""

    index: int
    scores: dict = field(default_factory=dict)  # block -> [0/1, ...] in sample order
    rung: int = 0

    def accuracy(self, n: int) -> float:
        """Accuracy on the first ``n`` samples of every block, pooled."""
        values = [v for block in self.scores.values() for v in block[:n]]
        return sum(values) / len(values) if values else 0.0

    def to_dict(self) -> dict:
        return {"index": self.index, "rung": self.rung,
                "right": sum(v for block in self.scores.values() for v in block),
                "samples": sum(len(block) for block in self.scores.values())}


def run_race(plan: RacePlan, score: Callable[[int, int], dict]) -> tuple[Raced, list[Raced]]:
    """Race ``plan``'s candidates; ``score(index, n)`` -> ``{block: [first n scores]}`` for candidate ``index``
    (cached underneath: a larger ``n`` scores only the new samples). Returns the winner and every entry."""
    entries = [Raced(index) for index in plan.kept]
    alive, before = list(entries), 0
    for number, (keep, seen) in enumerate(plan.rungs):
        if number:  # the cut, on the samples every survivor has; ties to the earlier candidate
            alive = sorted(alive, key=lambda e: (-e.accuracy(before), e.index))[:keep]
        for entry in alive:
            entry.rung, entry.scores = number, {block: list(v) for block, v in score(entry.index, seen).items()}
        before = seen
    winner = min(alive, key=lambda e: (-e.accuracy(before), e.index))
    return winner, entries
