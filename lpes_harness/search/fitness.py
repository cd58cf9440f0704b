"""Fitness: layer scales -> lm-eval on the position tasks -> the λ-weighted score.

    fitness = λ_B·score(begin) + λ_M·score(middle) + λ_E·score(end)

on the ``search`` split of a position task (``multi_needle``, ``kv_retrieval``, ``mdqa``, ``needle``
or a user's own; each declares which gold positions are begin, middle and end), evaluated in-process on one loaded
``lpes_hf`` whose scales are changed in place (the model is never reloaded).

How one sample is scored (``fitness``: greedy, generate, logprob, tiebreak; ``scorer``:
answer-logits or lm-eval) is :mod:`lpes_harness.lmeval.position_scorer`'s business; the search
sees per-sample scores only. On tens of samples greedy fitness ties often, and a tie is
otherwise decided by evaluation order: ``tiebreak`` breaks it by confidence.

**Objective** (``objective``): how the role scores combine. ``weighted`` (default) is the
formula above. ``ranked`` hands the same weights out by rank instead of by role: the largest
λ to the worst-off role, the smallest to the best (0.5 / 0.3 / 0.2 by default). By the
rearrangement inequality that is the smallest λ-weighted sum over every way of assigning the
weights, so a curve cannot buy a higher score at one position with a collapse at another (the
hand-made ramp of issue #12 did exactly that). Both are non-decreasing in every role's score,
which is all racing needs.

**Racing.** Samples are scored in chunks, the most heavily weighted position first. After each
chunk the best fitness still reachable (every unscored sample at its maximum score) is
known exactly; once it falls below the selection threshold the loop passes in (the
score a new individual must beat to become a parent), scoring stops and that bound is
returned. The bound is below the threshold, and thresholds only grow, so racing never
changes which individuals are selected; ``info["raced"]`` marks such results. The bound is
exact in any order, so ``sample_order="hardest"`` (the samples earlier individuals got wrong
first, :mod:`lpes_harness.search.sample_order`) changes only the forwards racing saves.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from lpes_harness.lmeval.position_scorer import MODES, SCORERS, TIEBREAK_EPS, PositionScorer, max_sample_score
from lpes_harness.search.sample_order import SAMPLE_ORDERS, HardestFirst

ROLES = ("begin", "middle", "end")
DEFAULT_WEIGHTS = {"begin": 0.2, "middle": 0.3, "end": 0.5}
OBJECTIVES = ("weighted", "ranked")
# Fitness is rounded to this many decimals: one score reached by two sums (0.2 + 0.3 * 0.4 + 0.5 against
# 0.2 * 0.95 + 0.3 * 31 / 60 + 0.5 * 0.95) differs in its last bits, and a tie must go to the rule that
# breaks ties (population order, the first found), not to rounding. 12 decimals: far below one sample's
# weight (0.5 / 1,000 samples), far above a float sum's error.
FITNESS_DECIMALS = 12


def combine(means: Mapping[str, float], weights: Mapping[str, float], objective: str = "weighted") -> float:
    """The fitness of per-role mean scores: Σ λ_r·mean_r (``weighted``), or the weights sorted
    from largest to smallest given to the means sorted from worst to best (``ranked``); rounded to
    :data:`FITNESS_DECIMALS`, so equal scores compare equal."""
    if objective == "ranked":
        total = sum(w * m for w, m in zip(sorted(weights.values(), reverse=True), sorted(means.values())))
    elif objective == "weighted":
        total = sum(weights[role] * mean for role, mean in means.items())
    else:
        raise ValueError(f"fitness objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    return round(total, FITNESS_DECIMALS)


# ----------------------------------------------------------------------------- racing core

ScoreChunk = Callable[[Any, Sequence[int]], Sequence[float]]


def raced_fitness(
    score_chunk: ScoreChunk,
    sizes: Mapping[str, int],
    weights: Mapping[str, float],
    *,
    chunk_size: int,
    threshold: float = -math.inf,
    max_score: float = 1.0,
    objective: str = "weighted",
    sample_order: Sequence[tuple[str, int]] | None = None,
) -> tuple[float, dict]:
    """The roles' mean scores combined by ``objective``, stopping early once ``threshold`` is out of reach.

    ``score_chunk(role, indices)`` returns the scores of those samples of that role.
    ``sample_order``: every (role, index) in the order to score them (None: role by role, see
    :func:`roles_order`). Returns ``(fitness, info)``; when raced, ``fitness`` is the upper bound at the stop.
    """
    # Heaviest role first: a sample of role r that falls short of the best score lowers the
    # bound by weight_r / size_r, so scoring the heaviest role first stops a hopeless
    # individual soonest (round-robin would leave the bound high until near the end).
    fitness, totals, done, raced = raced_groups(score_chunk, sizes, lambda means: combine(means, weights, objective),
                                                roles_order(sizes, weights), chunk_size=chunk_size,
                                                threshold=threshold, max_score=max_score, sample_order=sample_order)
    return fitness, _info(totals, done, sizes, raced)


def roles_order(sizes: Mapping[str, int], weights: Mapping[str, float]) -> list[str]:
    """The roles, the largest weight per sample first."""
    return sorted(sizes, key=lambda r: -weights[r] / sizes[r])


def raced_groups(
    score_chunk: ScoreChunk,
    sizes: Mapping[Any, int],
    value: Callable[[Mapping[Any, float]], float],
    order: Sequence[Any],
    *,
    chunk_size: int,
    threshold: float = -math.inf,
    max_score: float = 1.0,
    sample_order: Sequence[tuple[Any, int]] | None = None,
) -> tuple[float, dict, dict, bool]:
    """Racing over groups of samples (a role, or a condition's role): ``value`` of the groups' means.

    Groups are scored in ``order``, ``chunk_size`` samples at a time (or, given ``sample_order``,
    every ``(group, index)``, in that order, ``chunk_size`` at a time, a chunk's samples of one group
    scored together: :mod:`lpes_harness.search.sample_order`); after each chunk the best value still
    reachable (every unscored sample at ``max_score``) is known exactly, since ``value`` is
    non-decreasing in every mean, and scoring stops once it falls below ``threshold``. Returns
    ``(value or its bound, totals, done, raced)``.
    """
    totals = {group: 0.0 for group in sizes}
    done = {group: 0 for group in sizes}

    def bound() -> float:  # every unscored sample at its best: exact once all are scored
        return value({g: (totals[g] + (sizes[g] - done[g]) * max_score) / sizes[g] for g in sizes})

    if sample_order is None:  # group by group: a chunk never spans two groups
        chunks = [[(group, i) for i in range(start, min(start + chunk_size, sizes[group]))]
                  for group in order for start in range(0, sizes[group], chunk_size)]
    else:
        chunks = [sample_order[start : start + chunk_size] for start in range(0, len(sample_order), chunk_size)]
    for chunk in chunks:
        by_group: dict[Any, list[int]] = {}
        for group, index in chunk:
            by_group.setdefault(group, []).append(index)
        for group, indices in by_group.items():
            scores = list(score_chunk(group, indices))
            if len(scores) != len(indices):
                raise RuntimeError(f"scored {len(scores)} samples for {len(indices)} requested ({group})")
            totals[group] += sum(scores)
            done[group] += len(indices)
        upper = bound()
        if upper < threshold:
            return upper, totals, done, True
    return bound(), totals, done, False


def _info(totals, done, sizes, raced: bool) -> dict:
    return {
        "scores": {role: totals[role] / done[role] if done[role] else None for role in sizes},
        "samples": dict(done),
        "samples_total": sum(sizes.values()),
        "raced": raced,
    }


# ----------------------------------------------------------------------------- lm-eval fitness


def task_roles(task_name: str) -> dict[str, tuple[int, ...]]:
    """The fitness roles a registered position task declares: role -> gold percents."""
    from lpes_harness.tasks.position import load_builtin_tasks, resolve_task

    load_builtin_tasks()
    return dict(resolve_task(task_name).roles)


@dataclass
class FitnessConfig:
    task: str = "kv_retrieval"  # any registered position task, or "module:ATTRIBUTE"
    fitness: str = "greedy"  # how a sample is scored: see lmeval.position_scorer.MODES
    objective: str = "weighted"  # see OBJECTIVES and the module docstring
    weights: dict = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    positions: dict | None = None  # role -> gold percent(s); None: the task's declared roles
    metadata: dict = field(default_factory=dict)  # task options (--metadata keys)
    num_samples: int = 200  # per gold position
    chunk_size: int = 25
    racing: bool = True
    scorer: str = "answer-logits"  # one-pass modes only; see SCORERS
    chat_template: bool | None = None  # None: as the task prefers (and the tokenizer has one)
    batch_size: int | str = 1  # prompts per forward of the one-pass scorer; "auto": see answer_logits.resolve_batch_size
    sample_order: str = "roles"  # the order racing scores samples in: see search.sample_order

    def __post_init__(self):
        from lpes_harness.tasks.data import TaskDataError

        if self.fitness not in MODES:
            raise ValueError(f"fitness mode {self.fitness!r} is not one of {', '.join(MODES)}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"fitness objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.sample_order not in SAMPLE_ORDERS:
            raise ValueError(f"sample order {self.sample_order!r} is not one of {', '.join(SAMPLE_ORDERS)}")
        if self.scorer not in SCORERS:
            raise ValueError(f"scorer {self.scorer!r} is not one of {', '.join(SCORERS)}")
        if set(self.weights) != set(ROLES):
            raise ValueError(f"weights need exactly the roles {ROLES}, got {sorted(self.weights)}")
        if any(not math.isfinite(w) or w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise ValueError(f"weights must be finite, >= 0 and not all 0, got {self.weights}")
        try:
            declared = task_roles(self.task)
        except TaskDataError as err:
            raise ValueError(str(err)) from None
        if self.positions is None:
            self.positions = declared
        if set(self.positions) != set(ROLES):
            raise ValueError(f"positions need exactly the roles {ROLES}, got {sorted(self.positions)}")
        self.positions = {role: _percents(value) for role, value in self.positions.items()}
        known = sorted({p for ps in declared.values() for p in ps} | set(_task_positions(self.task)))
        for role, percents in self.positions.items():
            if any(p not in known for p in percents):
                raise ValueError(f"positions: {role}={list(percents)} is not among {self.task}'s positions {known}")
        if self.num_samples < 1 or self.chunk_size < 1:
            raise ValueError("num_samples and chunk_size must be >= 1")
        if self.fitness == "tiebreak":
            check_tiebreak(self.weights, self.num_samples, self.positions, self.objective)
        if self.batch_size != "auto":
            from lpes_harness.lmeval.answer_logits import resolve_batch_size

            self.batch_size = resolve_batch_size(None, self.batch_size)  # lm is only read for "auto"


def check_tiebreak(weights: Mapping[str, float], num_samples: int, positions: Mapping[str, Sequence[int]],
                   objective: str = "weighted") -> None:
    """Refuse ``tiebreak`` settings where confidence could outweigh one sample more or less right.

    Confidence may move fitness by at most TIEBREAK_EPS * sum(λ); one sample of role r moves it
    by λ_r / n_r (``ranked``: by any λ, whichever rank the role takes). The first must stay
    below the second for every weighted role.
    """
    if objective == "ranked":
        step = min(w for w in weights.values() if w > 0) / (num_samples * max(len(p) for p in positions.values()))
    else:
        step = min(w / (num_samples * len(positions[r])) for r, w in weights.items() if w > 0)
    if TIEBREAK_EPS * sum(weights.values()) >= step:
        raise ValueError(f"fitness tiebreak: one sample is worth only {step:.2g} of fitness here, no more than "
                         f"the tie-break ({TIEBREAK_EPS:g} x the weights); use fewer samples or greedy")


def _percents(value) -> tuple[int, ...]:
    return tuple(int(p) for p in value) if isinstance(value, (list, tuple)) else (int(value),)


def _task_positions(task_name: str) -> tuple[int, ...]:
    from lpes_harness.tasks.position import resolve_task

    return resolve_task(task_name).positions


class LMEvalFitness:
    """``evaluate(scales, threshold=None) -> (fitness, info)`` for the search loop.

    Holds one loaded ``lpes_hf`` (an lm-eval HFLM) and a :class:`PositionScorer` over the
    gold positions of the three roles; a role with several positions (``multi_needle``'s
    middle is 25, 50 and 75 %) pools their samples.
    """

    def __init__(self, lm, config: FitnessConfig, task_manager=None, shard: tuple[int, int] = (0, 1), gather=None,
                 split: str = "search"):
        self.lm = lm
        self.config = config
        self.rank, self.world = shard
        # gather(list_of_local_scores) -> list in the global sample order (distributed.py).
        self.gather = gather
        percents = sorted({p for ps in config.positions.values() for p in ps})
        self.scorer = PositionScorer(
            lm, config.task, percents, metadata=config.metadata, split=split, num_samples=config.num_samples,
            mode=config.fitness, scorer=config.scorer, chat_template=config.chat_template, task_manager=task_manager,
            batch_size=config.batch_size,
        )
        # role -> [(percent, sample index)], the role's samples in scoring order
        self.samples = {
            role: [(percent, i) for percent in config.positions[role] for i in range(len(self.scorer.docs[percent]))]
            for role in ROLES
        }
        self.sizes = {role: len(samples) for role, samples in self.samples.items()}
        self.hardest = None
        if config.sample_order == "hardest":
            self.hardest = HardestFirst(self.sizes, {r: config.weights[r] / max(n, 1) for r, n in self.sizes.items()},
                                        roles_order(self.sizes, config.weights), max_sample_score(config.fitness))
        self.evaluations = 0
        self.samples_scored = 0  # forwards of this process: what a search's budget counts

    @property
    def chat_template(self) -> bool:
        return self.scorer.chat_template

    # -- the loop's evaluate -------------------------------------------------------
    def __call__(self, scales: Sequence[float], threshold: float | None = None) -> tuple[float, dict]:
        """The fitness of these layer scales; ``threshold`` (None: none) lets racing stop early."""
        started = time.perf_counter()
        if threshold is None:
            threshold = -math.inf
        self.lm.set_scales(list(scales))
        fitness, info = raced_fitness(
            self.score_chunk,
            self.sizes,
            self.config.weights,
            chunk_size=self.config.chunk_size,
            threshold=threshold if self.config.racing else -math.inf,
            max_score=max_sample_score(self.config.fitness),
            objective=self.config.objective,
            sample_order=self.hardest.order() if self.hardest else None,
        )
        self.evaluations += 1
        info["mode"] = self.config.fitness
        info["eval_seconds"] = round(time.perf_counter() - started, 3)
        return fitness, info

    # -- scoring ---------------------------------------------------------------------
    def score_chunk(self, role: str, indices: Sequence[int]) -> list[float]:
        mine = [i for i in indices if i % self.world == self.rank]
        local = self.score_samples(role, mine)
        scores = local if self.world == 1 else self.gather(indices, mine, local)
        if self.hardest:  # every process records the same (gathered) scores, so they agree on the order
            self.hardest.record(role, indices, scores)
        return scores

    def score_samples(self, role: str, indices: Sequence[int]) -> list[float]:
        """This process's scores of the role's samples ``indices`` (no collective call)."""
        self.samples_scored += len(indices)
        by_percent: dict[int, list[int]] = {}
        for i in indices:
            percent, sample = self.samples[role][i]
            by_percent.setdefault(percent, []).append(sample)
        scored = {}
        for percent, samples in by_percent.items():
            for sample, score in zip(samples, self.scorer.scores(percent, samples)):
                scored[(percent, sample)] = score
        return [scored[self.samples[role][i]] for i in indices]
