"""Does a searched curve help on inputs its search never saw? One table over several conditions.

The command, with what it writes: :mod:`lpes_harness.commands.transfer`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.evaluation.conditions import task_metadata
from lpes_harness.evaluation.stats import format_p, paired_difference_interval

def paired_argv(options: Mapping, scales: Sequence[str], *, num_samples: int, seed: int | None, dtype: str | None,
                pretrained: str | None, output: Path, batch_size="1", baselines: Sequence[str] = ()) -> list[str]:
    """The ``commands.paired`` command line of one condition."""
    metadata = task_metadata(options)
    if seed is not None:
        metadata.setdefault("seed", seed)
    argv = ["--task", options.get("task", "multi_needle"), "--num-samples", str(num_samples), "--no-pi",
            "--metadata", json.dumps(metadata), "--chat-template", options.get("chat_template", "auto"),
            "--output", str(output)]
    argv += [arg for spec in scales for arg in ("--scales", spec)]
    argv += [arg for spec in baselines for arg in ("--baseline", spec)]
    argv += ["--dtype", dtype] if dtype else []
    argv += ["--pretrained", pretrained] if pretrained else []
    argv += ["--batch-size", str(batch_size)] if str(batch_size) != "1" else []
    return argv


def rows(name: str, heldout: Mapping) -> list[dict]:
    """One row per curve of a condition's ``heldout.json``: vanilla against it, pooled over positions."""
    table, scored = heldout["table"], heldout["scored"]
    positions = [str(p) for p in table["positions"]]
    vanilla = table["rows"][table["baseline"]]
    out = []
    for method, row in table["rows"].items():
        if method == table["baseline"]:
            continue
        pooled = row["average"]
        low, high = paired_difference_interval(pooled["gained"], pooled["lost"], pooled["n"])
        worst = min(positions, key=lambda p: vanilla[p]["accuracy"])
        out.append({
            "condition": name, "method": method, "task": scored["task"], "metadata": scored["metadata"],
            "chat_template": scored["chat_template"], "n": pooled["n"],
            "vanilla": vanilla["average"]["accuracy"], "vanilla_interval": vanilla["average"]["interval"],
            "accuracy": pooled["accuracy"], "interval": pooled["interval"],
            "difference": pooled["difference"], "difference_interval": [low, high],
            "gained": pooled["gained"], "lost": pooled["lost"], "p": pooled["p"],
            "worst_position": int(worst), "worst_vanilla": vanilla[worst]["accuracy"], "worst_method": row[worst]["accuracy"],
        })  # fmt: skip
    return out


def format_rows(table: Sequence[Mapping]) -> str:
    lines = ["| condition | curve | samples | vanilla [95 %] | curve [95 %] | difference [95 %] | gained / lost | p | "
             "worst position: vanilla → curve |", "|---|---|---:|---|---|---|---|---|---|"]
    for r in table:
        lines.append(
            f"| {r['condition']} | {r['method']} | {r['n']} | {r['vanilla']:.3f} [{r['vanilla_interval'][0]:.2f}, "
            f"{r['vanilla_interval'][1]:.2f}] | {r['accuracy']:.3f} [{r['interval'][0]:.2f}, {r['interval'][1]:.2f}] | "
            f"{100 * r['difference']:+.1f} [{100 * r['difference_interval'][0]:+.1f}, {100 * r['difference_interval'][1]:+.1f}] | "
            f"{r['gained']} / {r['lost']} | {format_p(r['p'])} | {r['worst_position']} %: {r['worst_vanilla']:.2f} → "
            f"{r['worst_method']:.2f} |")
    return "\n".join(lines)


def plot_rows(table: Sequence[Mapping], path: Path, title: str = "Searched curves on conditions no search saw") -> Path:
    """Each curve's gain over vanilla per condition, with its 95 % interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lpes_harness.core.files import save_figure

    conditions = list(dict.fromkeys(r["condition"] for r in table))
    methods = list(dict.fromkeys(r["method"] for r in table))
    figure, axes = plt.subplots(figsize=(1.6 + 1.3 * len(conditions), 4))
    width = 0.8 / len(methods)
    for k, method in enumerate(methods):
        for i, condition in enumerate(conditions):
            found = [r for r in table if r["condition"] == condition and r["method"] == method]
            if not found:
                continue
            r = found[0]
            x, y = i + (k - (len(methods) - 1) / 2) * width, 100 * r["difference"]
            err = [[y - 100 * r["difference_interval"][0]], [100 * r["difference_interval"][1] - y]]
            axes.errorbar(x, y, yerr=err, fmt="o", color=f"C{k}", capsize=3, label=method if i == 0 else None)
    axes.axhline(0, color="grey", linewidth=0.8)
    axes.set_xticks(range(len(conditions)), conditions, rotation=20, ha="right")
    axes.set_ylabel("accuracy gain over vanilla (points, 95 %)")
    axes.set_title(title)
    axes.legend(fontsize=8)
    figure.tight_layout()
    save_figure(figure, path)
    plt.close(figure)
    return path
