"""Which layers a curve moves, by attention type, and the curve kept on one type only (issue #29).

The command, with what it writes: :mod:`lpes_harness.commands.layer_types`.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from lpes_harness.core.files import save_figure


def model_layer_types(pretrained: str | None, gguf_file: str | None = None) -> list[str]:
    """The attention type of each decoder layer, from the model's config (``layer_types``).

    A model whose config names no types (Llama, Qwen2 without sliding windows) has one type,
    ``full_attention``, at every layer."""
    from transformers import AutoConfig

    from lpes_harness.core.gguf_cache import loadable
    from lpes_harness.core.models import config_layer_types, resolve_pretrained

    directory, gguf_name = loadable(*resolve_pretrained(pretrained, gguf_file), convert=False)
    config = AutoConfig.from_pretrained(directory, gguf_file=gguf_name) if gguf_name else AutoConfig.from_pretrained(directory)
    return config_layer_types(config)


def layers_not_of(layer_types: list[str], kind: str, flag: str = "--layer-type") -> tuple[int, ...]:
    """The layers a search on ``kind`` only holds at 1; a ``kind`` the model lacks is a ValueError naming
    its types and the ``flag`` that asked for it."""
    if kind not in layer_types:
        raise ValueError(f"{flag} {kind!r}: this model's layers are of type(s) "
                         f"{', '.join(dict.fromkeys(layer_types))}")
    return tuple(i for i, t in enumerate(layer_types) if t != kind)


def by_type(scales: list[float], layer_types: list[str]) -> dict:
    """Per attention type: its layers, their scales, mean, range and mean distance from 1."""
    if len(scales) != len(layer_types):
        raise ValueError(f"the scales have {len(scales)} layers, the model {len(layer_types)}")
    summary = {}
    for kind in dict.fromkeys(layer_types):  # first-seen order
        layers = [i for i, t in enumerate(layer_types) if t == kind]
        values = [scales[i] for i in layers]
        summary[kind] = {
            "layers": layers, "scales": values, "mean": statistics.fmean(values),
            "min": min(values), "max": max(values),
            "mean_abs_change": statistics.fmean(abs(v - 1.0) for v in values),
        }
    return summary


def kept_on(scales: list[float], layer_types: list[str], kind: str) -> list[float]:
    """The curve on the layers of one type; every other layer back at 1 (plain RoPE)."""
    return [s if t == kind else 1.0 for s, t in zip(scales, layer_types)]


def report_markdown(summary: dict, scales_path: str, model: str, base_summary: dict | None = None) -> str:
    """The table of :func:`by_type`; with ``base_summary`` (scaling both), a second for the base factors."""
    lines = [f"# Which layers the curve moves: `{scales_path}` on {model}"]
    tables = [("", summary)] if base_summary is None else [("Position factors", summary), ("Base factors", base_summary)]
    for heading, rows in tables:
        lines += ["", *([f"## {heading}", ""] if heading else []),
                  "| layer type | layers | mean scale | range | mean distance from 1 |", "|---|---|---:|---|---:|"]
        for kind, row in rows.items():
            lines.append(f"| {kind} | {', '.join(map(str, row['layers']))} | {row['mean']:.3f} | "
                         f"{row['min']:.3f}-{row['max']:.3f} | {row['mean_abs_change']:.3f} |")
    lines += ["", "Ablations (the other types' layers at 1): "
              + ", ".join(f"`only_{kind}.json`" for kind in summary) + "."]
    return "\n".join(lines) + "\n"


def plot_layer_types(scales: list[float], layer_types: list[str], path: Path, base_scales: list[float] | None = None) -> None:
    """Each layer's scale, marked by type; with ``base_scales`` (scaling both), the base factors too (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.2))
    curves = [("", scales, "-")] if base_scales is None else [("position: ", scales, "-"), ("base: ", base_scales, "--")]
    for prefix, values, style in curves:
        axis.plot(range(len(values)), values, style, color="0.6", zorder=1)
        for kind, marker in zip(dict.fromkeys(layer_types), "os^Dv"):
            layers = [i for i, t in enumerate(layer_types) if t == kind]
            axis.scatter(layers, [values[i] for i in layers], marker=marker, label=prefix + kind, zorder=2)
    axis.axhline(1.0, color="k", linewidth=0.6, linestyle=":")
    axis.set_xlabel("decoder layer")
    axis.set_ylabel("RoPE scale s_h")
    axis.legend(frameon=False)
    figure.tight_layout()
    save_figure(figure, path)
    plt.close(figure)
