"""The order racing scores an individual's samples in: ``roles`` (group by group, heaviest first)
or ``hardest`` (the samples earlier individuals got wrong most often first).

Racing (:func:`lpes_harness.search.fitness.raced_groups`) stops an individual once its best
reachable fitness, every unscored sample at its best score, falls below the selection threshold.
That bound only falls when a sample comes back short of the best score, so an individual that
cannot become a parent is stopped soonest when the samples it is likeliest to get wrong come
first. Those are the samples the earlier individuals got wrong: most individuals of a search are
small moves from the same parents. Samples every individual gets right tell racing nothing, and
under ``roles`` they are scored first: on ``multi_needle`` the end and begin positions, heavy by
weight, are right for nearly every curve, and the middle, where curves differ, comes last.

Why not the samples where individuals *disagree* (issue #46's wording)? Disagreement ranks
individuals; racing needs the bound to fall, and a sample every individual gets wrong lowers it as
surely as one half of them get wrong. Under both rules the order is a heuristic: the bound is
exact in any order, so the individuals selected, and every complete fitness, are the same under
``roles`` and ``hardest``. Only the forwards spent on individuals that racing stops, and the bound
they report, change (``benchmarks/sample_order.py`` measures it).
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

SAMPLE_ORDERS = ("roles", "hardest")


class HardestFirst:
    """Each sample's mean shortfall from the best score over the evaluations that scored it, and the
    order that puts the largest expected fall of the bound first.

    ``drop``: group -> how far one sample's full shortfall lowers the bound (a role's weight over its
    sample count); ``group_order``: the ``roles`` order, which breaks ties, so that before anything is
    scored (every sample at the same prior) the order is ``roles``'s exactly.
    """

    def __init__(self, sizes: Mapping[Hashable, int], drop: Mapping[Hashable, float], group_order: Sequence[Hashable],
                 max_score: float = 1.0):
        self.sizes, self.drop, self.max_score = dict(sizes), dict(drop), max_score
        self.rank = {group: i for i, group in enumerate(group_order)}
        self.shortfall: dict[tuple, float] = {}  # (group, index) -> summed shortfall
        self.seen: dict[tuple, int] = {}  # (group, index) -> evaluations that scored it

    def record(self, group, indices: Sequence[int], scores: Sequence[float]) -> None:
        for index, score in zip(indices, scores):
            key = (group, index)
            self.shortfall[key] = self.shortfall.get(key, 0.0) + (self.max_score - float(score))
            self.seen[key] = self.seen.get(key, 0) + 1

    def state_dict(self) -> dict:
        """The statistics as JSON (a group that is a tuple, a condition's role, becomes a list):
        saved with every journalled evaluation, so that a resumed search orders its samples as the
        uninterrupted one would have."""
        def plain(group):
            return list(group) if isinstance(group, tuple) else group

        return {"samples": [[plain(g), i, self.shortfall[(g, i)], self.seen[(g, i)]] for g, i in self.seen]}

    def load_state_dict(self, state: dict) -> None:
        self.shortfall, self.seen = {}, {}
        for group, index, shortfall, seen in state.get("samples", []):
            key = (tuple(group) if isinstance(group, list) else group, index)
            self.shortfall[key], self.seen[key] = shortfall, seen

    def prior(self) -> float:
        """The mean shortfall of every score recorded so far (0 before any)."""
        seen = sum(self.seen.values())
        return sum(self.shortfall.values()) / seen if seen else 0.0

    def expected_shortfall(self, group, index: int, prior: float | None = None) -> float:
        """The sample's mean shortfall, with one prior evaluation at :meth:`prior`: a sample scored
        once is not trusted as if scored often, and one never scored (racing stopped before it)
        counts as an average sample."""
        key = (group, index)
        prior = self.prior() if prior is None else prior
        return (self.shortfall.get(key, 0.0) + prior) / (self.seen.get(key, 0) + 1)

    def order(self) -> list[tuple]:
        """Every (group, index), the largest expected fall of the bound first."""
        prior = self.prior()
        samples = [(group, i) for group in self.rank for i in range(self.sizes[group])]
        return sorted(samples, key=lambda s: (-self.drop[s[0]] * self.expected_shortfall(*s, prior), self.rank[s[0]], s[1]))


def order_state(fitness) -> dict | None:
    """The statistics of a fitness racing in the hardest order (its ``hardest``), to journal beside
    an evaluation; None in the roles order (nothing to save)."""
    hardest = getattr(fitness, "hardest", None)
    return hardest.state_dict() if hardest else None


def load_order_state(fitness, state: dict | None) -> None:
    """Restore what :func:`order_state` journalled (nothing in the roles order, or without a state)."""
    hardest = getattr(fitness, "hardest", None)
    if hardest and state:
        hardest.load_state_dict(state)
