"""After the genetic search: the best uniform factor on the same budget, the honest choice of the
run's curve on validation samples, and what the tables call each row.

Three stages, each resumable, each writing one file of the run folder:

1. ``uniform.json`` (:mod:`lpes_harness.search.uniform_tuning`): the best single factor of every
   kind the run's scaling expresses, scored with the search's fitness until it has used at
   least the genetic search's forwards (journal: ``uniform_tuning.jsonl``).
2. ``selection.json`` (:mod:`lpes_harness.search.selection`): the top individuals, the uniform
   start, the sweep's best and the tuned uniform factor, re-scored on the validation split of
   every condition (caches under ``validation/``); the winner becomes ``scales.json``.
3. The row names: a per-layer curve is ``LPES``; a uniform winner is named for its factor with
   ``(PI)``, never LPES (:func:`row_name`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lpes_harness.evaluation.conditions import Condition
from lpes_harness.core.scaling import uniform_factor
from lpes_harness.search.selection import (MAX_SAMPLES_FACTOR, NO_CURVE_WON, Candidate, ValidationCondition, select,
                                          gold_positions, top_individuals, validation_forwards)
from lpes_harness.search.uniform_tuning import coarse_to_fine, interleave, tune_uniform

UNIFORM_FILE = "uniform.json"
SELECTION_FILE = "selection.json"
UNIFORM_JOURNAL = "uniform_tuning.jsonl"


def run_conditions(args) -> list[Condition]:
    """The run's conditions: its ``--condition`` list, or the one its ``--task`` and ``--metadata`` make."""
    conditions = getattr(args, "conditions", None)
    if conditions:
        return list(conditions)
    return [Condition(name=args.task, task=args.task, metadata=dict(args.metadata), chat_template=args.chat_template)]


# ----------------------------------------------------------------------------- uniform points


def uniform_label(kind: str, value: float, scaling: str) -> str:
    """``uniform 0.8`` (one scaling), ``uniform position 0.8`` / ``uniform base 2`` (scaling both)."""
    return f"uniform {value:g}" if scaling != "both" else f"uniform {kind} {value:g}"


def uniform_scales(spec, scaling: str, kind: str, value: float) -> list[float]:
    if scaling != "both":
        return spec.uniform(value)
    return spec.uniform_pair(position=value) if kind == "position" else spec.uniform_pair(base=value)


def uniform_grid(spec, scaling: str) -> list[dict]:
    """Every uniform factor on the genome's y grid of each kind, coarse to fine, kinds interleaved."""
    kinds = ("position", "base") if scaling == "both" else (scaling,)
    orders = []
    for kind, half in zip(kinds, spec.halves()):
        values = [half.y_of(j) for j in range(half.y_cells + 1)]
        orders.append([{"label": uniform_label(kind, v, scaling), "kind": kind, "value": v,
                        "scales": uniform_scales(spec, scaling, kind, v)} for v in coarse_to_fine(values)])
    return interleave(*orders)


def forwards_of(records: Sequence[dict]) -> int:
    """The forwards a list of scored records (history lines, sweep points) cost: cache hits none."""
    total = 0
    for record in records:
        if record.get("cached"):
            continue
        samples = (record.get("info") or {}).get("samples", 0)
        total += sum(samples.values()) if isinstance(samples, dict) else int(samples)
    return total


def sweep_points(sweep: dict | None, spec, scaling: str) -> list[dict]:
    """The sweep's points as scored uniform points (label, kind, value, scales, fitness, info, forwards)."""
    points = []
    for point in (sweep or {}).get("points", []):
        kind = point.get("kind", scaling if scaling != "both" else "position")
        points.append({"label": uniform_label(kind, point["scale"], scaling), "kind": kind, "value": point["scale"],
                       "scales": uniform_scales(spec, scaling, kind, point["scale"]), "fitness": point["fitness"],
                       "info": point.get("info"), "forwards": forwards_of([point])})
    return points


