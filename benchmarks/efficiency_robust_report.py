"""``benchmarks/robust_efficiency.py``'s report: ``efficiency.md``, ``efficiency.json`` and ``efficiency.png``
from the cells it planned and the held-out tables ``commands.transfer`` wrote under the same folder."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

METHOD_NAMES = {
    "ga-cpu": "GA, CPU profile (`robust-smollm2`, the CPU default before the race)",
    "ga-gpu": "GA, GPU profile (`robust-smollm2-gpu`)",
    "gradient": "gradient search (`gradient-smollm2`: two lines, Adam on the margin loss)",
    "race": "race of random lines, every item (`racing-smollm2`, the default)",
}


def row_name(cell: dict, rows) -> str:
    """The held-out table's name for a cell's curve: ``LPES <name>``, or ``uniform ... (PI) <name>`` for a curve that is
    one factor a scaling (``commands.paired`` names a row for what it holds)."""
    if cell["row"] == "vanilla":
        return "vanilla"
    found = [row for row in rows if row == f"LPES {cell['row']}" or row.endswith(f"(PI) {cell['row']}")]
    if len(found) != 1:
        raise ValueError(f"no single row for {cell['row']!r} among {sorted(rows)}")
    return found[0]


def describe(scales: list[float]) -> str:
    """A curve of both scalings as its ends over depth; one factor a scaling on every layer is PI, named so."""
    half = len(scales) // 2
    position, base = scales[:half], scales[half:]
    if len(scales) == half * 2 and len(set(position)) == 1 and len(set(base)) == 1:
        return "the plain model" if position[0] == base[0] == 1 else f"uniform position {position[0]:.3g}, base {base[0]:.3g} (PI)"
    return f"position {position[0]:.2f} → {position[-1]:.2f}, base {base[0]:.2f} → {base[-1]:.2f}"


def points(value: float) -> str:
    return f"{100 * value:+.1f}"


def gain_text(result: dict) -> str:
    """The difference with its interval and p; bold where p < 0.05. A row that is the plain model says so."""
    from lpes_harness.evaluation.stats import format_p

    if result["gained"] == result["lost"] == 0 and result["accuracy"] == result["baseline_accuracy"]:
        return "= vanilla"
    low, high = result["difference_interval"]
    text = f"{points(result['difference'])} [{points(low)}, {points(high)}], p = {format_p(result['p'])}"
    return f"**{text}**" if result["p"] < 0.05 else text


def mean_difference(a: list[float], b: list[float]) -> dict:
    """Two lists of per-sample accuracies, each a mean over a method's seeds (so not 0/1), paired on the samples:
    the mean difference with a paired bootstrap 95 % interval and a paired permutation p (seeded)."""
    import numpy as np

    from lpes_harness.evaluation.stats import compare_paired_resampled

    found = compare_paired_resampled([(np.asarray(a)[:, None], np.asarray(b)[:, None], lambda means: means[..., 0])])
    return {key: found[key] for key in ("difference", "difference_interval", "p", "n")}


def score_cells(output: Path, cells: list[dict], conditions: list[str]) -> tuple[list[dict], dict]:
    """Every cell's gain over vanilla per condition and pooled; the per-sample scores of every row, pooled."""
    from lpes_harness.evaluation import pooled
    from lpes_harness.evaluation.conditions import slug
    from lpes_harness.evaluation.stats import compare_paired

    tables = {name: pooled.load_table(output / slug(name)) for name in conditions}
    vanilla = {name: pooled.pooled_scores([table], "vanilla") for name, table in tables.items()}
    every = {}
    for cell in cells:
        row = cell["table_row"] = row_name(cell, tables[conditions[0]]["scores"])
        per = {name: pooled.pooled_scores([table], row) for name, table in tables.items()}
        cell["conditions"] = {name: compare_paired(per[name], vanilla[name]) for name in conditions}
        flat = [s for name in conditions for s in per[name]]
        cell["pooled"] = compare_paired(flat, [s for name in conditions for s in vanilla[name]])
        worst = min(conditions, key=lambda name: cell["conditions"][name]["difference"])
        cell["worst"] = {"condition": worst, **cell["conditions"][worst]}
        every[row] = flat
    every["vanilla"] = [s for name in conditions for s in vanilla[name]]
    return cells, every


def groups(cells: list[dict]) -> dict[tuple, list[dict]]:
    out = {}
    for cell in cells:
        out.setdefault((cell["method"], cell["budget"]), []).append(cell)
    return out


