"""The best single factor, tuned as fairly as the curve: ``uniform.json`` beside ``scales.json``.

A per-layer curve is only worth its degrees of freedom if it beats the best *uniform* factor
found with the same effort: on Gemma-3 one base factor 2 on every layer gained all that the
searched curves did. So after the genetic search, uniform factors of every kind the run's
scaling allows (a position factor; under ``both`` also a base factor, the other half at 1) are
scored with the search's own fitness and samples, until they have used at least the forwards
the genetic search used (the sweep's forwards count: they are uniform points too).

The factors come from the genome's own y grid, coarse to fine (both ends, then the middle,
then the quarters, ...), kinds interleaved, and each is raced against the best so far, so a
factor that wrecks the model costs a few samples and the budget reaches far into the grid.
Every scored point is appended to a journal as it comes: a killed run resumes where it stopped.

:func:`uniform_stage` is the run's stage (``--uniform-tuning``), after the genetic search.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterable, Sequence

from lpes_harness.core.files import append_jsonl, read_jsonl
from lpes_harness.core.scaling import SCALINGS
from lpes_harness.search.run_context import Run
from lpes_harness.search.run_record import UNIFORM_FILE, UNIFORM_JOURNAL, forwards_of
from lpes_harness.search.sample_order import load_order_state, order_state
from lpes_harness.search.sweep import Swept, uniform_label, uniform_scales


def coarse_to_fine(values: Sequence[float]) -> list[float]:
    """``values`` (sorted) ends first, then midpoints breadth first: an even cover at any cut-off."""
    values = sorted(values)
    if len(values) <= 2:
        return list(values)
    order, seen, spans = [values[0], values[-1]], {0, len(values) - 1}, [(0, len(values) - 1)]
    while spans:
        following = []
        for lo, hi in spans:
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            if mid not in seen:
                seen.add(mid)
                order.append(values[mid])
            following += [(lo, mid), (mid, hi)]
        spans = following
    return order


def interleave(*orders: Sequence) -> list:
    """One item of each order in turn."""
    out = []
    for k in range(max((len(o) for o in orders), default=0)):
        out += [o[k] for o in orders if k < len(o)]
    return out


def best_point(points: Iterable[dict]) -> dict | None:
    """The fittest point scored in full (a raced-out one has only an upper bound), else None."""
    complete = [p for p in points if not (p.get("info") or {}).get("raced")]
    return max(complete, key=lambda p: p["fitness"], default=None)


def tune_uniform(evaluate: Callable, points: Sequence[dict], *, budget: int, forwards: Callable[[], int],
                 known: Sequence[dict] = (), journal: Path | None = None, progress=None) -> dict:
    """Score ``points`` (dicts with ``label``, ``kind``, ``value``, ``scales``) in order, raced against
    the best so far, until ``budget`` forwards are used; ``known`` points (the sweep's, with their
    ``fitness``, ``info`` and ``forwards``) count as scored.

    ``evaluate(scales, threshold) -> (fitness, info)``; ``forwards()`` counts this process's
    forwards. The search's fitness racing in the hardest sample order has its statistics journalled
    with each point and restored from the last one on resume (:mod:`lpes_harness.search.sample_order`). Returns ``{"best", "points", "forwards", "budget"}``.
    """
    done = {p["label"]: dict(p) for p in known}
    if journal is not None and journal.is_file():
        lines = read_jsonl(journal)  # a torn last line is skipped: that point is scored again
        for line in lines:
            done[line["label"]] = {k: v for k, v in line.items() if k != "sample_order"}
        if lines:
            load_order_state(evaluate, lines[-1].get("sample_order"))
    used = sum(p.get("forwards", 0) for p in done.values())

    for point in points:
        if used >= budget:
            break
        if point["label"] in done:
            continue
        leader = best_point(done.values())
        before = forwards()
        fitness, info = evaluate(list(point["scales"]), -math.inf if leader is None else leader["fitness"])
        record = {**point, "fitness": float(fitness), "info": info, "forwards": forwards() - before}
        used += record["forwards"]
        done[point["label"]] = record
        if journal is not None:
            state = order_state(evaluate)
            append_jsonl(journal, {**record, "sample_order": state} if state else record)
        if progress:
            progress(record)
    chosen = best_point(done.values())
    return {"best": chosen, "points": list(done.values()), "forwards": used, "budget": budget}


# ----------------------------------------------------------------------------- the run's uniform stage


def uniform_grid(spec, scaling: str) -> list[dict]:
    """Every uniform factor on the genome's y grid of each kind, coarse to fine, kinds interleaved."""
    kinds = SCALINGS[scaling].axes
    orders = []
    for kind, half in zip(kinds, spec.halves()):
        values = [half.y_of(j) for j in range(half.y_cells + 1)]
        orders.append([{"label": uniform_label(kind, v, scaling), "kind": kind, "value": v,
                        "scales": uniform_scales(spec, scaling, kind, v)} for v in coarse_to_fine(values)])
    return interleave(*orders)


