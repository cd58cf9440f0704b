"""Random lines raced by successive halving: a global search of a few-number factor family, forwards only.

Issue #100 found that the curve which holds over lengths on SmolLM2 is nearly two straight lines over depth
(position 0.6 -> 1.6, base 0.5 -> 1.0: +23.3 pooled on 150 held-out samples of this CPU), that the loss falls
from the plain model toward it with no barrier, and that a local method from the plain model (Adam, per-number
steps) nonetheless stops near a uniform factor. Four numbers are few enough to *draw*: this search draws
``draws`` pairs of lines (each line's first and last factor, spread over the family's bounds in log space by a
Latin hypercube, so every stretch of each range is tried once per ``draws``), puts the plain model beside them,
and races them all on the same samples by successive halving:

- rung 0 scores every candidate on the first ``first`` samples; each later rung keeps the better half and
  scores the survivors on twice as many samples (the new ones only), up to ``samples`` in all;
- a candidate's rank is its greedy accuracy on the samples it has, the margin loss breaking ties (the loss is
  dense where accuracy is coarse: 8 samples hold 9 accuracies);
- every survivor of a rung has the same samples, so each cut compares candidates paired, sample by sample.

Greedy accuracy ranks because it is what the user gets (the issue: the dense ``logprob`` fitness steered worse).
The plain model races like any draw, so the search ends at a curve only where one led it on every rung's samples.

The samples are :class:`~lpes_harness.search.gradient.TokenSample` s drawn over lengths
(:mod:`~lpes_harness.search.gradient_samples`); a sample's score needs one forward. With ``--every-item`` a sample
is a group, its prompt asked about every needle it holds, scored from one forward of the text they share
(:mod:`~lpes_harness.search.shared_prefix`); its score is then the share of its questions answered right.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class RacingConfig:
    draws: int = 23  # candidates drawn; the plain model is one more
    samples: int = 48  # the most samples a candidate is scored on
    first: int = 8  # rung 0's samples
    seed: int = 0

    def __post_init__(self):
        if self.draws < 1 or not 1 <= self.first <= self.samples:
            raise ValueError(f"need draws >= 1 and 1 <= first <= samples; got {self}")

    def rungs(self) -> list[tuple[int, int]]:
        """``(candidates, samples)`` per rung: the candidates halve (rounded up) and the samples double."""
        rungs, alive, seen = [], self.draws + 1, self.first
        while True:
            rungs.append((alive, seen))
            if alive <= 1 or seen >= self.samples:
                return rungs
            alive, seen = math.ceil(alive / 2), min(2 * seen, self.samples)

    def forwards(self) -> int:
        """Forwards of the whole race: every rung's new samples for each candidate it keeps."""
        total, before = 0, 0
        for alive, seen in self.rungs():
            total += alive * (seen - before)
            before = seen
        return total


def latin_ends(count: int, bounds: Sequence[tuple[float, float]], seed: int) -> list[list[tuple[float, float]]]:
    """``count`` pairs of line ends per axis, log-uniform within each axis's ``(low, high)``, Latin-hypercube spread.

    Returns one list per draw: ``[(start, end) for each axis]``."""
    rng = np.random.default_rng(seed)
    dims = 2 * len(bounds)
    # One stratum of [0, 1) per draw in every dimension, the strata shuffled independently per dimension.
    unit = (np.stack([rng.permutation(count) for _ in range(dims)], axis=1) + rng.random((count, dims))) / count
    draws = []
    for row in unit:
        ends = []
        for axis, (low, high) in enumerate(bounds):
            a, b = (math.exp(math.log(low) + u * (math.log(high) - math.log(low))) for u in row[2 * axis:2 * axis + 2])
            ends.append((round(a, 4), round(b, 4)))
        draws.append(ends)
    return draws


@dataclass
class Entry:
    """One raced candidate: its line ends, and its scores so far in sample order."""

    index: int
    ends: list[tuple[float, float]]
    right: list[float] = field(default_factory=list)  # per sample: 1 / 0, or the share right of its questions
    loss: list[float] = field(default_factory=list)
    rung: int = 0  # the last rung it was scored at

    def key(self, n: int) -> tuple[float, float]:
        """Rank on the first ``n`` samples: more right first, then the lower mean loss."""
        return (-sum(self.right[:n]), sum(self.loss[:n]) / max(n, 1))

    def to_dict(self) -> dict:
        return {"index": self.index, "ends": [list(e) for e in self.ends], "right": self.right, "loss": self.loss,
                "rung": self.rung}


@dataclass
class RaceResult:
    entries: list[Entry]  # every candidate, the plain model first
    winner: Entry
    forwards: int
    stopped: bool = False  # stop_before_rung ended it early


def race(score: Callable[[Entry, int], tuple[bool, float]], candidates: Sequence[list[tuple[float, float]]],
         config: RacingConfig, *, known: dict | None = None,
         on_score: Callable[[Entry, int, bool, float], None] | None = None,
         stop_before_rung: Callable[[int, int, int], bool] | None = None) -> RaceResult:
    """Successive halving of ``candidates`` (line ends per axis, the plain model's included) by ``score``.

    ``score(entry, sample)`` -> ``(right, loss)`` for one sample under the entry's lines (one forward): ``right``
    True / False, or the share of the sample's questions answered right where one forward scores several
    (``--every-item``).
    ``known``: ``{(candidate index, sample): (right, loss)}`` already scored (a resumed race): served, not scored
    again, and counted in ``forwards`` as the forwards they cost. ``on_score`` is called after each new score (a journal line). The race is
    deterministic given the scores, so a resumed one ends exactly as an uninterrupted one.
    ``stop_before_rung(rung, candidates, new samples)``: True ends the race before that rung (a deadline); the
    winner is then the leader of the last rung scored. ``RaceResult.stopped`` says so."""
    known = dict(known or {})
    entries = [Entry(i, [tuple(e) for e in ends]) for i, ends in enumerate(candidates)]
    rungs, forwards, alive, before, stopped = _rungs(len(entries), config), 0, list(entries), 0, False
    for number, (keep, seen) in enumerate(rungs):
        if number and stop_before_rung is not None and stop_before_rung(number, keep, seen - before):
            stopped = True
            break
        if number:  # the cut: the better half on the samples every survivor has
            alive = sorted(alive, key=lambda e: (e.key(before), e.index))[:keep]
        for entry in alive:
            entry.rung = number
            for sample in range(before, seen):
                if (entry.index, sample) in known:
                    right, loss = known[(entry.index, sample)]
                else:
                    right, loss = score(entry, sample)
                    if on_score is not None:
                        on_score(entry, sample, right, loss)
                forwards += 1  # a served score was a forward of the run it came from
                entry.right.append(float(right))
                entry.loss.append(float(loss))
        before = seen
    winner = min(alive, key=lambda e: (e.key(before), e.index))
    return RaceResult(entries, winner, forwards, stopped)


def _rungs(candidates: int, config: RacingConfig) -> list[tuple[int, int]]:
    return RacingConfig(candidates - 1, config.samples, config.first, config.seed).rungs()
