"""Every figure of the search and the report, drawn with matplotlib's Agg canvas (no pyplot state).

Search: :func:`plot_fitness` (fitness by generation, raced-out individuals apart), :func:`plot_sweep`
(the uniform-scale sweep); a genome's curve is the search's own figure (:mod:`lpes_harness.search.curve_plot`).
Held-out comparison: :func:`plot_paired` (accuracy by position with 95 % intervals). Report: :func:`plot_positions`, :func:`plot_scales`,
:func:`plot_search`. Each figure is written atomically (:func:`lpes_harness.core.files.save_figure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.core.files import save_figure
from lpes_harness.core.scaling import AXES


def new_figure(*args, **kwargs):
    """A matplotlib Figure of no pyplot state (pyplot's global figures leak across a long search)."""
    from matplotlib.figure import Figure

    return Figure(*args, **kwargs)


def save_agg(figure, path: Path) -> None:
    """Draw ``figure`` on an Agg canvas and write it atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)  # Agg, without touching pyplot's global backend
    save_figure(figure, path)


def plot_fitness(path, generation_stats: Sequence[dict]) -> None:
    """Best and mean fitness by generation, over complete individuals only.

    Each complete individual is a dot; a raced-out one (stopped early by racing: its value is
    only an upper bound) is an open marker of its own, and counts in no line. Statistics
    from runs before racing was told apart (no ``fitnesses`` key) show the lines only.
    """
    figure = new_figure(figsize=(6, 3.5))
    axes = figure.add_subplot()
    generations = [s["generation"] for s in generation_stats]
    complete_x = [s["generation"] for s in generation_stats for _ in s.get("fitnesses") or ()]
    complete_y = [f for s in generation_stats for f in s.get("fitnesses") or ()]
    raced_x = [s["generation"] for s in generation_stats for _ in s.get("raced_bounds") or ()]
    raced_y = [f for s in generation_stats for f in s.get("raced_bounds") or ()]
    if complete_y:
        axes.plot(complete_x, complete_y, ".", color="tab:gray", alpha=0.5, label="individual (complete)")
    if raced_y:
        raced_out = sum(s.get("raced_out", 0) for s in generation_stats)
        axes.plot(raced_x, raced_y, "x", color="tab:red", alpha=0.6,
                  label=f"raced out: upper bound only ({raced_out}, not in the mean)")
    axes.plot(generations, [s["best_fitness"] for s in generation_stats], "o-", label="best")
    means = [(g, s.get("mean_fitness")) for g, s in zip(generations, generation_stats)]
    axes.plot([g for g, m in means if m is not None], [m for _, m in means if m is not None], "s--",
              label="mean of complete")
    _save_by_generation(figure, axes, "fitness", path)


def _save_by_generation(figure, axes, ylabel: str, path) -> None:
    """The x axis of a by-generation plot (whole generations), its y label and legend; then saved."""
    from matplotlib.ticker import MaxNLocator

    axes.set_xlabel("generation")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    save_agg(figure, Path(path))


def plot_condition_scores(path, generation_stats: Sequence[dict]) -> None:
    """A search over conditions: each condition's score of the generation's best individual."""
    rows = [(s["generation"], s["best_scores"]) for s in generation_stats if isinstance(s.get("best_scores"), dict)]
    names = list(dict.fromkeys(name for _, scores in rows for name in scores))
    figure = new_figure(figsize=(6, 3.5))
    axes = figure.add_subplot()
    for k, name in enumerate(names):
        points = [(g, scores[name]) for g, scores in rows if scores.get(name) is not None]
        axes.plot([g for g, _ in points], [v for _, v in points], "o-", color=f"C{k}", label=name)
    _save_by_generation(figure, axes, "condition fitness of the best individual", path)


def plot_uniform_points(points: Sequence[Mapping], path, chosen: str | None = None,
                        title: str = "uniform factors (search split)") -> None:
    """Fitness against a uniform factor, one line per kind (position, base); raced-out points hollow."""
    figure = new_figure(figsize=(5.6, 3.6))
    axes = figure.add_subplot()
    def kind_of(point: Mapping) -> str:
        return point.get("kind", AXES[0])  # a point that names no kind moved positions

    kinds = list(dict.fromkeys(kind_of(p) for p in points))
    for k, kind in enumerate(kinds):
        mine = sorted((p for p in points if kind_of(p) == kind), key=lambda p: p["value"])
        complete = [p for p in mine if not (p.get("info") or {}).get("raced")]
        raced = [p for p in mine if (p.get("info") or {}).get("raced")]
        axes.plot([p["value"] for p in complete], [p["fitness"] for p in complete], "o-", color=f"C{k}",
                  label=f"{kind} factor")
        if raced:
            axes.plot([p["value"] for p in raced], [p["fitness"] for p in raced], "o", mfc="none", color=f"C{k}",
                      label=f"{kind}: raced out (upper bound)")
    for p in points:
        if p.get("label") == chosen:
            axes.plot([p["value"]], [p["fitness"]], "*", ms=14, color="C3", label=f"best: {chosen}")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("factor on every layer (log scale)")
    axes.set_ylabel("fitness")
    axes.set_title(title, fontsize=9)
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    save_agg(figure, Path(path))


def plot_positions(series: Mapping[str, Sequence[tuple[int, float]]], title: str, path) -> None:
    """Accuracy (0..1, drawn in %) by gold position, one line per name."""
    figure = new_figure(figsize=(5, 3.5))
    axes = figure.add_subplot()
    for name, points in series.items():
        points = [(p, 100 * value) for p, value in points]
        if points:
            axes.plot(*zip(*points), marker="o", label=name)
    axes.set_xlabel("gold position (% of context)")
    axes.set_ylabel("accuracy (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    save_agg(figure, Path(path))


def plot_scales(curves: Mapping[str, Sequence[float]], path) -> None:
    """Each curve's scale per layer, with the identity (1) dashed."""
    figure = new_figure(figsize=(5, 3.5))
    axes = figure.add_subplot()
    for name, scales in curves.items():
        axes.plot(range(len(scales)), scales, marker=".", label=name)
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xlabel("layer")
    axes.set_ylabel("layer factor (position scale; base factor for base-scaled curves)")
    axes.grid(alpha=0.3)
    axes.legend()
    save_agg(figure, Path(path))


def plot_search(rows: Sequence[Mapping[str, float]], path) -> None:
    """Best and mean fitness, and smoothness of the best and of the population, by generation."""
    figure = new_figure(figsize=(9, 3.5))
    fit_axes, smooth_axes = figure.subplots(1, 2)
    generations = [r["generation"] for r in rows]
    fit_axes.plot(generations, [r["best_fitness"] for r in rows], marker="o", label="best")
    fit_axes.plot(generations, [r["mean_fitness"] for r in rows], marker=".", label="mean")
    fit_axes.set_xlabel("generation")
    fit_axes.set_ylabel("fitness")
    fit_axes.legend()
    smooth_axes.plot(generations, [r["best_smoothness"] for r in rows], marker="o", label="best individual")
    smooth_axes.plot(generations, [r["mean_smoothness"] for r in rows], marker=".", label="population mean")
    smooth_axes.set_xlabel("generation")
    smooth_axes.set_ylabel("smoothness (mean |2nd difference|)")
    smooth_axes.legend()
    for axes in (fit_axes, smooth_axes):
        axes.grid(alpha=0.3)
    save_agg(figure, Path(path))


def plot_sweep(sweep: Mapping, path: Path, best_curve: Sequence[float] | None = None) -> None:
    """Fitness against the uniform scale (raced-out points hollow); the searched curve's mean marked."""
    figure = new_figure(figsize=(5.6, 3.6))
    axes = figure.add_subplot()
    complete = [p for p in sweep["points"] if not (p.get("info") or {}).get("raced")]
    raced = [p for p in sweep["points"] if (p.get("info") or {}).get("raced")]
    axes.plot([p["scale"] for p in complete], [p["fitness"] for p in complete], "o-", label="uniform scale")
    if raced:
        axes.plot([p["scale"] for p in raced], [p["fitness"] for p in raced], "o", mfc="none",
                  label="raced out (upper bound)")
    axes.axvline(sweep["best"], color="grey", ls=":", label=f"start: {sweep['best']:g}")
    if best_curve:
        axes.axvline(sum(best_curve) / len(best_curve), color="C3", ls="--", label="mean of the searched curve (PI)")
    axes.set_xlabel("scale applied to every layer")
    axes.set_ylabel("fitness (search split)")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    save_agg(figure, path)


def plot_paired(table: Mapping, path: Path) -> None:
    """Accuracy by gold position with 95 % intervals, one line per method, side by side."""
    positions = table["positions"]
    figure = new_figure(figsize=(6.4, 4.0))
    axes = figure.add_subplot()
    spread = 1.2  # percent points between methods, so the error bars do not overlap
    offset0 = -spread * (len(table["rows"]) - 1) / 2
    for k, (name, row) in enumerate(table["rows"].items()):
        xs = [p + offset0 + k * spread for p in positions]
        ys = [row[str(p)]["accuracy"] for p in positions]
        low = [max(0.0, y - row[str(p)]["interval"][0]) for p, y in zip(positions, ys)]
        high = [max(0.0, row[str(p)]["interval"][1] - y) for p, y in zip(positions, ys)]
        axes.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=f"{name} (avg {row['average']['accuracy']:.3f})")
    axes.set_xlabel("gold position (%)")
    axes.set_ylabel("accuracy")
    axes.set_ylim(-0.02, 1.02)
    axes.set_xticks(positions)
    axes.set_title(f"{table.get('task', '')}: {table.get('num_samples', '?')} held-out samples per position, 95 % CI")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    save_agg(figure, path)