def uniform_stage(run: Run, sweep: Swept | None, history: Sequence[dict], result: dict) -> dict | None:
    """``--uniform-tuning``: the best uniform factor with at least the genetic search's forwards (``history``),
    the sweep's points counted as scored; None without the flag. Writes ``uniform.json``, its journal
    ``uniform_tuning.jsonl`` and ``uniform.png``; adds ``uniform`` to ``result`` and the stage's own forwards
    to ``run.forwards``. Returns the best point."""
    from lpes_harness.core.scales_file import write_scales_file
    from lpes_harness.evaluation.plots import plot_uniform_points

    if not run.args.uniform_tuning:
        return None
    output, fitness, spec, scaling = run.output, run.fitness, run.spec, run.args.scaling
    searched = forwards_of(history)
    share = getattr(run.args, "uniform_share", 1.0)
    budget = math.ceil(share * searched)
    known = sweep.points if sweep else []

    def report(point):
        info = point.get("info") or {}
        print(f"  {point['label']}: fitness {point['fitness']:.4f}{' (raced out)' if info.get('raced') else ''}",
              flush=True)

    print(f"uniform factors: tuned with the search's fitness until they use {budget} forwards"
          + (f", {share:g} of the search's {searched}" if share != 1 else ", the search's")
          + f" (the sweep's {sum(p['forwards'] for p in known)} count)", flush=True)
    tuned = tune_uniform(fitness, uniform_grid(spec, scaling), budget=budget, forwards=lambda: fitness.samples_scored,
                         known=known, journal=output / UNIFORM_JOURNAL, progress=report)
    best = tuned["best"]
    write_scales_file(output / UNIFORM_FILE, best["scales"], scaling=scaling, curve="uniform", kind=best["kind"],
                      factor=best["value"], label=best["label"], fitness=best["fitness"],
                      scores=(best.get("info") or {}).get("scores"), model=run.model_name, dtype=run.args.dtype_chosen,
                      tuning={"forwards": tuned["forwards"], "budget": budget, "search_forwards": searched,
                              "share": share, "points": len(tuned["points"])})
    # tuned["forwards"] counts the sweep's points it took as scored; result.json's "uniform" stage does not.
    print(f"best uniform factor: {best['label']} (fitness {best['fitness']:.4f}, {len(tuned['points'])} factors, "
          f"{tuned['forwards']} forwards with the sweep's {sum(p['forwards'] for p in known)}, for a budget of {budget}) "
          f"-> {output / UNIFORM_FILE}", flush=True)
    run.forwards["uniform"] = tuned["forwards"] - run.forwards["sweep"]
    result["uniform"] = {k: best[k] for k in ("label", "kind", "value", "fitness", "scales")}
    plot_uniform_points(tuned["points"], output / "uniform.png", chosen=best["label"],
                        title=f"uniform factors, {tuned['forwards']} forwards (the search: {tuned['budget']})")
    return best