def summary(cells: list[dict], every: dict) -> list[dict]:
    """Per method and budget: the seeds' mean pooled gain, the worst seed's worst condition, and the
    method's seed-averaged per-sample accuracy against the race's (the default), paired on the samples."""
    race = [c for c in cells if c["method"] == "race"]
    race_mean = [statistics.fmean(values) for values in zip(*(every[c["table_row"]] for c in race))]
    out = []
    for (method, budget), members in groups(cells).items():
        mean = [statistics.fmean(values) for values in zip(*(every[c["table_row"]] for c in members))]
        out.append({"method": method, "budget": budget, "seeds": [c["seed"] for c in members],
                    "forwards_used": [c["forwards_used"] for c in members],
                    "mean_pooled_gain": statistics.fmean(c["pooled"]["difference"] for c in members),
                    "worst": min((c["worst"] for c in members), key=lambda w: w["difference"]),
                    "against_race": None if method == "race" else mean_difference(mean, race_mean)})
    return out


def format_report(cells: list[dict], rows: list[dict], settings: dict) -> str:
    from lpes_harness.evaluation.stats import format_p

    names = list(settings["conditions"])
    lines = [f"# Robust efficiency: held-out gain over vanilla per condition, {settings['num_samples']} samples per "
             f"gold position and condition (metadata seed {settings['seed']}, {settings['dtype']})", "",
             "| method | budget | seed | forwards used | curve | " + " | ".join(names) + " | pooled | worst |",
             "|" + "---|" * (7 + len(names))]
    for cell in cells:
        per = " | ".join(gain_text(cell["conditions"][name]) for name in names)
        worst = cell["worst"]
        curve = cell["row"] if "scales" not in cell else f"{cell['row']}: {describe(cell['scales'])}"
        lines.append(f"| {cell['method']} | {cell['budget']} | {cell['seed']} | {cell['forwards_used']:,} | {curve} | "
                     f"{per} | {gain_text(cell['pooled'])} | {worst['condition']} {points(worst['difference'])} |")
    lines += ["", "## Per method and budget (seeds pooled)", "",
              "| method | budget | seeds | mean pooled gain | worst seed, worst condition | seed-averaged accuracy − the race's: points [95 %], p |",
              "|---|---|---|---|---|---|"]
    for row in rows:
        worst, race = row["worst"], row["against_race"]
        against = "—" if race is None else (f"{points(race['difference'])} [{points(race['difference_interval'][0])}, "
                                            f"{points(race['difference_interval'][1])}], p = {format_p(race['p'])}")
        lines.append(f"| {row['method']} | {row['budget']} | {', '.join(map(str, row['seeds']))} | "
                     f"{points(row['mean_pooled_gain'])} | {worst['condition']} {points(worst['difference'])} "
                     f"(p = {format_p(worst['p'])}) | {against} |")
    lines += ["", "Last column: each method's accuracy per sample averaged over its seeds, minus the race's over its "
              "seeds, on the same samples (all conditions pooled): paired bootstrap interval, paired permutation p "
              "(`lpes_harness.evaluation.stats.compare_paired_resampled`, 10,000 resamples, seed 0).", "",
              "Methods:", *[f"- `{key}`: {text}" for key, text in METHOD_NAMES.items()]]
    return "\n".join(lines)


def plot(cells: list[dict], conditions: list[str], path: Path) -> None:
    """Pooled held-out gain against forwards used: one colour per method, seeds as points, each with its
    interval; the worst condition as a hollow marker below it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    colours = dict(zip(METHOD_NAMES, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    seen = set()
    for cell in cells:
        x, gain = cell["forwards_used"], 100 * cell["pooled"]["difference"]
        low, high = (100 * v for v in cell["pooled"]["difference_interval"])
        label = None if cell["method"] in seen else cell["method"]
        seen.add(cell["method"])
        colour = colours.get(cell["method"], "black")
        marker = "*" if cell["budget"] == "final" else "o"
        ax.errorbar(x, gain, yerr=[[gain - low], [high - gain]], fmt=marker, color=colour, label=label, capsize=2,
                    markersize=10 if marker == "*" else 5)
        ax.plot(x, 100 * cell["worst"]["difference"], marker="v", mfc="none", color=colour, linestyle="none")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("search forwards used (log; a backward counts two)")
    ax.set_ylabel("held-out gain over vanilla, points")
    ax.set_title(f"pooled over {', '.join(conditions)} (dots, 95 % interval);\n"
                 "worst condition (hollow triangles); star: the GPU seed 1 curve as chosen", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(output: Path, cells: list[dict], settings: dict) -> None:
    from lpes_harness.core.files import atomic_write_json, atomic_write_text

    cells, every = score_cells(output, cells, list(settings["conditions"]))
    rows = summary(cells, every)
    text = format_report(cells, rows, settings)
    print(text)
    atomic_write_text(output / "efficiency.md", text + "\n")
    record = {"settings": settings, "cells": [{k: v for k, v in c.items() if k != "scales"} for c in cells],
              "summary": rows}
    atomic_write_json(output / "efficiency.json", record, indent=1)
    plot(cells, list(settings["conditions"]), output / "efficiency.png")
