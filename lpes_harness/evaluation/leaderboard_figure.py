"""The leaderboard's picture (issue #97): accuracy by gold position on every board, vanilla against the best
LPES row and the best rival, from the committed records the page reads (nothing is scored again).

:func:`figure_data` picks each board's three rows (:func:`picked_rows`) and computes every number the
picture shows: each row's accuracy, 95 % Wilson interval and sample count per gold position and pooled,
rounded as drawn. :func:`draw_figure` draws exactly those numbers, one panel per board, side by side;
:func:`write_figure` writes the PNG and the numbers beside it as JSON, which
``tests/test_leaderboard_figure.py`` compares with the records, so the picture cannot go stale unseen.

The rival is the best row of a method that is neither LPES nor PI. A PI row is one factor on every layer:
the flat case of an LPES curve, found by the same search (its uniform sweep and start), so it measures
what the per-layer shape adds, not what another method does. It is not hidden: each panel names the
best PI row and its pooled accuracy, drawn or not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.evaluation.leaderboard import best_lpes, ranked, vanilla_of
from lpes_harness.evaluation.leaderboard_boards import BOARDS, Board
from lpes_harness.evaluation.leaderboard_rows import Row, is_lpes, read_table
from lpes_harness.evaluation.plots import new_figure, save_agg
from lpes_harness.evaluation.stats import wilson_interval

SOURCE = "docs/leaderboard.md"
DIGITS = 4  # finer than a panel can show; the JSON holds the numbers as drawn
SPREAD = 1.5  # points of gold position between the rows' markers, so that their error bars do not overlap
STYLE = {"vanilla": ("tab:gray", "s"), "best LPES row": ("tab:blue", "o"), "best rival": ("tab:orange", "^")}


def is_pi(row: Row) -> bool:
    return row.entry is not None and row.entry.name == "pi"


def best_rival(rows: Sequence[Row]) -> Row | None:
    """The best row of another method: not vanilla, not LPES of any scaling, not PI (see the module)."""
    return next((row for row in ranked(rows) if row.entry is not None and not is_lpes(row) and not is_pi(row)), None)


def picked_rows(rows: Sequence[Row], where: str) -> dict[str, Row]:
    """Role -> row: vanilla, the best LPES row, the best rival; a role the board has no row for is left out."""
    picked = {"vanilla": vanilla_of(rows, where), "best LPES row": best_lpes(rows), "best rival": best_rival(rows)}
    return {role: row for role, row in picked.items() if row is not None}


def accuracy(scores: Sequence[int]) -> dict:
    low, high = wilson_interval(sum(scores), len(scores))
    return {"accuracy": round(sum(scores) / len(scores), DIGITS), "interval": [round(low, DIGITS), round(high, DIGITS)],
            "n": len(scores)}


def board_data(board: Board, root: Path) -> dict:
    """One panel's numbers. A row's scores run position by position, ``per_position`` each (read_table's order)."""
    table = read_table(board.sources, root)
    size = table.per_position
    rows = []
    for role, row in picked_rows(table.rows, board.model).items():
        by_position = [{"position": position, **accuracy(row.scores[k * size:(k + 1) * size])}
                       for k, position in enumerate(table.positions)]
        rows.append({"role": role, "name": row.name, "method": "vanilla" if row.entry is None else row.entry.label,
                     "pooled": accuracy(row.scores), "by_position": by_position})
    best_pi = next((row for row in ranked(table.rows) if is_pi(row)), None)
    return {"model": board.model.partition(" (")[0],  # the name, without the page's aside
            "setting": board.figure_setting, "machine": board.figure_machine,
            "samples": size * len(table.positions), "per_position": size, "positions": list(table.positions),
            "rows": rows,
            "best_pi_row": None if best_pi is None else {"name": best_pi.name, **accuracy(best_pi.scores)}}


def figure_data(boards: Sequence[Board] = BOARDS, root: Path = Path(".")) -> dict:
    """Every number the picture shows, board by board, from the committed records under ``root``."""
    return {"source": SOURCE, "boards": [board_data(board, root) for board in boards]}


def share(value: float) -> str:
    return f"{value:.3f}".removeprefix("0")


def draw_panel(axes, panel: Mapping) -> None:
    positions = panel["positions"]
    for k, row in enumerate(panel["rows"]):
        color, marker = STYLE[row["role"]]
        points = row["by_position"]
        xs = [point["position"] + (k - (len(panel["rows"]) - 1) / 2) * SPREAD for point in points]
        ys = [point["accuracy"] for point in points]
        below = [point["accuracy"] - point["interval"][0] for point in points]
        above = [point["interval"][1] - point["accuracy"] for point in points]
        named = row["role"] if row["name"] == row["role"] else f"{row['role']}: {row['name']} ({row['method']})"
        axes.errorbar(xs, ys, yerr=[below, above], color=color, marker=marker, capsize=3,
                      label=f"{named}, {share(row['pooled']['accuracy'])}")
    axes.set_xticks(positions)
    axes.set_xlabel("gold position (% of the context)")
    axes.set_ylabel("accuracy (95 % Wilson interval)")
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    axes.set_title(f"{panel['model']}\n{panel['setting']}\n{panel['samples']:,} samples, "
                   f"{panel['per_position']} per gold position", fontsize=9)
    # under the panel: inside it would cover a dip (vanilla's middle) on one model or the other
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), title="pooled accuracy, all positions",
                title_fontsize=8)


