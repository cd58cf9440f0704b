"""The leaderboard of one ``lpes-compare`` run: its rows' held-out 0/1 scores ranked, paired, drawn.

:func:`build_board` turns the rows (each a method at one setting, scored on the same held-out samples
in the same order) into a JSON-ready dict: every row's pooled accuracy with its Wilson interval, its
paired difference to vanilla and to the best row (exact McNemar, :func:`~.stats.compare_paired`), by
condition and by gold position, what tuning it cost and its latency ratio to vanilla.
:func:`write_board` writes that dict as ``leaderboard.json``, ``leaderboard.md``, ``positions.png`` and
``gains.png``, each atomically (a reader never sees half a board).

The page must say where LPES is not first: the headline names the method that beats the best LPES
row, by how much and how surely, rather than leaving the reader to find it in the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.core.files import atomic_write_json, atomic_write_text
from lpes_harness.evaluation.plots import new_figure, save_agg
from lpes_harness.evaluation.stats import compare_paired, difference, format_p, share, wilson_interval
from lpes_harness.methods import METHODS, entry_of

ALPHA = 0.05  # a paired difference below this p is bold on the page
VANILLA = "vanilla"  # the required row's name, and the method name of the plain model
LPES_METHODS = ("lpes", "lpes_base", "lpes_both")  # PI is rope.py's install too, but not a searched curve
FILES = ("leaderboard.json", "leaderboard.md", "positions.png", "gains.png")
LATENCY_NOTE = ("Latency: median seconds of one prefill forward of the same held-out prompt, on this machine, "
                "in this run; compare ratios within this board only.")


# ---------------------------------------------------------------- checking the rows

def _check_rows(rows: Sequence[Mapping]) -> tuple[list[str], list[int]]:
    """The conditions and gold percents every row shares; ValueError naming the first row that differs.

    Pairing is by index, so a row with one sample more or less anywhere would silently pair the
    wrong samples: refuse it rather than compare.
    """
    names = [row.get("name") for row in rows]
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"every row needs a non-empty string name, got {name!r}")
        if names.count(name) > 1:
            raise ValueError(f"row {name!r} appears {names.count(name)} times; row names must be unique")
    if VANILLA not in names:
        raise ValueError(f"no row named {VANILLA!r} (the plain model) to pair the others with; rows: {names}")
    for row in rows:
        _check_fields(row)
    reference = rows[names.index(VANILLA)]["scores"]
    conditions = list(reference)
    if not conditions or not all(reference[c] for c in conditions):
        raise ValueError(f"row {VANILLA!r} has no scores (no condition, or a condition with no gold position)")
    percents = sorted(int(p) for p in reference[conditions[0]])
    for row in rows:
        _check_shape(row, reference, conditions, percents)
    return conditions, percents


def _check_fields(row: Mapping) -> None:
    name, method = row["name"], row.get("method")
    if method != VANILLA and entry_of(method) is None:
        raise ValueError(f"row {name!r}: method {method!r} is neither {VANILLA!r}, a key of METHODS "
                         f"({', '.join(METHODS)}) nor lpes+ one that stacks")
    if name == VANILLA and method != VANILLA:
        raise ValueError(f"row {VANILLA!r} must be the plain model (method {VANILLA!r}), got {method!r}")
    required = ("setting", "scores") + (() if method == VANILLA else ("tuning_forwards", "candidates"))
    missing = [key for key in required if key not in row]
    if missing:
        raise ValueError(f"row {name!r} lacks {', '.join(missing)}")
    if not isinstance(row["scores"], Mapping):
        raise ValueError(f"row {name!r}: scores must map condition -> gold percent -> 0/1 list")


def _check_shape(row: Mapping, reference: Mapping, conditions: list[str], percents: list[int]) -> None:
    name, scores = row["name"], row["scores"]
    if sorted(scores) != sorted(conditions):
        raise ValueError(f"row {name!r}: conditions {sorted(scores)} differ from {VANILLA!r}'s {sorted(conditions)}")
    for condition in conditions:
        mine = {int(p): values for p, values in scores[condition].items()}
        if sorted(mine) != percents:
            raise ValueError(f"row {name!r}, condition {condition!r}: gold percents {sorted(mine)} differ from "
                             f"{percents}")
        for percent in percents:
            theirs = _at(reference, condition, percent)
            if len(mine[percent]) != len(theirs):
                raise ValueError(f"row {name!r}, condition {condition!r}, position {percent}: {len(mine[percent])} "
                                 f"samples where {VANILLA!r} has {len(theirs)}; rows are paired by index")
            if any(value not in (0, 1) for value in mine[percent]):
                raise ValueError(f"row {name!r}, condition {condition!r}, position {percent}: scores must be 0/1")


def _at(scores: Mapping, condition: str, percent: int) -> list:
    """One cell of a row's scores, whether its percents are ints or (from JSON) strings."""
    cell = scores[condition]
    return list(cell[percent] if percent in cell else cell[str(percent)])


