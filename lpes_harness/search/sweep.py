"""The uniform-scale sweep: where to start a search, and the PI curve of the report.

Before the genetic search, every value of ``--sweep`` is applied to all layers and scored
with the search's own fitness. The best one becomes the starting individual's y (the
paper starts at 1.5, which wrecks a small model such as SmolLM2-135M: uniform 1.2 already
drops its multi-needle accuracy from 0.70 to 0.25).

The sweep chooses the *start only*; it never narrows the y range. Per-layer curves that
help rise well above the best uniform scale in late layers (1.5 to 1.85 on SmolLM2, where
uniform 1.2 fails), so a range cut to where uniform scales still work would exclude them.

Values are scored best-guess first (the one nearest 1) and later ones are raced against
the best so far, so a value that wrecks the model costs only a few samples.

:func:`sweep_stage` is a run's sweep stage: :func:`load_or_run_sweep` (each point journalled, a resume
reads them back), then :func:`start_from` moves the genome's start to its best factor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lpes_harness.core.files import append_jsonl, atomic_write_json, kill_point, read_jsonl
from lpes_harness.core.scaling import SCALINGS
from lpes_harness.search.run_context import Run
from lpes_harness.search.run_record import forwards_of, record_genome
from lpes_harness.search.sample_order import load_order_state, order_state


def parse_sweep(text) -> list[float]:
    """``"0.8,1,1.2"`` -> [0.8, 1.0, 1.2]; ``"none"`` or empty -> []."""
    if text is None:
        return []
    if isinstance(text, (list, tuple)):
        values = [float(v) for v in text]
    else:
        text = str(text).strip()
        if text.lower() in ("", "none", "off"):
            return []
        try:
            values = [float(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"--sweep {text!r}: give scales separated by commas, e.g. 0.8,1,1.2, or 'none'") from None
    bad = [v for v in values if not (math.isfinite(v) and v > 0)]
    if bad:
        raise ValueError(f"--sweep: scales must be positive numbers, got {bad}")
    return sorted(set(values), key=lambda v: (abs(v - 1.0), v))


def parse_lines(text) -> list[tuple[float, float]]:
    """``--lines``: ``"0.6:1.4,1:1.4"`` -> [(0.6, 1.4), (1.0, 1.4)], in the order given (the order they
    are scored in); ``"none"`` or empty -> []. Each is a straight line over depth, from its first
    value at layer 0 to its second at the last layer (:func:`lpes_harness.search.genome.ramp_genome`);
    a flat one is a uniform scale, which belongs in ``--sweep``."""
    if text is None or str(text).strip().lower() in ("", "none", "off"):
        return []
    lines = []
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        ends = part.split(":")
        try:
            first, last = (float(v) for v in ends) if len(ends) == 2 else (None, None)
        except ValueError:
            first = last = None
        if first is None or not all(math.isfinite(v) and v > 0 for v in (first, last)):
            raise ValueError(f"--lines {text!r}: give lines as FIRST:LAST scales separated by commas, e.g. "
                             f"0.6:1.4,1:1.4 (from FIRST at layer 0 to LAST at the last layer), or 'none'")
        if first == last:
            raise ValueError(f"--lines: {part} is flat, a uniform scale: give it in --sweep")
        if (first, last) not in lines:
            lines.append((first, last))
    return lines


def check_lines(lines: list[tuple[float, float]], args) -> list[tuple[float, float]]:
    """``lines`` if the search's flags can hold them: one curve of control points whose straight line is a
    line over depth (not a step curve, not brute force, not scaling both), ends inside the y range (a line
    clipped to it would be another line), and room beside the start in a population the flags fix."""
    if not lines:
        return lines
    paired = SCALINGS[args.scaling].paired
    if args.brute_force or paired or args.curve == "step":
        why = ("--brute-force" if args.brute_force else f"--scaling {args.scaling}" if paired else "--curve step")
        raise ValueError(f"--lines: a line is one curve's control points on a straight line, which {why} cannot hold")
    outside = [f"{a:g}:{b:g}" for a, b in lines if not all(args.y_min <= v <= args.y_max for v in (a, b))]
    if outside:
        raise ValueError(f"--lines {', '.join(outside)}: the ends must lie in [--y-min, --y-max] = "
                         f"[{args.y_min:g}, {args.y_max:g}]")
    if not args.time_budget and len(lines) > args.population - 1:
        raise ValueError(f"--lines: {len(lines)} lines need a --population of at least {len(lines) + 1} (the start "
                         f"and the lines), got {args.population}")
    return lines


def run_sweep(evaluate, values: Sequence[float], uniform: Callable[[float], list[float]], *,
              known: Mapping[float, tuple[float, dict]] | None = None,
              on_point: Callable[[dict], None] | None = None, kind: str | None = None,
              best: dict | None = None) -> dict:
    """Score each uniform scale; ``evaluate(scales, threshold) -> (fitness, info)``.

    ``uniform(value)`` gives the layer scales of one value (:meth:`GenomeSpec.uniform`: the layers
    a ``--layer-type`` search holds stay at 1).

    ``known``: ``{scale: (fitness, info)}`` of points scored before (a killed sweep's journal, read
    back on resume); they are taken as they are, not evaluated again, and each later point is
    raced against the same threshold as in an uninterrupted sweep. ``on_point(point)`` is called
    after each newly scored point (the search journals it there). ``kind`` (scaling both:
    ``position`` or ``base``) is kept in each point; ``best``, a complete point of an earlier
    kind's sweep, is what the first point races against.

    Returns ``{"points": [{"scale", "fitness", "info"}...] (in scale order), "best": scale,
    "best_point": the point}``. A raced-out point's fitness is an upper bound below the best,
    marked in its info.
    """
    if not values:
        raise ValueError("the sweep needs at least one scale")
    known = {float(scale): point for scale, point in (known or {}).items()}
    points = []
    for value in values:
        threshold = -math.inf if best is None else best["fitness"]
        scored_before = float(value) in known
        fitness, info = known[float(value)] if scored_before else evaluate(uniform(float(value)), threshold)
        point = {"scale": float(value), "fitness": float(fitness), "info": info}
        if kind is not None:
            point = {"kind": kind, **point}
        if not scored_before and on_point is not None:
            on_point(point)
        points.append(point)
        complete = not (info or {}).get("raced")
        if complete and (best is None or fitness > best["fitness"]):
            best = point
    return {"points": sorted(points, key=lambda p: p["scale"]), "best": best["scale"], "best_point": best}


def snap_initial_y(best: float, y_min: float, y_max: float, y_step: float) -> float:
    """The sweep's best scale on the genome's y grid (the start must be a valid gene)."""
    j = round((min(max(best, y_min), y_max) - y_min) / y_step)
    j = max(0, min(j, int(math.floor((y_max - y_min) / y_step + 1e-9))))
    return round(y_min + j * y_step, 10)


def plot_sweep(sweep: dict, path: str | Path, best_curve: Sequence[float] | None = None) -> Path:
    """Fitness against the uniform scale (:func:`lpes_harness.evaluation.plots.plot_sweep`)."""
    from lpes_harness.evaluation.plots import plot_sweep as draw

    path = Path(path)
    draw(sweep, path, best_curve)
    return path


def load_or_run_sweep(output: Path, args, fitness, spec) -> dict:
    """The sweep of this run: read back on --resume (same values), else scored now and saved.

    Scaling both scores the uniform position factors of ``--sweep`` (base 1), then the uniform base
    factors of ``--base-sweep`` (positions as they are), raced against the best of either kind.
    Each point is journalled in ``sweep.jsonl`` as soon as it is scored: a sweep killed part way
    resumes with the points it had (they are not scored again), and ``sweep.json`` replaces the
    journal once the sweep is complete."""
    path, journal = output / "sweep.json", output / "sweep.jsonl"
    plan = sweep_plan(args, spec)
    wanted = sorted((kind or "", v) for kind, values, _ in plan for v in values)
    # Each point and the finished sweep keep the sample order's statistics as of then (hardest order):
    # a sweep resumed, or a search started after it, races as the uninterrupted run would have.
    if args.resume and path.exists():
        saved = json.loads(path.read_text())
        if sorted((p.get("kind", ""), p["scale"]) for p in saved["points"]) == wanted:
            journal.unlink(missing_ok=True)  # left by a kill between the two
            load_order_state(fitness, saved.get("sample_order"))
            return saved
    lines = read_jsonl(journal) if args.resume else []  # the run's settings were checked: this very sweep's
    if lines:
        load_order_state(fitness, lines[-1].get("sample_order"))
    if not args.resume:
        journal.unlink(missing_ok=True)
    print(f"sweep: uniform {'factors' if SCALINGS[args.scaling].paired else 'scales'} "
          + "; ".join(f"{kind + ' ' if kind else ''}{', '.join(f'{v:g}' for v in values)}" for kind, values, _ in plan if values)
          + (f" ({len(lines)} scored before the stop, read back from {journal.name})" if lines else ""), flush=True)

    def journal_point(point: dict) -> None:
        state = order_state(fitness)
        append_jsonl(journal, {**point, "sample_order": state} if state else point)
        kill_point("sweep")  # test hook (lpes_harness.core.files.kill_point): a kill in the sweep

    points, best = [], None
    for kind, values, uniform in plan:
        if not values:
            continue
        known = {line["scale"]: (line["fitness"], line["info"]) for line in lines
                 if line.get("kind") == kind and line.get("scale") in values}
        part = run_sweep(fitness, values, uniform, known=known, on_point=journal_point, kind=kind, best=best)
        points += part["points"]
        best = part["best_point"]
    for point in points:
        info = point["info"] or {}
        print(f"  uniform {point.get('kind', '')} {point['scale']:g}: fitness {point['fitness']:.4f}"
              f"{' (raced out)' if info.get('raced') else ''} {info.get('scores')}", flush=True)
    sweep = {"points": points, "best": best["scale"]}
    if "kind" in best:
        sweep["best_kind"] = best["kind"]
    if state := order_state(fitness):
        sweep["sample_order"] = state
    atomic_write_json(path, sweep)
    journal.unlink(missing_ok=True)
    return sweep


def sweep_plan(args, spec) -> list:
    """(kind, values, uniform scales of a value) per kind the sweep scores."""
    entry = SCALINGS[args.scaling]
    if entry.paired:  # --sweep for the first axis (position), --base-sweep for the second
        return [(axis, values, lambda v, axis=axis: spec.uniform_pair(**{axis: v}))
                for axis, values in zip(entry.axes, (args.sweep_values, args.base_sweep_values))]
    return [(None, args.sweep_values, spec.uniform)]


def start_from(spec, args, sweep: dict):
    """The genome's start at the sweep's best uniform factor (of its kind, under scaling both)."""
    axes = SCALINGS[args.scaling].axes
    if len(axes) > 1:
        kind = sweep.get("best_kind", axes[0])
        spec = spec.starting_at(**{f"{axis}_y": sweep["best"] if axis == kind else 1.0 for axis in axes})
        print(f"sweep: best uniform factor {kind} {sweep['best']:g} -> the search starts from position y = "
              f"{spec.initial_y:g}, base y = {spec.base_initial_y:g} (ranges kept)", flush=True)
    else:
        spec = spec.starting_at(sweep["best"])
        print(f"sweep: best uniform scale {sweep['best']:g} -> the search starts from y = {spec.initial_y:g} "
              f"(range [{args.y_min:g}, {args.y_max:g}] kept)", flush=True)
    args.initial_y = spec.initial_y
    return spec


# ----------------------------------------------------------------------------- the run's sweep stage


@dataclass
class Swept:
    """The sweep stage's output: ``sweep.json`` as written (``points``, ``best``, ``best_kind`` under scaling
    both), and its points as scored uniform points (:func:`sweep_points`), which the later stages reuse."""

    record: dict
    points: list[dict]

    def best_point(self) -> dict | None:
        """The sweep's best as a uniform point."""
        return next((p for p in self.points if p["value"] == self.record["best"]
                     and p["kind"] == self.record.get("best_kind", p["kind"])), None)

    def summary(self) -> dict:
        """``result.json``'s ``sweep``: the best, and every point's scale and fitness."""
        return {"best": self.record["best"], "best_kind": self.record.get("best_kind"),
                "points": [{k: p[k] for k in ("scale", "fitness")} | ({"kind": p["kind"]} if "kind" in p else {})
                           for p in self.record["points"]]}