def footnote(data: Mapping) -> str:
    """What the rival is, the best PI row (drawn or not), where each board ran, and the source."""
    lines = ["Rival: the best row of a method other than LPES and PI (a PI row is one factor on every layer, "
             "the flat case of an LPES curve). "
             f"Rows are set {SPREAD:g} points apart on x so that their intervals do not overlap."]
    for panel in data["boards"]:
        pi = panel["best_pi_row"]
        named = f"; best PI row (not drawn): {pi['name']}, {share(pi['accuracy'])}" if pi else ""
        lines.append(f"{panel['model']}: scored on {panel['machine']}{named}.")
    lines.append(f"Source: {data['source']} (committed per-sample records, nothing scored again).")
    return "\n".join(lines)


def draw_figure(data: Mapping, path: Path) -> None:
    """One panel per board, side by side, one PNG; draws only what ``data`` holds."""
    figure = new_figure(figsize=(6 * len(data["boards"]), 5.4))
    panels = figure.subplots(1, len(data["boards"]), squeeze=False)[0]
    for axes, panel in zip(panels, data["boards"]):
        draw_panel(axes, panel)
    figure.tight_layout()
    # below everything drawn (the legends hang under the panels); the saved PNG's tight box takes it in
    figure.text(0.01, -0.02, footnote(data), fontsize=7.5, va="top", ha="left")
    save_agg(figure, Path(path))


def write_figure(path: Path, boards: Sequence[Board] = BOARDS, root: Path = Path(".")) -> Path:
    """The picture at ``path`` and its numbers beside it (``path`` with ``.json``); returns the JSON's path."""
    from lpes_harness.core.files import atomic_write_text

    data = figure_data(boards, root)
    draw_figure(data, Path(path))
    numbers = Path(path).with_suffix(".json")
    atomic_write_text(numbers, readable_json(data) + "\n")
    return numbers


def readable_json(value, indent: str = "") -> str:
    """JSON with one line per leaf record (a position's accuracy, interval and n), so a diff shows what moved."""
    inner = indent + "  "
    if isinstance(value, dict) and any(isinstance(v, (dict, list)) and v and not _is_leaf(v) for v in value.values()):
        items = [f"{inner}{json.dumps(key)}: {readable_json(v, inner)}" for key, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and value and not _is_leaf(value):
        return "[\n" + ",\n".join(inner + readable_json(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False)


def _is_leaf(value) -> bool:
    """A list of numbers, or a record of numbers and such lists: one line."""
    items = value.values() if isinstance(value, dict) else value
    return all(not isinstance(v, (dict, list)) or (isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v))
               for v in items)
