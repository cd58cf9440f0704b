"""Honest selection: the search's final curve is chosen on samples its fitness never saw.

The genetic search ranks individuals on a few search samples per position; its best is the one
that was luckiest there as much as the best (on Gemma-3, seed 1's curve was a generation-0 mutant
that beat the uniform start by 2 of 48 samples, and tied with it, 6 gained and 6 lost, on 1,000
held-out ones). So after the search, the top few distinct individuals, the uniform start and the
best uniform factor are re-scored on the ``validation`` split (disjoint from the search and
held-out samples, :func:`lpes_harness.tasks.position.sample_indices`) of every condition, with
the search's own fitness, and the best there is the run's curve.

**Ties are broken by data, not by order.** Every candidate is scored on the same samples. While
another candidate is within two standard errors of the leader (the paired difference of their
per-sample scores, each weighted as the fitness weighs its role and condition), the contenders
draw twice the samples, up to ``maximum`` per position; near the ceiling, where few samples
differ, that is where more samples are drawn. Only a tie left at the maximum (an exact tie, or a
lead still within two standard errors) is decided by preference: a uniform factor before a
per-layer curve (fewer degrees of freedom), then the higher validation, then search fitness.
When a uniform candidate wins, the run says so (:data:`NO_CURVE_WON`), and its rows are named PI,
not LPES.

Scores are kept as the held-out tables keep theirs (:class:`~lpes_harness.evaluation.score_cache.ScoreCache`,
one file per condition under ``validation/``): a killed selection resumes, and a round with more
samples scores only the new ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from lpes_harness.search.condition_fitness import combine_conditions
from lpes_harness.search.fitness import combine

NO_CURVE_WON = "no per-layer curve beat the uniform start"
MAX_SAMPLES_FACTOR = 4  # a tie draws up to the first round's samples doubled twice


@dataclass
class Candidate:
    """One curve the final choice considers."""

    label: str  # "LPES #17" (its history index), "uniform 0.8" ...
    scales: list[float]
    kind: str  # "curve" or "uniform"
    search_fitness: float | None = None
    genome: list | None = None
    scores: dict = field(default_factory=dict)  # condition -> gold percent -> validation scores, in sample order

    @property
    def is_uniform(self) -> bool:
        return self.kind == "uniform"


def top_individuals(records: Sequence[dict], count: int, decimals: int = 6) -> list[dict]:
    """The ``count`` fittest distinct complete individuals of a search's history (a raced one has
    only a bound); of equal scales the first is kept."""
    seen, top = set(), []
    complete = [r for r in records if not (r.get("info") or {}).get("raced")]
    for record in sorted(complete, key=lambda r: (-r["fitness"], r["index"])):
        key = tuple(round(float(s), decimals) for s in record["scales"])
        if key not in seen:
            seen.add(key)
            top.append(record)
        if len(top) == count:
            break
    return top


@dataclass(frozen=True)
class ValidationCondition:
    """What the validation scores on one condition: its task and options, and its fitness settings."""

    name: str
    task: str
    metadata: dict
    chat_template: bool | None
    weights: Mapping[str, float]
    positions: Mapping[str, Sequence[int]]  # role -> gold percents
    objective: str = "weighted"
    mode: str = "greedy"


def value(conditions: Sequence[ValidationCondition], candidate: Candidate, n: int, objective: str) -> float:
    """The search's fitness of ``candidate`` on the first ``n`` validation samples of each position."""
    per_condition = {}
    for condition in conditions:
        means = {}
        for role, percents in condition.positions.items():
            pooled = [s for p in percents for s in candidate.scores[condition.name][p][:n]]
            means[role] = sum(pooled) / len(pooled)
        per_condition[condition.name] = combine(means, condition.weights, condition.objective)
    return combine_conditions(per_condition, objective)


def paired_gap(conditions: Sequence[ValidationCondition], leader: Candidate, other: Candidate, n: int) -> tuple[float, float]:
    """The leader's lead over ``other`` on the first ``n`` samples of each position and its standard
    error, with each role of each condition weighted as a ``mean`` fitness weighs it (λ_r / Σλ / C)."""
    lead, variance = 0.0, 0.0
    for condition in conditions:
        total = sum(condition.weights.values())
        for role, percents in condition.positions.items():
            weight = condition.weights[role] / total / len(conditions)
            diffs = [a - b for p in percents for a, b in zip(leader.scores[condition.name][p][:n],
                                                            other.scores[condition.name][p][:n])]
            mean = sum(diffs) / len(diffs)
            lead += weight * mean
            if len(diffs) > 1:
                variance += weight ** 2 * sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs)
    return lead, math.sqrt(variance)


def is_close(lead: float, error: float) -> bool:
    """A lead the data do not resolve: within two standard errors, or none at all."""
    return lead <= 2 * error