def tune_uniform_stage(output: Path, fitness, spec, scaling: str, sweep: dict | None, history: Sequence[dict],
                       model: str, dtype: str | None) -> dict:
    """Stage 1: ``uniform.json``, the best uniform factor with at least the GA's forwards."""
    from lpes_harness.core.scales_file import write_scales_file

    budget = forwards_of(history)
    known = sweep_points(sweep, spec, scaling)

    def report(point):
        info = point.get("info") or {}
        print(f"  {point['label']}: fitness {point['fitness']:.4f}{' (raced out)' if info.get('raced') else ''}",
              flush=True)

    print(f"uniform factors: tuned with the search's fitness until they use the genetic search's {budget} forwards "
          f"(the sweep's {sum(p['forwards'] for p in known)} count)", flush=True)
    result = tune_uniform(fitness, uniform_grid(spec, scaling), budget=budget, forwards=lambda: fitness.samples_scored,
                          known=known, journal=output / UNIFORM_JOURNAL, progress=report)
    best = result["best"]
    write_scales_file(output / UNIFORM_FILE, best["scales"], scaling=scaling, curve="uniform", kind=best["kind"],
                      factor=best["value"], label=best["label"], fitness=best["fitness"],
                      scores=(best.get("info") or {}).get("scores"), model=model, dtype=dtype,
                      tuning={"forwards": result["forwards"], "budget": budget,
                              "points": len(result["points"])})
    # result["forwards"] counts the sweep's points it took as scored; result.json's "uniform" stage does not.
    print(f"best uniform factor: {best['label']} (fitness {best['fitness']:.4f}, {len(result['points'])} factors, "
          f"{result['forwards']} forwards with the sweep's {sum(p['forwards'] for p in known)}, for the GA's {budget}) "
          f"-> {output / UNIFORM_FILE}", flush=True)
    return result


# ----------------------------------------------------------------------------- the choice


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
        if uniform_factor(record["scales"], scaling, spec.held_layers, spec.position_held_layers) is not None:
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
    if scaling != "both":
        return uniform_label(scaling, scales[moved[0][0]], scaling)
    position, base = scales[moved[0][0]], scales[spec.num_layers + moved[1][0]]
    if base == 1.0:
        return uniform_label("position", position, scaling)
    if position == 1.0:
        return uniform_label("base", base, scaling)
    return f"uniform {position:g}:{base:g}"


def validation_conditions(conditions: Sequence[Condition], configs) -> list[ValidationCondition]:
    return [ValidationCondition(name=c.name, task=c.task, metadata=dict(c.metadata),
                                chat_template=configs[c.name].chat_template, weights=dict(configs[c.name].weights),
                                positions={r: tuple(p) for r, p in configs[c.name].positions.items()},
                                objective=configs[c.name].objective, mode=configs[c.name].fitness)
            for c in conditions]


def select_stage(output: Path, lm, conditions: Sequence[Condition], configs, pool: Sequence[Candidate], *,
                 initial: int, maximum: int, objective: str, identity, forwards_at_most: int | None = None) -> dict:
    """Stage 2: ``selection.json``; the caller writes the winner as ``scales.json``."""
    from lpes_harness.evaluation.paired import sample_bar
    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.search.selection import cached_scorer

    print(f"validation: {len(pool)} candidates ({', '.join(c.label for c in pool)}) on {initial} validation samples "
          f"per position of {len(conditions)} condition(s), more (up to {maximum}) while the data leave a tie",
          flush=True)
    with sample_bar(0) as progress:
        batch_size = next(iter(configs.values())).batch_size  # the search's own (a number once resolved)
        score = cached_scorer(lm, output / "validation", identity, progress, batch_size)
        result = select(score, validation_conditions(conditions, configs), pool, initial=initial, maximum=maximum,
                        objective=objective, forwards_at_most=forwards_at_most)
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


def row_name(label: str, kind: str) -> str:
    """What a table calls the run's curve: ``LPES`` for a per-layer curve; a uniform factor is PI
    (the table of methods' labels)."""
    from lpes_harness.methods import METHODS

    return METHODS["lpes"].label if kind == "curve" else f"{label} ({METHODS['pi'].label})"


# ----------------------------------------------------------------------------- the run's end


