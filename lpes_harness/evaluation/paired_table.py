"""The paired table: accuracy with 95 % intervals by method and position, each method tested
against the baseline on the same samples, and how it is written (markdown, terminal, plot, json).

:mod:`.paired` scores the samples; this module only reads the per-sample scores it stored
(``{"scores": {method: {percent: [0/1, ...]}}, ...}``), so a stored run can be re-rendered
without scoring anything again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lpes_harness.evaluation.stats import accuracy_with_interval, compare_paired, format_p

ALPHA = 0.05


def paired_table(scored: Mapping, baseline: str | None = None, alpha: float = ALPHA) -> dict:
    """Accuracy with 95 % intervals per method and position, and paired tests against ``baseline``."""
    scores = {name: {int(p): list(v) for p, v in by_pos.items()} for name, by_pos in scored["scores"].items()}
    names = list(scores)
    baseline = baseline or names[0]
    if baseline not in scores:
        raise ValueError(f"baseline {baseline!r} is not among the methods {names}")
    percents = sorted(scores[baseline])
    # equal samples per position: the mean of all positions pooled is the average
    pooled = {name: [v for p in percents for v in by_pos[p]] for name, by_pos in scores.items()}
    rows = {}
    for name in names:
        row = {}
        for percent in percents + ["average"]:
            if percent == "average":
                mine, base = pooled[name], pooled[baseline]
            else:
                mine, base = scores[name][percent], scores[baseline][percent]
            cell = accuracy_with_interval(mine)
            if name != baseline:
                cell.update(_paired(mine, base))
                cell["significant"] = cell["p"] < alpha
            row[str(percent)] = cell
        worst = min(percents, key=lambda p: row[str(p)]["accuracy"])
        row["worst"] = {"position": worst, "accuracy": row[str(worst)]["accuracy"]}
        rows[name] = row
    return {"baseline": baseline, "positions": percents, "alpha": alpha, "rows": rows,
            "versus_pi": _versus_own_pi(pooled),
            "versus_baselines": _versus_baselines(pooled, scored.get("methods") or {}),
            **{k: scored[k] for k in ("task", "split", "num_samples", "mode", "chat_template", "layer_type",
                                      "position_layer_type") if k in scored}}


def _paired(method: list, baseline: list) -> dict:
    """What a table keeps of a paired test: the difference, gained / lost and exact p."""
    test = compare_paired(method, baseline)
    return {k: test[k] for k in ("difference", "gained", "lost", "p")}


def _is_curve(name: str) -> bool:
    return name == "LPES" or name.startswith("LPES ")


def _versus_own_pi(pooled: Mapping[str, list]) -> dict:
    """Each curve against its own PI over all positions pooled: the gain of the per-layer shape
    over the same mean applied uniformly. Rows pair by name: ``LPES`` / ``PI``, ``LPES x`` / ``PI x``."""
    pairs = {name: "PI" + name[len("LPES"):] for name in pooled if _is_curve(name)}
    return {name: {"pi": pi, **_paired(pooled[name], pooled[pi])} for name, pi in pairs.items() if pi in pooled}


def _versus_baselines(pooled: Mapping[str, list], methods: Mapping) -> dict:
    """Each curve against each baseline model (the rows whose method is a ``model:args`` spec), all
    positions pooled: "above every baseline" is a paired claim on the same samples, like the rest."""
    others = [name for name in pooled if isinstance(methods.get(name), str)]
    # A stack's row ("LPES x + PCD", a model spec) is named like a curve but is a baseline model: not a curve here,
    # or it would be tested against itself and the other baselines.
    return {curve: {other: _paired(pooled[curve], pooled[other]) for other in others}
            for curve in pooled if _is_curve(curve) and curve not in others and others}


def _pooled_lines(table: Mapping) -> list[str]:
    """One line per pooled test: each curve against its PI, then against each baseline model."""
    kind = table.get("layer_type")
    how = f"its mean, on every {kind} layer" if kind else "its mean, uniform"
    tests = [(f"{name} vs {test['pi']} ({how})", test) for name, test in (table.get("versus_pi") or {}).items()]
    tests += [(f"{name} vs {other}", test)
              for name, by_other in (table.get("versus_baselines") or {}).items() for other, test in by_other.items()]
    return [f"{label}, all positions: {test['difference'] * 100:+.1f} pts, +{test['gained']}/−{test['lost']}, "
            f"p={format_p(test['p'])}" for label, test in tests]


def format_table(table: Mapping) -> str:
    """Markdown: accuracy [95 % interval] by position; Δ vs the baseline with gains/losses and p."""
    positions = [str(p) for p in table["positions"]] + ["average"]
    head = "| method | " + " | ".join(f"{p} %" if p != "average" else "average" for p in positions) + " | worst |"
    lines = [head, "|---|" + "---:|" * (len(positions) + 1)]
    for name, row in table["rows"].items():
        cells = []
        for p in positions:
            cell = row[p]
            low, high = cell["interval"]
            text = f"{cell['accuracy']:.3f} [{low:.2f}, {high:.2f}]"
            if "p" in cell:
                sign = "+" if cell["difference"] >= 0 else "−"
                text += f"<br>{sign}{abs(cell['difference']) * 100:.1f} pts, +{cell['gained']}/−{cell['lost']}, p={format_p(cell['p'])}"
                if cell["significant"]:
                    text = f"**{text}**"
            cells.append(text)
        worst = row["worst"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {worst['accuracy']:.3f} ({worst['position']} %) |")
    lines.append("")
    lines.append(
        f"{table.get('task', '')} {table.get('split', '')} split, {table.get('num_samples', '?')} samples per position, "
        f"the same samples for every method. [..]: 95 % Wilson interval. Second line: difference from "
        f"{table['baseline']}, samples gained/lost, exact McNemar p; bold: p < {table['alpha']}."
        + (f" PI and uniform rows scale only the {table['layer_type']} layers; the others stay at 1."
           if table.get("layer_type") else "")
        + (f" Their position factors move only the {table['position_layer_type']} layers."
           if table.get("position_layer_type") else "")
    )
    lines.extend(f"\n{line}" for line in _pooled_lines(table))
    return "\n".join(lines)


def format_plain(table: Mapping) -> str:
    """A compact terminal table (what ``make demo`` and the end of a search print)."""
    positions = [str(p) for p in table["positions"]] + ["average"]
    width = max(10, *(len(name) for name in table["rows"]))
    lines = [f"{'method':<{width}} " + " ".join(f"{p + ('%' if p != 'average' else ''):>21}" for p in positions)]
    for name, row in table["rows"].items():
        cells = []
        for p in positions:
            cell = row[p]
            low, high = cell["interval"]
            cells.append(f"{cell['accuracy']:.2f} [{low:.2f},{high:.2f}]".rjust(21))
        lines.append(f"{name:<{width}} " + " ".join(cells))
        if any("p" in row[p] for p in positions):
            tests = []
            for p in positions:
                cell = row[p]
                mark = "*" if cell["significant"] else " "
                tests.append(f"{cell['difference'] * 100:+.1f} p={format_p(cell['p'])}{mark}".rjust(21))
            lines.append(f"{'  vs ' + table['baseline']:<{width}} " + " ".join(tests))
    lines.append(f"[..] 95 % Wilson interval; vs {table['baseline']}: difference in points and exact McNemar p "
                 f"on the same samples (* p < {table['alpha']})")
    lines.extend(_pooled_lines(table))
    return "\n".join(lines)


def plot_table(table: Mapping, path: str | Path) -> Path:
    """Accuracy by gold position with 95 % intervals, one line per method (:func:`lpes_harness.evaluation.plots.plot_paired`)."""
    from lpes_harness.evaluation.plots import plot_paired

    path = Path(path)
    plot_paired(table, path)
    return path


def write_comparison(table: Mapping, scored: Mapping, directory: str | Path, stem: str = "heldout") -> dict:
    """``<stem>.json`` (per-sample scores and the table), ``<stem>.md`` and ``<stem>.png``."""
    from lpes_harness.core.files import atomic_write_json

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_json(directory / f"{stem}.json", {"table": table, "scored": scored})
    (directory / f"{stem}.md").write_text(format_table(table) + "\n", encoding="utf-8")
    plot_table(table, directory / f"{stem}.png")
    return {"json": directory / f"{stem}.json", "md": directory / f"{stem}.md", "png": directory / f"{stem}.png"}