def select(score: Callable[[ValidationCondition, Mapping[str, Sequence[float]], int], Mapping[str, Mapping[int, list]]],
           conditions: Sequence[ValidationCondition], candidates: Sequence[Candidate], *,
           initial: int, maximum: int, objective: str = "mean", forwards_at_most: int | None = None) -> dict:
    """Choose among ``candidates`` on validation samples; see the module docstring.

    ``score(condition, {label: scales}, n)`` returns ``{label: {percent: [n scores]}}``, the first
    ``n`` validation samples of every gold position of the condition (cached, so a larger ``n``
    scores only the new ones). Returns the choice, every round and every candidate's validation
    fitness and role scores (JSON-serialisable).

    ``forwards_at_most``: what ``--time-budget`` planned the validation at. A round that would score past
    it is not started, and a tie left there is decided as one left at the maximum. The first round
    always runs: every candidate needs a score.
    """
    if not candidates:
        raise ValueError("nothing to select from")
    if not 1 <= initial <= maximum:
        raise ValueError(f"validation samples: need 1 <= initial ({initial}) <= maximum ({maximum})")
    positions = gold_positions(conditions)
    n, contenders, rounds = initial, list(candidates), []
    forwards, stopped = len(contenders) * n * positions, None
    while True:
        for condition in conditions:
            scored = score(condition, {c.label: c.scales for c in contenders}, n)
            for c in contenders:
                c.scores[condition.name] = {int(p): list(s) for p, s in scored[c.label].items()}
        values = {c.label: value(conditions, c, n, objective) for c in contenders}
        leader = max(contenders, key=lambda c: (values[c.label], c.is_uniform, -math.inf if c.search_fitness is None
                                                else c.search_fitness))
        close = [c for c in contenders if c is not leader and is_close(*paired_gap(conditions, leader, c, n))]
        rounds.append({"samples_per_position": n, "validation_fitness": values, "leader": leader.label,
                       "unresolved": [c.label for c in close]})
        if not close or n >= maximum:
            break
        more = min(2 * n, maximum)
        cost = (1 + len(close)) * (more - n) * positions  # the cache scores only the new samples
        if forwards_at_most is not None and forwards + cost > forwards_at_most:
            stopped = (f"--time-budget planned the validation at {forwards_at_most} forwards; {n} samples per "
                       f"position took {forwards}, and {more} would take {cost} more")
            break
        contenders, n, forwards = [leader, *close], more, forwards + cost
    # A lead still within two standard errors at the maximum is a tie the data leave: the preference
    # decides it, a uniform factor before a per-layer curve, not the leader's point estimate.
    chosen = max([leader, *close], key=lambda c: (c.is_uniform, values[c.label],
                                                   -math.inf if c.search_fitness is None else c.search_fitness))
    if chosen is not leader:
        message = (f"{NO_CURVE_WON} by more than two standard errors ({leader.label} led {chosen.label} by "
                   f"{values[leader.label] - values[chosen.label]:.4f} on {n} samples per position"
                   + ("; --time-budget stopped the validation there" if stopped else "") + ")")
    else:
        message = NO_CURVE_WON if leader.is_uniform else "a per-layer curve won on the validation samples"
    return {
        "chosen": chosen.label,
        "chosen_kind": chosen.kind,
        "message": message,
        "objective": objective,
        "rounds": rounds,
        "forwards_at_most": forwards_at_most,
        "stopped_by_budget": stopped,
        "candidates": [{**_summary(conditions, c, objective),
                        "validation_fitness_first": rounds[0]["validation_fitness"][c.label]} for c in candidates],
    }


def gold_positions(conditions) -> int:
    """Gold positions over ``conditions`` (anything with a role -> percents ``positions``): the forwards one
    candidate costs per sample per position."""
    return sum(len({p for ps in c.positions.values() for p in ps}) for c in conditions)


def validation_forwards(args, positions: int) -> int:
    """The forwards the honest choice is planned at (``--validation-samples``): every candidate (the
    ``--select-top`` individuals, the start, the sweep's best and ``uniform.json``) on N samples per position,
    and two of them doubled twice, to the 4N a lead within two standard errors can reach."""
    if not args.validation_samples:
        return 0
    return (args.select_top + 3 + 2 * (MAX_SAMPLES_FACTOR - 1)) * args.validation_samples * positions


def validation_forwards_at_most(args, positions: int) -> int:
    """The validation's worst case: every candidate stays within two standard errors of the leader to the
    last round, 4N samples per position (:func:`select` doubles N twice)."""
    if not args.validation_samples:
        return 0
    return (args.select_top + 3) * MAX_SAMPLES_FACTOR * args.validation_samples * positions


def _summary(conditions: Sequence[ValidationCondition], c: Candidate, objective: str) -> dict:
    n = min(len(s) for per in c.scores.values() for s in per.values())
    roles = {condition.name: {role: sum(s for p in ps for s in c.scores[condition.name][p][:n]) / (n * len(ps))
                              for role, ps in condition.positions.items()} for condition in conditions}
    return {"label": c.label, "kind": c.kind, "search_fitness": c.search_fitness, "scales": c.scales,
            "genome": c.genome, "samples_per_position": n, "validation_fitness": value(conditions, c, n, objective),
            "conditions": roles}


def cached_scorer(lm, output: Path, identity: Callable[[ValidationCondition], dict], progress=None, batch_size=1):
    """The ``score`` of :func:`select`: lpes_hf on the validation split, one score cache per condition
    (``output/<condition>/scores.cache.json``), ``batch_size`` prompts per forward as the search's."""
    from lpes_harness.evaluation.conditions import slug
    from lpes_harness.evaluation.paired import CACHE_FILE, score_methods
    from lpes_harness.evaluation.score_cache import ScoreCache

    def score(condition: ValidationCondition, methods: Mapping[str, Sequence[float]], n: int):
        cache = ScoreCache(output / slug(condition.name) / CACHE_FILE, identity(condition))
        cache.path.parent.mkdir(parents=True, exist_ok=True)
        scored = score_methods(lm, condition.task, methods, num_samples=n, split="validation",
                               metadata=condition.metadata, chat_template=condition.chat_template, mode=condition.mode,
                               cache=cache, progress=progress, batch_size=batch_size)
        wanted = {p for ps in condition.positions.values() for p in ps}
        return {label: {p: s for p, s in by_percent.items() if p in wanted}
                for label, by_percent in scored["scores"].items()}

    return score