def finish(lm, args, fitness, spec, conditions: Sequence[Condition], configs, sweep: dict | None, output: Path,
           result: dict) -> Candidate:
    """Stages 1 and 2 after the genetic search, and ``scales.json`` as the run's curve: the validation's
    choice, or without validation the search's best, named for what it is. Adds ``uniform``,
    ``selection``, ``chosen`` and ``forwards`` to ``result``."""
    from lpes_harness.core.files import read_jsonl
    from lpes_harness.evaluation.plots import plot_uniform_points

    history = read_jsonl(output / "history.jsonl")
    swept = sweep_points(sweep, spec, args.scaling)
    forwards = {"sweep": sum(p["forwards"] for p in swept), "search": forwards_of(history)}
    model = args.pretrained or "SmolLM2-135M-Instruct"
    uniforms = [p for p in swept if not (p.get("info") or {}).get("raced")]
    if args.uniform_tuning:
        tuned = tune_uniform_stage(output, fitness, spec, args.scaling, sweep, history, model, args.dtype_chosen)
        best = tuned["best"]
        forwards["uniform"] = tuned["forwards"] - forwards["sweep"]
        result["uniform"] = {k: best[k] for k in ("label", "kind", "value", "fitness", "scales")}
        plot_uniform_points(tuned["points"], output / "uniform.png", chosen=best["label"],
                            title=f"uniform factors, {tuned['forwards']} forwards (the search: {tuned['budget']})")
        uniforms.append(best)
    start = next((r for r in history if r.get("origin") == "initial"), None)
    if start is not None:
        uniforms.insert(0, {"label": _uniform_label_of(start["scales"], spec, args.scaling), "scales": start["scales"],
                            "fitness": start["fitness"]})
    if args.validation_samples:
        pool = candidates(history, uniforms, spec, args.scaling, args.select_top)
        # A budgeted run planned the validation at this many forwards, and its deadline counted on it.
        planned = (validation_forwards(args, gold_positions([configs[c.name] for c in conditions]))
                   if args.time_budget_seconds else None)
        selection = select_stage(output, lm, conditions, configs, pool, initial=args.validation_samples,
                                 maximum=MAX_SAMPLES_FACTOR * args.validation_samples, objective=args.condition_objective,
                                 identity=lambda c: _validation_identity(c, args), forwards_at_most=planned)
        chosen = next(c for c in pool if c.label == selection["chosen"])
        forwards["validation (at most)"] = sum(row["samples_per_position"] * sum(map(len, configs[c.name].positions.values()))
                                               for row in selection["candidates"] for c in conditions)
        result["selection"] = {k: selection[k] for k in ("chosen", "chosen_kind", "message")}
    else:
        chosen = candidates(history, [], spec, args.scaling, 1)[0]
        if chosen.is_uniform:
            print(f"the search's best is a uniform factor: {NO_CURVE_WON}", flush=True)
    _write_chosen(output, chosen, spec, args, model, validated=bool(args.validation_samples))
    plot_chosen(output, chosen, spec, args.scaling, validated=bool(args.validation_samples))
    result["chosen"] = {"label": chosen.label, "kind": chosen.kind, "row": row_name(chosen.label, chosen.kind),
                        "search_fitness": chosen.search_fitness}
    forwards["total"] = sum(forwards.values())
    result["forwards"] = forwards
    return chosen


def _validation_identity(condition: Condition, args) -> dict:
    from lpes_harness.evaluation.paired import cache_identity

    identity = cache_identity(condition.task, condition.metadata, condition.chat_template, args.pretrained,
                              args.dtype_chosen, args.scaling)
    return {**identity, "split": "validation"}


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
    from lpes_harness.evaluation.plots import plot_curve

    genome = None if chosen.is_uniform or not chosen.genome else chosen.genome
    how = "chosen on the validation split" if validated else "the search's best"
    title = f"the run's curve, {how}: {row_name(chosen.label, chosen.kind)}"
    if chosen.label not in title:  # "LPES (LPES #14)": which individual; a uniform row already names its factor
        title += f" ({chosen.label})"
    if chosen.is_uniform:
        title += f"\n{NO_CURVE_WON}"
    plot_curve(output / "curve.png", spec, genome, chosen.scales, title=title, scaling=scaling)


def heldout_methods(args, spec, chosen: Candidate, sweep: dict | None, uniform: dict | None) -> dict:
    """The held-out table's rows: vanilla, the curve's PI (``--heldout-extra pi``; a uniform winner is
    its own PI), the run's curve named for what it is, and the best uniform factor (uniform.json,
    else the sweep's best when ``--heldout-extra uniform``). No row repeats vanilla's scales: a run
    that chose the plain model may leave vanilla alone."""
    from lpes_harness.evaluation.paired import lpes_methods
    from lpes_harness.core.scaling import identity

    rows = {"vanilla": identity(args.scaling, spec.num_layers)}
    if "pi" in args.heldout_extra and not chosen.is_uniform:
        rows["PI"] = lpes_methods(chosen.scales, (), spec.held_layers, args.scaling, spec.position_held_layers)["PI"]
    # A run whose choice is uniform 1 (its start, when no curve beat the plain model) is vanilla: its row
    # would score the same model twice.
    if list(chosen.scales) != rows["vanilla"]:
        rows[row_name(chosen.label, chosen.kind)] = list(chosen.scales)
    if uniform is not None:
        extra = (f"{uniform['label']} (uniform.json)", uniform["scales"])
    elif sweep is not None and "uniform" in args.heldout_extra:
        best = next((p for p in sweep_points(sweep, spec, args.scaling) if p["value"] == sweep["best"]
                     and p["kind"] == sweep.get("best_kind", p["kind"])), None)
        extra = (best["label"], best["scales"]) if best else None
    else:
        extra = None
    if extra and extra[1] not in rows.values():
        rows[extra[0]] = list(extra[1])
    return rows