# ---------------------------------------------------------------- one row

def _pooled(scores: Mapping, conditions: Sequence[str], percents: Sequence[int]) -> list[int]:
    """All samples in one fixed order (condition, then percent, then index): the same for every row."""
    return [int(v) for c in conditions for p in percents for v in _at(scores, c, p)]


def _plain(test: Mapping) -> dict:
    """compare_paired's result with lists for tuples, so the board survives a JSON round trip unchanged."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in test.items()}


def _accuracy(values: Sequence[int]) -> float:
    return sum(values) / len(values)


def _row_entry(row: Mapping, conditions: list[str], percents: list[int]) -> dict:
    """What the board says of one row, before anything is paired."""
    pooled = _pooled(row["scores"], conditions, percents)
    method = row["method"]
    entry = entry_of(method) if method != VANILLA else None
    by_position = {str(p): _accuracy([int(v) for c in conditions for v in _at(row["scores"], c, p)])
                   for p in percents}
    return {
        "name": row["name"], "method": method, "label": entry.label if entry else VANILLA,
        "setting": row["setting"], "forwards_per_token": entry.forwards if entry else "1",
        "tuning_forwards": int(row.get("tuning_forwards", 0)), "candidates": int(row.get("candidates", 0)),
        "n": len(pooled), "accuracy": _accuracy(pooled), "interval": list(wilson_interval(sum(pooled), len(pooled))),
        "by_condition": {c: _accuracy(_pooled(row["scores"], [c], percents)) for c in conditions},
        "by_position": by_position,
        "latency": None if row.get("latency") is None else float(row["latency"]),
        "note": row.get("note") or None,
    }


def _pair(entries: list[dict], pooled: Mapping[str, list[int]], rows: Mapping[str, Mapping],
          conditions: list[str], percents: list[int]) -> None:
    """Each entry's paired tests against vanilla (pooled and per condition) and against the best row."""
    best, vanilla = entries[0], next(e for e in entries if e["name"] == VANILLA)
    for entry in entries:
        name = entry["name"]
        entry["vs_vanilla"] = None if name == VANILLA else {
            **_plain(compare_paired(pooled[name], pooled[VANILLA])),
            "by_condition": {c: _plain(compare_paired(_pooled(rows[name]["scores"], [c], percents),
                                                      _pooled(rows[VANILLA]["scores"], [c], percents)))
                             for c in conditions},
        }
        entry["vs_best"] = None if entry is best else _plain(compare_paired(pooled[name], pooled[best["name"]]))
        ratio = None
        if entry["latency"] is not None and vanilla["latency"]:  # a zero or missing baseline gives no ratio
            ratio = entry["latency"] / vanilla["latency"]
        entry["latency_ratio"] = ratio


# ---------------------------------------------------------------- the board

def build_board(rows: Sequence[Mapping], *, title: str, command: str, machine: str,
                notes: Sequence[str] = ()) -> dict:
    """The leaderboard of ``rows`` (see the module's docstring), as a JSON-serialisable dict."""
    conditions, percents = _check_rows(rows)
    by_name = {row["name"]: row for row in rows}
    pooled = {name: _pooled(row["scores"], conditions, percents) for name, row in by_name.items()}
    # Python's sort is stable: rows of equal accuracy stay in the order they were given.
    entries = sorted((_row_entry(row, conditions, percents) for row in rows), key=lambda e: -sum(pooled[e["name"]]))
    _pair(entries, pooled, by_name, conditions, percents)
    lpes = next((e for e in entries if e["method"] in LPES_METHODS), None)
    other = next((e for e in entries if e["method"] not in LPES_METHODS and e["method"] != VANILLA), None)
    board = {
        "title": title, "command": command, "machine": machine, "notes": list(notes),
        "conditions": conditions, "positions": percents, "rows": entries, "best": entries[0]["name"],
        "best_lpes": lpes["name"] if lpes else None, "best_other": other["name"] if other else None,
    }
    board["headline"] = _headline(entries, lpes, other, pooled)
    return board


