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

``--selection-rule accuracy`` (the racing profile's) chooses differently: every validation prompt weighs the
same (not the fitness's role weights), and the most accurate candidate wins once the doubling is done; only an
exact tie goes to the preference. The race's finalists are few and already survived a race, and on SmolLM2 the
two-standard-error rule kept the plain model against a race winner that gained +10.0 [+4.2, +15.8] on 150
held-out samples (results/racing_smollm2_seed4): a lead of +5 points on 80 prompts is within two standard
errors, and 230 paired samples a candidate would be needed to resolve it.

Scores are kept as the held-out tables keep theirs (:class:`~lpes_harness.evaluation.score_cache.ScoreCache`,
one file per condition under ``validation/``): a killed selection resumes, and a round with more
samples scores only the new ones.

:func:`validation_stage` is the run's stage: the candidates (:func:`candidates`), the choice, and the run's
curve written as ``scales.json``, named for what it is (:func:`row_name`: a per-layer curve is ``LPES``; a
uniform winner is named for its factor with ``(PI)``, never LPES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from lpes_harness.methods.setup import MethodSetup
from lpes_harness.core.scaling import SCALINGS
from lpes_harness.evaluation.conditions import Condition
from lpes_harness.search.condition_fitness import combine_conditions
from lpes_harness.search.fitness import combine
from lpes_harness.search.run_context import Run
from lpes_harness.search.run_record import SELECTION_FILE
from lpes_harness.search.sweep import Swept, uniform_label

NO_CURVE_WON = "no per-layer curve beat the uniform start"
SELECTION_RULES = ("two-se", "accuracy")  # --selection-rule; the first is the default
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


def select(score: Callable[[ValidationCondition, Mapping[str, MethodSetup], int], Mapping[str, Mapping[int, list]]],
           conditions: Sequence[ValidationCondition], candidates: Sequence[Candidate], *,
           initial: int, maximum: int, objective: str = "mean", forwards_at_most: int | None = None,
           rule: str = "two-se") -> dict:
    """Choose among ``candidates`` on validation samples; see the module docstring.

    ``score(condition, {label: MethodSetup}, n)`` (each candidate's scales) returns
    ``{label: {percent: [n scores]}}``, the first ``n`` validation samples of every gold position of
    the condition (cached, so a larger ``n`` scores only the new ones). Returns the choice, every round and every candidate's validation
    fitness and role scores (JSON-serialisable).

    ``forwards_at_most``: what ``--time-budget`` planned the validation at. A round that would score past
    it is not started, and a tie left there is decided as one left at the maximum. The first round
    always runs: every candidate needs a score.

    ``rule``: ``two-se`` keeps a uniform candidate against a lead within two standard errors; ``accuracy``
    takes the leader's point estimate (an exact tie still goes to the uniform candidate).
    """
    if rule not in SELECTION_RULES:
        raise ValueError(f"selection rule {rule!r} is not one of {', '.join(SELECTION_RULES)}")
    if not candidates:
        raise ValueError("nothing to select from")
    if not 1 <= initial <= maximum:
        raise ValueError(f"validation samples: need 1 <= initial ({initial}) <= maximum ({maximum})")
    positions = gold_positions(conditions)
    n, contenders, rounds = initial, list(candidates), []
    forwards, stopped = len(contenders) * n * positions, None
    while True:
        for condition in conditions:
            scored = score(condition, {c.label: MethodSetup.of_scales(c.scales) for c in contenders}, n)
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
    # two-se: a lead still within two standard errors at the maximum is a tie the data leave, decided by the
    # preference, a uniform factor before a per-layer curve, not the leader's point estimate. accuracy: the
    # leader (whose key already puts a uniform candidate first among exact ties).
    chosen = leader if rule == "accuracy" else max(
        [leader, *close], key=lambda c: (c.is_uniform, values[c.label],
                                         -math.inf if c.search_fitness is None else c.search_fitness))
    if chosen is not leader:
        message = (f"{NO_CURVE_WON} by more than two standard errors ({leader.label} led {chosen.label} by "
                   f"{values[leader.label] - values[chosen.label]:.4f} on {n} samples per position"
                   + ("; --time-budget stopped the validation there" if stopped else "") + ")")
    else:
        message = NO_CURVE_WON if leader.is_uniform else "a per-layer curve won on the validation samples"
        if rule == "accuracy" and close:  # said, so that a reader does not take the lead for a resolved one
            message += (f" (the most accurate, --selection-rule accuracy; within two standard errors of "
                        f"{', '.join(c.label for c in close)} on {n} samples per position)")
    return {
        "chosen": chosen.label,
        "chosen_kind": chosen.kind,
        "message": message,
        "objective": objective,
        "rule": rule,
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


def samples_factor(args) -> int:
    """How far a tie may double the validation's samples: 4x under ``two-se``; none under ``accuracy``, whose
    choice is the point estimate of one round, so that its cost is known before it runs."""
    return 1 if getattr(args, "selection_rule", SELECTION_RULES[0]) == "accuracy" else MAX_SAMPLES_FACTOR


def validation_forwards(args, positions: int) -> int:
    """The forwards the honest choice is planned at (``--validation-samples``): every candidate (the
    ``--select-top`` individuals, the start, the sweep's best and ``uniform.json``) on N samples per position,
    and (``two-se``) two of them doubled twice, to the 4N a lead within two standard errors can reach."""
    if not args.validation_samples:
        return 0
    doubled = 2 * (samples_factor(args) - 1)
    return (args.select_top + 3 + doubled) * args.validation_samples * positions


def validation_forwards_at_most(args, positions: int) -> int:
    """The validation's worst case: every candidate stays within two standard errors of the leader to the
    last round, 4N samples per position (:func:`select` doubles N twice; one round under ``accuracy``)."""
    if not args.validation_samples:
        return 0
    return (args.select_top + 3) * samples_factor(args) * args.validation_samples * positions


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

    def score(condition: ValidationCondition, methods: Mapping[str, MethodSetup], n: int):
        cache = ScoreCache(output / slug(condition.name) / CACHE_FILE, identity(condition))
        cache.path.parent.mkdir(parents=True, exist_ok=True)
        scored = score_methods(lm, condition.task, methods, num_samples=n, split="validation",
                               metadata=condition.metadata, chat_template=condition.chat_template, mode=condition.mode,
                               cache=cache, progress=progress, batch_size=batch_size)
        wanted = {p for ps in condition.positions.values() for p in ps}
        return {label: {p: s for p, s in by_percent.items() if p in wanted}
                for label, by_percent in scored["scores"].items()}

    return score


# ----------------------------------------------------------------------------- the run's validation stage


def validation_stage(run: Run, sweep: Swept | None, history: Sequence[dict], tuned: dict | None,
                     result: dict) -> Candidate:
    """The run's curve: with ``--validation-samples``, the best on the validation split of the search's top
    individuals, its start, the sweep's complete points and the uniform stage's best (``tuned``); without,
    the search's best. Writes ``selection.json`` (and score caches under ``validation/``), then
    ``scales.json`` and ``curve.png`` as the run's curve, named for what it is; adds ``selection`` and
    ``chosen`` to ``result`` and the validation's forwards (at most) to ``run.forwards``."""
    args, spec, conditions, configs = run.args, run.spec, run.conditions, run.configs
    validated = bool(args.validation_samples)
    if validated:
        uniforms = [p for p in (sweep.points if sweep else []) if not (p.get("info") or {}).get("raced")]
        uniforms += [tuned] if tuned else []
        start = next((r for r in history if r.get("origin") == "initial"), None)
        if start is not None:
            uniforms.insert(0, {"label": _uniform_label_of(start["scales"], spec, args.scaling), "scales": start["scales"],
                                "fitness": start["fitness"]})
        pool = candidates(history, uniforms, spec, args.scaling, args.select_top)
        # A budgeted run planned the validation at this many forwards, and its deadline counted on it.
        planned = (validation_forwards(args, gold_positions([configs[c.name] for c in conditions]))
                   if args.time_budget_seconds else None)
        selection = select_stage(run.output, run.lm, conditions, configs, pool, initial=args.validation_samples,
                                 maximum=samples_factor(args) * args.validation_samples, objective=args.condition_objective,
                                 identity=lambda c: _validation_identity(c, args), forwards_at_most=planned,
                                 rule=args.selection_rule)
        chosen = next(c for c in pool if c.label == selection["chosen"])
        run.forwards["validation (at most)"] = sum(
            row["samples_per_position"] * sum(map(len, configs[c.name].positions.values()))
            for row in selection["candidates"] for c in conditions)
        result["selection"] = {k: selection[k] for k in ("chosen", "chosen_kind", "message")}
    else:
        chosen = candidates(history, [], spec, args.scaling, 1)[0]
        if chosen.is_uniform:
            print(f"the search's best is a uniform factor: {NO_CURVE_WON}", flush=True)
    _write_chosen(run.output, chosen, spec, args, run.model_name, validated=validated)
    plot_chosen(run.output, chosen, spec, args.scaling, validated=validated)
    result["chosen"] = {"label": chosen.label, "kind": chosen.kind, "row": row_name(chosen.label, chosen.kind),
                        "search_fitness": chosen.search_fitness}
    return chosen


def candidates(history: Sequence[dict], uniforms: Sequence[dict], spec, scaling: str, top: int,
               decimals: int = 6) -> list[Candidate]:
    """The search's ``top`` distinct individuals, then the uniform points given (the start, the
    sweep's best, the tuned best), each once; a uniform individual is named as a uniform factor."""
    out, seen = [], set()

    def add(candidate: Candidate) -> None:
        key = tuple(round(float(s), decimals) for s in candidate.scales)
        if key not in seen:
            seen.add(key)
            out.append(candidate)

    by_scales = {tuple(round(float(s), decimals) for s in p["scales"]): p for p in uniforms}
    for record in top_individuals(history, top, decimals):
        key = tuple(round(float(s), decimals) for s in record["scales"])
        if SCALINGS[scaling].uniform_factor(record["scales"], spec.held_layers, spec.position_held_layers) is not None:
            point = by_scales.get(key)
            label = point["label"] if point else _uniform_label_of(record["scales"], spec, scaling)
            add(Candidate(label, list(record["scales"]), "uniform", record["fitness"], record.get("genome")))
        else:
            add(Candidate(f"LPES #{record['index']}", list(record["scales"]), "curve", record["fitness"],
                          record.get("genome")))
    for point in uniforms:
        add(Candidate(point["label"], list(point["scales"]), "uniform", point.get("fitness")))
    return out


def _uniform_label_of(scales: Sequence[float], spec, scaling: str) -> str:
    moved = [[i for i in range(spec.num_layers) if i not in half.held_layers] for half in spec.halves()]
    values = [scales[k * spec.num_layers + half[0]] for k, half in enumerate(moved)]
    for index, axis in enumerate(SCALINGS[scaling].axes):  # one axis moved alone: named for it
        if all(v == 1.0 for k, v in enumerate(values) if k != index):
            return uniform_label(axis, values[index], scaling)
    return "uniform " + ":".join(f"{v:g}" for v in values)


def validation_conditions(conditions: Sequence[Condition], configs, rule: str = "two-se") -> list[ValidationCondition]:
    """The conditions as the validation scores them: the fitness's weights, or under the ``accuracy`` rule every
    prompt alike (a role weighs its count of gold positions, and the roles' means combine as plain sums)."""
    out = []
    for c in conditions:
        config = configs[c.name]
        positions = {r: tuple(p) for r, p in config.positions.items()}
        weights, objective = dict(config.weights), config.objective
        if rule == "accuracy":
            total = sum(len(p) for p in positions.values())
            weights, objective = {r: len(p) / total for r, p in positions.items()}, "weighted"
        out.append(ValidationCondition(name=c.name, task=c.task, metadata=dict(c.metadata),
                                       chat_template=config.chat_template, weights=weights, positions=positions,
                                       objective=objective, mode=config.fitness))
    return out


def select_stage(output: Path, lm, conditions: Sequence[Condition], configs, pool: Sequence[Candidate], *,
                 initial: int, maximum: int, objective: str, identity, forwards_at_most: int | None = None,
                 rule: str = "two-se") -> dict:
    """Stage 2: ``selection.json``; the caller writes the winner as ``scales.json``."""
    from lpes_harness.evaluation.paired import sample_bar
    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.search.selection import cached_scorer

    how = (f"more (up to {maximum}) while the data leave a tie" if maximum > initial
           else f"the most accurate chosen (--selection-rule {rule})")
    print(f"validation: {len(pool)} candidates ({', '.join(c.label for c in pool)}) on {initial} validation samples "
          f"per position of {len(conditions)} condition(s), {how}", flush=True)
    with sample_bar(0) as progress:
        batch_size = next(iter(configs.values())).batch_size  # the search's own (a number once resolved)
        score = cached_scorer(lm, output / "validation", identity, progress, batch_size)
        result = select(score, validation_conditions(conditions, configs, rule), pool, initial=initial,
                        maximum=maximum, objective=objective, forwards_at_most=forwards_at_most, rule=rule)
    atomic_write_json(output / SELECTION_FILE, result, indent=1)
    first = result["rounds"][0]["samples_per_position"]
    for row in result["candidates"]:
        more = (f"; {row['validation_fitness']:.4f} on {row['samples_per_position']}"
                if row["samples_per_position"] != first else "")
        search = "" if row["search_fitness"] is None else f" (search fitness {row['search_fitness']:.4f})"
        print(f"  {row['label']}: validation fitness {row['validation_fitness_first']:.4f} on {first} samples per "
              f"position{more}{search}", flush=True)
    if result["stopped_by_budget"]:
        print(f"  {result['stopped_by_budget']}", flush=True)
    print(f"the run's curve: {result['chosen']}: {result['message']}", flush=True)
    return result


def _validation_identity(condition: Condition, args) -> dict:
    from lpes_harness.evaluation.paired import cache_identity

    identity = cache_identity(condition.task, condition.metadata, condition.chat_template, args.pretrained,
                              args.dtype_chosen, args.scaling)
    return {**identity, "split": "validation"}


def row_name(label: str, kind: str) -> str:
    """What a table calls the run's curve: ``LPES`` for a per-layer curve; a uniform factor is PI
    (the table of methods' labels)."""
    from lpes_harness.methods import METHODS

    return METHODS["lpes"].label if kind == "curve" else f"{label} ({METHODS['pi'].label})"


def _write_chosen(output: Path, chosen: Candidate, spec, args, model: str, validated: bool) -> None:
    from lpes_harness.core.scales_file import write_scales_file

    extra = {"control_points": chosen.genome} if chosen.genome and not chosen.is_uniform else {}
    write_scales_file(output / "scales.json", chosen.scales, scaling=args.scaling,
                      curve="uniform" if chosen.is_uniform else ("per-layer" if spec.brute_force else spec.curve),
                      label=chosen.label, row=row_name(chosen.label, chosen.kind),
                      chosen_by="validation split" if validated else "search fitness",
                      fitness=chosen.search_fitness, model=model, dtype=args.dtype_chosen, **extra)


def plot_chosen(output: Path, chosen: Candidate, spec, scaling: str, validated: bool) -> None:
    """``curve.png`` redrawn as the run's curve: during the search it showed each generation's best,
    which the validation may not have chosen (a uniform factor has no control points to draw)."""
    from lpes_harness.search.curve_plot import plot_curve

    genome = None if chosen.is_uniform or not chosen.genome else chosen.genome
    how = "chosen on the validation split" if validated else "the search's best"
    title = f"the run's curve, {how}: {row_name(chosen.label, chosen.kind)}"
    if chosen.label not in title:  # "LPES (LPES #14)": which individual; a uniform row already names its factor
        title += f" ({chosen.label})"
    if chosen.is_uniform:
        title += f"\n{NO_CURVE_WON}"
    plot_curve(output / "curve.png", spec, genome, chosen.scales, title=title, scaling=scaling)