def sweep_stage(run: Run) -> Swept | None:
    """The sweep of ``--sweep`` (and ``--base-sweep``), None without one. Reads the run's flags, fitness and
    genome spec; writes ``sweep.json`` (``sweep.jsonl`` while it runs), ``sweep.png`` and, in a fresh run,
    config.json's ``genome``; moves ``run.spec``'s start to the best factor and adds the sweep's forwards
    to ``run.forwards``."""
    from lpes_harness.evaluation.plots import plot_uniform_points

    args = run.args
    if not (args.sweep_values or args.base_sweep_values):
        return None
    record = load_or_run_sweep(run.output, args, run.fitness, run.spec)
    run.spec = start_from(run.spec, args, record)
    if not run.resume_search:
        record_genome(run.record_path, run.spec)  # the genome the search starts from
    swept = Swept(record, sweep_points(record, run.spec, args.scaling))
    run.forwards["sweep"] = sum(p["forwards"] for p in swept.points)
    plot_uniform_points(swept.points, run.output / "sweep.png", title="the sweep: uniform factors scored before the search")
    return swept


def uniform_label(kind: str, value: float, scaling: str) -> str:
    """``uniform 0.8`` (one scaling), ``uniform position 0.8`` / ``uniform base 2`` (scaling both)."""
    return f"uniform {kind} {value:g}" if SCALINGS[scaling].paired else f"uniform {value:g}"


def uniform_scales(spec, scaling: str, kind: str, value: float) -> list[float]:
    if not SCALINGS[scaling].paired:
        return spec.uniform(value)
    return spec.uniform_pair(**{kind: value})  # kind: the axis it moves, position or base


def sweep_points(sweep: dict | None, spec, scaling: str) -> list[dict]:
    """The sweep's points as scored uniform points (label, kind, value, scales, fitness, info, forwards)."""
    points = []
    for point in (sweep or {}).get("points", []):
        kind = point.get("kind", SCALINGS[scaling].axes[0])
        points.append({"label": uniform_label(kind, point["scale"], scaling), "kind": kind, "value": point["scale"],
                       "scales": uniform_scales(spec, scaling, kind, point["scale"]), "fitness": point["fitness"],
                       "info": point.get("info"), "forwards": forwards_of([point])})
    return points