def _headline(entries: list[dict], lpes: dict | None, other: dict | None, pooled: Mapping[str, list[int]]) -> list[str]:
    """Who is first and by how much over vanilla; then whether an LPES row is first, and if not, what beats it."""
    top = entries[0]
    if top["name"] == VANILLA:
        lines = [f"**First: {VANILLA}** (the plain model), {share(top['accuracy'])}: no row is above it."]
    else:
        gain = top["vs_vanilla"]
        lines = [f"**First: {top['name']}** ({top['label']}), {share(top['accuracy'])}, {difference(gain)} points "
                 f"over vanilla, p = {format_p(gain['p'])}."]
    if lpes is None:
        return lines + ["No LPES row is on this board."]
    if lpes is top:
        lines.append(f"An LPES row is first: {lpes['name']} ({lpes['label']}).")
        if other is not None:
            lead = compare_paired(pooled[lpes["name"]], pooled[other["name"]])
            lines.append(f"Against the best row of another method, {other['name']} ({other['label']}): "
                         f"{difference(lead)} points, p = {format_p(lead['p'])}.")
        return lines
    if top["name"] == VANILLA:  # no method to name: the best LPES row against the plain model
        gain = lpes["vs_vanilla"]
        lines.append(f"The best LPES row, {lpes['name']} ({lpes['label']}), against vanilla: {difference(gain)} points, "
                     f"p = {format_p(gain['p'])}.")
        return lines
    # Stated from the winner's side, so the sign reads as "beats by".
    behind = compare_paired(pooled[top["name"]], pooled[lpes["name"]])
    verb = "beats" if behind["difference"] > 0 else "ties with (listed first by input order)"
    lines.append(f"**LPES is not first**: {top['label']} ({top['name']}) {verb} the best LPES row, {lpes['name']} "
                 f"({lpes['label']}), by {difference(behind)} points, p = {format_p(behind['p'])}.")
    return lines


# ---------------------------------------------------------------- the page

