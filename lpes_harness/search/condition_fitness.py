"""Fitness over several conditions: one curve for the range of inputs a user sends.

A curve searched at one prompt length fits that length (SmolLM2's reference curve: +17.6 points
at the searched ~1k tokens, +7.6 at twice that, -1.0 at four times). A search over conditions
(``lpes-search --condition NAME={json} ...``, :mod:`lpes_harness.evaluation.conditions`) scores every
individual on the same samples of each condition, each condition's fitness the usual
λ-weighted role scores (:mod:`lpes_harness.search.fitness`), and combines them by
``--condition-objective``:

- ``mean`` (default): the mean over conditions;
- ``worst``: the lowest condition, so no condition is traded away for another.

Both are non-decreasing in every sample's score, so racing stays exact: groups of samples (a
condition's role) are scored heaviest first, conditions interleaved, and an individual stops
once even perfect scores on its unscored samples could not reach the selection threshold.

``info`` of an evaluation: ``scores`` (condition -> its fitness, a bound when raced),
``conditions`` (condition -> its role scores and sample counts), ``samples``, ``raced``.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Mapping, Sequence

from lpes_harness.evaluation.conditions import apply_chat_template
from lpes_harness.lmeval.position_scorer import max_sample_score
from lpes_harness.search.fitness import FITNESS_DECIMALS, ROLES, FitnessConfig, LMEvalFitness, combine, raced_groups
from lpes_harness.search.sample_order import HardestFirst

CONDITION_OBJECTIVES = ("mean", "worst")


def combine_conditions(values: Mapping[str, float], objective: str = "mean") -> float:
    """The search's fitness from the conditions' own: their mean, or the worst."""
    if objective not in CONDITION_OBJECTIVES:
        raise ValueError(f"condition objective {objective!r} is not one of {', '.join(CONDITION_OBJECTIVES)}")
    values = list(values.values())
    return min(values) if objective == "worst" else round(sum(values) / len(values), FITNESS_DECIMALS)


class ConditionsFitness:
    """``evaluate(scales, threshold=None) -> (fitness, info)`` over named conditions.

    ``configs``: condition name -> its :class:`FitnessConfig` (task, options, samples, weights,
    role objective); one loaded ``lpes_hf`` scores them all. ``split``: ``search`` for the
    fitness, ``validation`` for the final choice (:mod:`lpes_harness.search.selection`).
    Samples are addressed by group, ``(condition, role)``: ``sizes`` and ``score_samples``
    as :class:`LMEvalFitness` has them by role.
    """

    def __init__(self, lm, configs: Mapping[str, FitnessConfig], objective: str = "mean", split: str = "search"):
        if not configs:
            raise ValueError("a conditions fitness needs at least one condition")
        combine_conditions({name: 0.0 for name in configs}, objective)  # the objective is checked now
        self.lm, self.configs, self.objective, self.split = lm, dict(configs), objective, split
        # The parts only score samples; the order is this object's, over all conditions' groups.
        self.parts = {name: LMEvalFitness(lm, replace(config, sample_order="roles"), split=split)
                      for name, config in self.configs.items()}
        self.sizes = {(name, role): n for name, part in self.parts.items() for role, n in part.sizes.items()}
        first = next(iter(self.configs.values()))
        self.hardest = None
        if first.sample_order == "hardest":
            drop = {g: self.configs[g[0]].weights[g[1]] / max(n, 1) for g, n in self.sizes.items()}
            self.hardest = HardestFirst(self.sizes, drop, self.order(), max_sample_score(first.fitness))
        self.evaluations = 0

    @property
    def chat_template(self) -> dict[str, bool]:
        return {name: part.chat_template for name, part in self.parts.items()}

    @property
    def samples_scored(self) -> int:
        return sum(part.samples_scored for part in self.parts.values())

    def value(self, means: Mapping[tuple[str, str], float]) -> float:
        """The fitness of groups' mean scores."""
        return combine_conditions(
            {name: combine({role: means[(name, role)] for role in ROLES}, config.weights, config.objective)
             for name, config in self.configs.items()}, self.objective)

    def order(self) -> list[tuple[str, str]]:
        """Heaviest sample first (a short sample of a heavy role lowers the bound most); conditions
        interleaved at equal weight, so ``worst`` sees every condition early."""
        names = list(self.configs)
        return sorted(self.sizes, key=lambda g: (-self.configs[g[0]].weights[g[1]] / self.sizes[g], names.index(g[0])))

    def __call__(self, scales: Sequence[float], threshold: float | None = None) -> tuple[float, dict]:
        started = time.perf_counter()
        first = next(iter(self.configs.values()))
        self.lm.set_scales(list(scales))
        fitness, totals, done, raced = raced_groups(
            self.score_samples, self.sizes, self.value, self.order(),
            chunk_size=first.chunk_size,
            threshold=-math.inf if threshold is None or not first.racing else threshold,
            max_score=max_sample_score(first.fitness),
            sample_order=self.hardest.order() if self.hardest else None,
        )
        self.evaluations += 1
        return fitness, self.info(totals, done, raced, time.perf_counter() - started)

    def info(self, totals: Mapping, done: Mapping, raced: bool, seconds: float = 0.0) -> dict:
        best = max_sample_score(next(iter(self.configs.values())).fitness)
        conditions, scores = {}, {}
        for name, config in self.configs.items():
            roles = {role: totals[(name, role)] / done[(name, role)] if done[(name, role)] else None for role in ROLES}
            bound = {role: (totals[(name, role)] + (self.sizes[(name, role)] - done[(name, role)]) * best)
                     / self.sizes[(name, role)] for role in ROLES}
            scores[name] = combine(bound, config.weights, config.objective)
            conditions[name] = {"scores": roles, "samples": {role: done[(name, role)] for role in ROLES}}
        return {"scores": scores, "conditions": conditions, "objective": self.objective,
                "samples": sum(done.values()), "samples_total": sum(self.sizes.values()), "raced": raced,
                "mode": next(iter(self.configs.values())).fitness, "eval_seconds": round(seconds, 3)}

    def score_samples(self, group: tuple[str, str], indices: Sequence[int]) -> list[float]:
        """The scores of samples ``indices`` of one condition's role, with the scales set now."""
        name, role = group
        scores = self.parts[name].score_samples(role, indices)
        if self.hardest:
            self.hardest.record(group, indices, scores)
        return scores


def condition_configs(conditions, base: FitnessConfig) -> dict[str, FitnessConfig]:
    """One :class:`FitnessConfig` per :class:`~lpes_harness.evaluation.conditions.Condition`: the run's
    fitness settings with the condition's task, options and chat template."""
    from dataclasses import replace

    configs = {}
    for condition in conditions:
        positions = base.positions if condition.task == base.task else None  # another task: its own roles
        configs[condition.name] = replace(base, task=condition.task, metadata=dict(condition.metadata),
                                          chat_template=apply_chat_template(condition.chat_template), positions=positions)
    return configs
