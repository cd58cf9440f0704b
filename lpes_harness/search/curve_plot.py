"""A genome's figure: the curve, its control points and each layer's factor (``curve.png`` of a search).

It reads the search's :class:`~lpes_harness.search.genome.GenomeSpec` (its curve kind, halves, bounds), so it
lives with the search, not with the evaluation's figures it draws alike (:mod:`lpes_harness.evaluation.plots`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lpes_harness.core.scaling import DEFAULT, SCALINGS, axis_label
from lpes_harness.evaluation.plots import new_figure, save_agg


def plot_curve(path, spec, genome: Sequence[Sequence[float]], scales: Sequence[float], title: str | None = None,
               scaling: str = DEFAULT) -> None:
    """The curve, its control points and each layer's scale (``scaling``: what the scales multiply).

    Scaling both (a spec with a base curve): two panels, the position curve over the base curve.
    ``genome`` None: a uniform factor (no control points), the layer scales alone."""
    if spec.both:
        figure = new_figure(figsize=(7, 6.5))
        top, bottom = figure.subplots(2, 1, sharex=True)
        half_scales = (scales[:spec.num_layers], scales[spec.num_layers:])
        halves_points = spec.split(genome) if genome is not None else (None, None)
        for axes, half, points, values, axis in zip((top, bottom), spec.halves(), halves_points, half_scales,
                                                     SCALINGS[scaling].axes):
            _draw_curve(axes, half, points, values, axis)
        top.set_xlabel("")
        top.set_title(title or "scaling both: each layer's position factor and RoPE base factor", fontsize=10)
    else:
        figure = new_figure(figsize=(7, 4))
        axes = figure.add_subplot()
        _draw_curve(axes, spec, genome, scales, SCALINGS[scaling].axes[0])
        if title:
            axes.set_title(title, fontsize=10)
    save_agg(figure, Path(path))


def _draw_curve(axes, spec, genome, scales, axis: str) -> None:
    """One curve of :func:`plot_curve` on ``axes``; ``axis``: what its factors multiply (position, base)."""
    import numpy as np

    from lpes_harness.core.curves import bezier_eval, layer_positions

    layers = np.arange(len(scales))
    if genome is None:  # a uniform factor has no curve: every layer the same
        axes.plot(layers, scales, "o-", ms=4, label="layer scales (one factor, every layer)")
    elif spec.brute_force:
        axes.plot(layers, scales, "o-", ms=4, label="layer scales (one gene per layer)")
    else:
        points = np.asarray(genome, dtype=float)
        x_layers = layer_positions(points, spec.num_layers)
        if spec.curve == "bezier":
            dense = bezier_eval(points, np.linspace(0, 1, 400))
            axes.plot(dense[:, 0], dense[:, 1], "-", label="Bézier curve")
            axes.plot(points[:, 0], points[:, 1], ":", color="gray", lw=1, label="control polygon")
        elif spec.curve == "step":
            axes.step(x_layers, scales, where="post", label="step curve")
        else:
            axes.plot(x_layers, scales, "-", label=f"{spec.curve} curve")
        axes.plot(points[:, 0], points[:, 1], "s", ms=7, color="tab:red", label="control points")
        axes.plot(x_layers, scales, "o", ms=4, color="black", label="layer scales")
    if genome is None or spec.brute_force:
        axes.set_xlabel("layer")
    else:  # layers sit on the curve at evenly spaced x from P_0x to P_dx, not at x = h
        axes.set_xlabel("x   (layer h at x_h = P0x + (Pdx - P0x) h / (L - 1))")
    axes.set_ylabel(axis_label(axis))
    axes.set_ylim(spec.y_min - 0.05, spec.y_max + 0.05)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