def _cell(text) -> str:
    """Text that cannot break a markdown table (a ``|`` or a newline in a setting would)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _interval_text(value: float, interval: Sequence[float]) -> str:
    return f"{share(value)} [{share(interval[0])}, {share(interval[1])}]"


def _vs_vanilla_cell(test: Mapping | None) -> str:
    if test is None:
        return ""
    text = f"{difference(test)}, {test['gained']} / {test['lost']}, p = {format_p(test['p'])}"
    return f"**{text}**" if test["p"] < ALPHA else text


def _tuning_cell(entry: Mapping) -> str:
    if entry["method"] == VANILLA:
        return ""
    if not entry["candidates"] and not entry["tuning_forwards"]:
        return "not tuned"
    return f"{entry['tuning_forwards']:,} forwards, {entry['candidates']} candidates"


def _latency_cell(entry: Mapping) -> str:
    return "not measured" if entry["latency_ratio"] is None else f"{entry['latency_ratio']:.2f}x"


def _main_table(board: Mapping) -> list[str]:
    lines = ["| # | row | method | setting | accuracy [95 %] | vs vanilla: points [95 %], gained / lost, p "
             "| vs best: points [95 %], p | tuned on (forwards, candidates) | forwards per token "
             "| latency vs vanilla |",
             "|---:|---|---|---|---|---|---|---|---|---|"]
    for rank, entry in enumerate(board["rows"], 1):
        best = entry["vs_best"]
        cells = [str(rank), entry["name"], entry["label"], entry["setting"],
                 _interval_text(entry["accuracy"], entry["interval"]), _vs_vanilla_cell(entry["vs_vanilla"]),
                 "" if best is None else f"{difference(best)}, p = {format_p(best['p'])}",
                 _tuning_cell(entry), entry["forwards_per_token"], _latency_cell(entry)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _condition_table(board: Mapping) -> list[str]:
    """Row x condition: accuracy, and for every row but vanilla its paired gain with its interval."""
    conditions = board["conditions"]
    lines = ["| row | " + " | ".join(_cell(c) for c in conditions) + " |",
             "|---|" + "---|" * len(conditions)]
    for entry in board["rows"]:
        cells = []
        for condition in conditions:
            text = share(entry["by_condition"][condition])
            if entry["vs_vanilla"] is not None:
                test = entry["vs_vanilla"]["by_condition"][condition]
                gain = f"{difference(test)}, p = {format_p(test['p'])}"
                text += f", **{gain}**" if test["p"] < ALPHA else f", {gain}"
            cells.append(text)
        lines.append("| " + " | ".join(_cell(c) for c in [entry["name"], *cells]) + " |")
    return lines


def render_markdown(board: Mapping) -> str:
    """``leaderboard.md``: title, command, machine, notes, headline, the ranked table, the table by condition."""
    return "\n".join(board_lines(board, board["title"]))


def board_lines(board: Mapping, heading: str, level: int = 1) -> list[str]:
    """The board under a heading of ``level`` (its "By condition" one level below): ``leaderboard.md`` at level 1,
    a section of ``docs/leaderboard.md`` deeper (:func:`lpes_harness.evaluation.leaderboard.render`)."""
    lines = [f"{'#' * level} {heading}", "", "```bash", board["command"], "```", "", f"Machine: {board['machine']}", ""]
    if board["notes"]:
        lines += [*(f"- {note}" for note in board["notes"]), ""]
    for sentence in board["headline"]:  # a paragraph each: consecutive lines would run together on the page
        lines += [sentence, ""]
    lines += [*_main_table(board), ""]
    row_notes = [f"- {entry['name']}: {entry['note']}" for entry in board["rows"] if entry.get("note")]
    if row_notes:
        lines += ["Row notes:", "", *row_notes, ""]
    lines += [f"{'#' * (level + 1)} By condition", "", "Accuracy, and the paired difference to vanilla in points "
              f"[95 %] with its p (bold: p < {ALPHA}).", "", *_condition_table(board), "", LATENCY_NOTE, ""]
    return lines


# ---------------------------------------------------------------- the figures

def plot_board_positions(board: Mapping, path: Path) -> None:
    """Accuracy by gold position, pooled over conditions: vanilla, the best LPES and the best other row."""
    by_name = {entry["name"]: entry for entry in board["rows"]}
    shown = list(dict.fromkeys(n for n in (VANILLA, board["best_lpes"], board["best_other"]) if n))
    positions = board["positions"]
    figure = new_figure(figsize=(6.4, 4.0))
    axes = figure.add_subplot()
    for name in shown:
        entry = by_name[name]
        axes.plot(positions, [entry["by_position"][str(p)] for p in positions], marker="o",
                  label=f"{name} ({entry['label']})")
    per_point = by_name[VANILLA]["n"] // len(positions)  # every position holds as many samples (checked)
    axes.set_xlabel("gold position (% of context)")
    axes.set_ylabel("accuracy")
    axes.set_ylim(-0.02, 1.02)
    axes.set_xticks(positions)
    axes.set_title(f"accuracy by gold position, {per_point} held-out samples per point "
                   f"(pooled over {len(board['conditions'])} condition(s))", fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    save_agg(figure, path)


def plot_board_gains(board: Mapping, path: Path) -> None:
    """Every non-vanilla row's gain over vanilla in points with its 95 % interval, best at the top."""
    entries = [entry for entry in board["rows"] if entry["vs_vanilla"] is not None]
    figure = new_figure(figsize=(6.4, 1.2 + 0.4 * max(len(entries), 1)))
    axes = figure.add_subplot()
    ys = list(range(len(entries)))[::-1]  # the first (best) row gets the highest y, so it is drawn on top
    gains = [100 * entry["vs_vanilla"]["difference"] for entry in entries]
    lows = [g - 100 * e["vs_vanilla"]["difference_interval"][0] for g, e in zip(gains, entries)]
    highs = [100 * e["vs_vanilla"]["difference_interval"][1] - g for g, e in zip(gains, entries)]
    if entries:
        axes.errorbar(gains, ys, xerr=[lows, highs], fmt="o", capsize=3)
        axes.set_yticks(ys)
        axes.set_yticklabels([f"{e['name']} ({e['label']})" for e in entries], fontsize=8)
    else:
        axes.text(0.5, 0.5, "no row but vanilla", ha="center", va="center", transform=axes.transAxes)
    axes.axvline(0.0, color="grey", linewidth=0.8)
    axes.set_xlabel("gain over vanilla (points, paired 95 % interval)")
    axes.set_title(f"gain over vanilla on {board['rows'][0]['n']} held-out samples", fontsize=9)
    axes.grid(alpha=0.3, axis="x")
    figure.tight_layout()
    save_agg(figure, path)


# ---------------------------------------------------------------- writing

def write_board(directory: Path, board: Mapping) -> dict[str, Path]:
    """Write the board's four files under ``directory``, each atomically; file name -> path."""
    directory = Path(directory)
    paths = {name: directory / name for name in FILES}
    atomic_write_json(paths["leaderboard.json"], board, indent=2)
    atomic_write_text(paths["leaderboard.md"], render_markdown(board))
    plot_board_positions(board, paths["positions.png"])
    plot_board_gains(board, paths["gains.png"])
    return paths
