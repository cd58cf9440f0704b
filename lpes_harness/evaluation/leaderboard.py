"""The leaderboard page, ``docs/leaderboard.md``: the ``lpes-compare`` boards (issue #97), then every method on the
committed held-out tables (issue #45).

Nothing is scored. The page opens with each committed ``lpes-compare`` board
(:data:`~.leaderboard_boards.COMPARES`), shown from the ``leaderboard.json`` that command wrote, its command
with it (:func:`compare_lines`). Then each held-out board (:data:`~.leaderboard_boards.BOARDS`, one per model) reads the committed
per-sample records of one held-out sample set (:mod:`.leaderboard_rows`) and :func:`render` ranks every
row by its accuracy, with its 95 % interval, its paired difference to vanilla and to the best LPES row on
the same samples (:func:`~lpes_harness.evaluation.stats.compare_paired`: exact McNemar, interval of the
difference), the forwards a token costs (the table of methods) and the latency ratio to vanilla that
``benchmarks/latency.py`` committed for the board's model (``Board.latency``, :func:`read_latency`). A
method of the table with no row on a board gets a line saying so, with the commands that would score it
(:func:`missing_lines`). The page says where LPES is not first. The command is :data:`COMMAND`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lpes_harness.evaluation.leaderboard_boards import BOARDS, COMPARES, Board, CompareBoard, fill
from lpes_harness.evaluation.leaderboard_rows import ROPE, LeaderboardError, Row, arguments_key, is_lpes, model_args, read_table
from lpes_harness.evaluation.compare_board import board_lines as compare_board_lines
from lpes_harness.evaluation.stats import accuracy_with_interval, compare_paired, difference, format_p, share
from lpes_harness.core.scaling import DEFAULT
from lpes_harness.methods import METHODS

ALPHA = 0.05  # a paired difference at p below this is bold, and counts as a row of another method above LPES
COMMAND = "python -m lpes_harness.commands.leaderboard --out docs/leaderboard.md"


def ranked(rows: Sequence[Row]) -> list[Row]:
    """Best accuracy first; ties keep the record's order."""
    return sorted(rows, key=lambda row: -sum(row.scores))


def vanilla_of(rows: Sequence[Row], where: str) -> Row:
    found = [row for row in rows if row.entry is None]
    if not found:
        raise LeaderboardError(f"{where}: no row of the plain model (vanilla) to pair the others with")
    return found[0]


def best_lpes(rows: Sequence[Row]) -> Row | None:
    curves = [row for row in ranked(rows) if is_lpes(row)]
    return curves[0] if curves else None


def ratio_of(measured: Mapping) -> float:
    """One method's latency ratio to vanilla in a ``benchmarks/latency.py --json`` summary: the median
    paired ratio of cached generation (prefill and new tokens, what a user waits for); an earlier
    latency.py wrote that one figure as ``ratio``."""
    if "ratio" in measured:
        return float(measured["ratio"])
    return float(measured["generate"]["paired_ratio"]["median"])


@dataclass(frozen=True)
class Latency:
    """A board's ``benchmarks/latency.py --json`` run: each method's ratio at its defaults, by label, and at
    each ``--setting`` it timed, by (label, :func:`~.leaderboard_rows.arguments_key`)."""

    ratios: Mapping[str, float] = field(default_factory=dict)
    settings: Mapping[tuple[str, tuple], float] = field(default_factory=dict)

    def at_own_setting(self, row: Row) -> float | None:
        """The row's ratio where ``--setting`` timed its method as the row ran it, else None."""
        if not row.sets_parameters or row.entry is None:
            return None
        return self.settings.get((latency_label(row.entry.label, row.scaling), row.arguments))


def read_latency(path: Path) -> Latency:
    """A ``benchmarks/latency.py --json`` file's ratios to vanilla (:class:`Latency`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ratios = {label: ratio_of(measured) for label, measured in data["summary"].items()}
        timed = data.get("settings") or {}
        settings = {(ran["method"], arguments_key(model_args(ran["args"]))): ratios[name] for name, ran in timed.items()}
        return Latency({label: ratio for label, ratio in ratios.items() if label not in timed}, settings)
    except FileNotFoundError:
        raise LeaderboardError(f"latency file {str(path)!r} does not exist; give benchmarks/latency.py's --json file") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise LeaderboardError(f"latency file {str(path)!r}: not a benchmarks/latency.py --json file "
                               f"(a 'summary' of methods with a 'ratio' each)") from None


def latency_label(label: str, scaling: str | None) -> str:
    """The name ``benchmarks/latency.py`` times a row's method under: the method's label; PI (one uniform factor,
    whatever it multiplies) as "PI base" / "PI both" at those scalings. LPES's scalings are methods of their own."""
    return f"{label} {scaling}" if label == METHODS["pi"].label and scaling not in (None, DEFAULT) else label


def latency_of(row: Row, latency: Latency) -> str:
    """The measured ratio of the row's method: at the row's own setting where latency.py timed it (``--setting``),
    else at the method's defaults (so a row with other parameters, fewer Buckets bases, is marked)."""
    label = "vanilla" if row.entry is None else latency_label(row.entry.label, row.scaling)
    own = latency.at_own_setting(row)
    if own is not None:
        return f"{own:.2f}x"
    if label not in latency.ratios:
        return "not measured"
    return f"{latency.ratios[label]:.2f}x" + (" at its defaults" if row.sets_parameters else "")


def untimed_settings(rows: Sequence[Row], latency: Latency) -> list[str]:
    """``benchmarks/latency.py --setting`` flags for the rows that set their method's parameters and were
    timed only at the method's defaults (marked so on the page), one per setting."""
    flags = []
    for row in rows:
        if not row.sets_parameters or row.entry is None or latency.at_own_setting(row) is not None:
            continue
        flag = f'--setting "{row.entry.name}:{row.setting.strip("`")}"'
        if flag not in flags:
            flags.append(flag)
    return flags


def board_lines(board: Board, rows: Sequence[Row], latency: Latency) -> list[str]:
    """The board's table, its headline and where LPES is not first."""
    vanilla, best = vanilla_of(rows, board.model), best_lpes(rows)
    order = ranked(rows)
    lines = ["| # | row | method | setting | accuracy [95 %] | vs vanilla: points [95 %], gained / lost, p "
             "| vs best LPES row: points [95 %], p | forwards per token | latency vs vanilla |",
             "|---:|---|---|---|---|---|---|---|---|"]
    for rank, row in enumerate(order, 1):
        accuracy = accuracy_with_interval(row.scores)
        low, high = accuracy["interval"]
        cells = [str(rank), f"**{row.name}**" if row is best else row.name,
                 "vanilla" if row.entry is None else row.entry.label, row.setting,
                 f"{share(accuracy['accuracy'])} [{share(low)}, {share(high)}]"]
        if row is vanilla:
            cells.append("")
        else:
            test = compare_paired(row.scores, vanilla.scores)
            text = f"{difference(test)}, {test['gained']} / {test['lost']}, p = {format_p(test['p'])}"
            cells.append(f"**{text}**" if test["p"] < ALPHA else text)
        if best is None or row is best:
            cells.append("")
        else:
            test = compare_paired(row.scores, best.scores)
            cells.append(f"{difference(test)}, p = {format_p(test['p'])}")
        cells += ["1" if row.entry is None else row.entry.forwards, latency_of(row, latency)]
        lines.append("| " + " | ".join(cells) + " |")
    return [*headline(order, vanilla, best), "", *lines, "", *where_not_first(order, best)]


def headline(order: Sequence[Row], vanilla: Row, best: Row | None) -> list[str]:
    """Who is first, by how much over vanilla, and how far the best LPES row and the best other method are."""
    top = next((row for row in order if row is not vanilla), None)
    if top is None:
        return ["No row but vanilla."]
    gain = compare_paired(top.scores, vanilla.scores)
    text = (f"**First: {top.name}** ({top.entry.label}), {share(gain['accuracy'])}, {difference(gain)} points over "
            f"vanilla (p = {format_p(gain['p'])}).")
    if best is None:
        return [text + " No LPES row is on this table."]
    if top is best:
        other = next((row for row in order if row is not vanilla and not is_lpes(row)), None)
        if other is None:
            return [text]
        lead = compare_paired(best.scores, other.scores)
        verdict = "ahead of" if lead["p"] < ALPHA and lead["difference"] > 0 else "not significantly ahead of"
        return [text + f" It is an LPES row, {verdict} the best row of another method, {other.name} "
                       f"({other.entry.label}): {difference(lead)} points, p = {format_p(lead['p'])}."]
    behind = compare_paired(best.scores, top.scores)
    return [text + f" **LPES is not first here**: its best row, {best.name} ({best.entry.label}), is at "
                   f"{difference(behind)} points from it (p = {format_p(behind['p'])})."]


def where_not_first(order: Sequence[Row], best: Row | None) -> list[str]:
    """Each LPES row that a row of another method beats at p < ALPHA, with the largest such gap."""
    lines = []
    for curve in (row for row in order if is_lpes(row)):
        above = [(row, compare_paired(row.scores, curve.scores)) for row in order
                 if row.entry is not None and not is_lpes(row)]
        above = [(row, test) for row, test in above if test["difference"] > 0 and test["p"] < ALPHA]
        if above:
            row, test = max(above, key=lambda pair: pair[1]["difference"])
            lines.append(f"- {curve.name} ({curve.entry.label}): below {len(above)} row(s) of other methods at "
                         f"p < {ALPHA}, most of all {row.name} ({row.entry.label}), {difference(test)} points "
                         f"above it (p = {format_p(test['p'])}).")
    if best is not None and not lines:
        return [f"No row of another method is above any LPES row at p < {ALPHA}."]
    return ["**Where LPES is not first** (paired, on the same samples):", "", *lines] if lines else []


def missing_lines(board: Board, rows: Sequence[Row]) -> list[str]:
    """One item per method of the table that lacks a row on this board (or, for a baseline, its authors' or
    its tuned row): why, or the commands that would score it."""
    lines = []
    for method in METHODS.values():
        mine = [row for row in rows if row.entry is not None and row.entry.name == method.name]
        name = f"**{method.label}** (`{method.lm_eval}`{' ' + method.model_args if method.model_args else ''})"
        if not mine:
            gap = "not scored on this table."
            if method.forwards != "1":  # what a row of it costs beside one of the plain model
                gap += f" Forwards per token: {method.forwards}."
        elif method.module == ROPE:
            continue
        elif not any(row.sets_parameters for row in mine) and method.grid is not None:
            gap = "no tuned row on this table (its grid in the table of methods was not tried here)."
        elif all(row.sets_parameters for row in mine):
            gap = "no row at the authors' defaults on this table."
        else:
            continue
        if method.name in board.refused:
            lines.append(f"- {name}: {gap} {board.refused[method.name]}.")
            continue
        commands, what = _commands(board, method)
        if not commands:
            lines.append(f"- {name}: {gap} {what}.")
            continue
        lines += [f"- {name}: {gap} What would score it ({what}):", "", "  ```bash",
                  *("  " + line for command in commands for line in command.split("\n")), "  ```"]
    return lines


def _commands(board: Board, method) -> tuple[list[str], str]:
    """The board's commands for ``method``, and what they do in words (without commands: why there are none)."""
    args = board.needs.get(method.name, "")
    values = {"label": method.label, "model": method.lm_eval, "name": method.name,
              "colon_args": f":{args}" if args else "", "comma_args": f",{args}" if args else "",
              "tune_args": f" \\\n    {board.tune_args[method.name]}" if method.name in board.tune_args else ""}
    commands = [board.prepare[method.name]] if method.name in board.prepare else []
    if method.module != ROPE:
        commands += [fill(board.tune, **values), fill(board.score, **values)]
        return commands, "tuned on the search split, then its authors' and its tuned row on these samples"
    search, scales = board.searches.get(method.name, ("", ""))
    if not scales:
        return [], "No curve of this scaling is committed for this model"
    commands += [search] if search else []
    commands.append(fill(board.score_curve, scales=scales, **values))
    return commands, ("a search of this scaling, then its curve on these samples" if search
                      else "the committed curve of this scaling on these samples")


def render(boards: Sequence[Board] = BOARDS, root: Path = Path("."),
           compares: Sequence[CompareBoard] = COMPARES) -> str:
    """The whole page, from the committed records under ``root``: the ``lpes-compare`` boards, then the held-out
    tables."""
    lines = ["# Leaderboard: which fix on which model", "",
             f"Written by `{COMMAND}` from committed records; nothing is scored again, and "
             "`tests/test_leaderboard.py` fails when this page is not what the command writes now. Two kinds of board:",
             "",
             "- **`lpes-compare` boards** (first): every method of the table that runs on the model, tuned on the same "
             "forwards and scored on the same held-out samples by one command, which each board shows; run it on your "
             "model to get the same board for it ([compare.md](compare.md)). On two CPU cores a board is small: read "
             "its intervals and its note on what its sample size can show.",
             "- **Held-out tables** (after): 1,000 paired samples a model, every row made by its own run on one sample "
             "set (issue #45), authors' and tuned rows; the tables that rank these methods with power. To add a row, "
             "run the commands under its method below, then add the record they write (the paired run's "
             "`heldout.json`, the kept report's folder) to its board's `sources` in "
             "`lpes_harness/evaluation/leaderboard_boards.py`.", ""]
    if compares:
        lines += ["## `lpes-compare` boards", ""]
        for compare in compares:
            lines += compare_lines(compare, root)
        lines += ["## Held-out tables", ""]
    lines += ["- **row**: its name in its record; **method**: what it ran, by the table of methods "
              "(`lpes_harness.methods.METHODS`): one factor on every layer it moved is PI, position or base, whatever "
              "the record calls it; **setting**: what it set (authors' defaults: none of the method's parameters).",
              "- **accuracy**: all gold positions pooled, with its 95 % Wilson interval. **vs vanilla**, **vs best LPES "
              "row** (the LPES row of any scaling with the best accuracy, its name in bold): the "
              "difference in points on the same samples, its 95 % interval, samples gained / lost, exact McNemar p "
              f"(`lpes_harness.evaluation.stats.compare_paired`); bold: p < {ALPHA}.",
              "- **forwards per token**: the table of methods. **latency vs vanilla**: `benchmarks/latency.py`'s "
              "committed median ratio of cached generation (prefill and new tokens) on the board's model, on the "
              "machine its board names, \"not measured\" where a method has none; a ratio depends on the machine, "
              "so compare it within a board.", ""]
    level = "###" if compares else "##"
    for board in boards:
        table = read_table(board.sources, root)
        latency = read_latency(root / board.latency) if board.latency else Latency()
        total = table.per_position * len(table.positions)
        lines += [f"{level} {board.model}", "", f"{board.about} {table.per_position} samples at each of "
                  f"{len(table.positions)} gold positions ({', '.join(f'{p} %' for p in table.positions)}): "
                  f"{total:,} paired samples.", "", latency_where(board, root), ""]
        flags = untimed_settings(table.rows, latency)
        if flags and board.latency_command:
            lines += ["The rows marked \"at its defaults\" were timed at their method's defaults, not at their own "
                      "parameters. This command times every method again and each of those rows at its own setting:", "",
                      "```bash", board.latency_command + "".join(f" \\\n    {flag}" for flag in flags), "```", ""]
        lines += [*board_lines(board, table.rows, latency), ""]
        missing = missing_lines(board, table.rows)
        if missing:
            lines += ["**Methods of the table with no row here, or without their authors' or tuned row:**", "",
                      *missing, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def compare_lines(compare: CompareBoard, root: Path) -> list[str]:
    """One ``lpes-compare`` board as a section of the page, from the ``leaderboard.json`` that command wrote."""
    path = root / compare.folder / "leaderboard.json"
    try:
        board = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LeaderboardError(f"{compare.folder}: no leaderboard.json (an lpes-compare --output folder); run its "
                               f"command or drop it from COMPARES in leaderboard_boards.py") from None
    heading, *rest = compare_board_lines(board, compare.model, level=3)
    link = f"../{compare.folder}"
    return [heading, "", f"As `lpes-compare` wrote it in [{compare.folder}]({link}/README.md) "
            f"([leaderboard.json]({link}/leaderboard.json)); accuracy by gold position and each row's gain:", "",
            f"![accuracy by gold position]({link}/positions.png) ![gain over vanilla]({link}/gains.png)", *rest]


def latency_where(board: Board, root: Path) -> str:
    """What the board's committed latency run measured, from its own record."""
    if not board.latency:
        return "Latency: no `benchmarks/latency.py` run on this model; every row's latency is \"not measured\"."
    data = json.loads((root / board.latency).read_text(encoding="utf-8"))
    tokens = data.get("prompt_tokens") or []
    span = (f"{len(tokens)} MDQA-shaped prompt{'s' if len(tokens) != 1 else ''} of "
            + (f"{min(tokens):,}-{max(tokens):,}" if len(set(tokens)) > 1 else f"{tokens[0]:,}" if tokens else "?"))
    scales = data.get("lpes_scales")
    settings = [f"LPES and PI: {f'`{scales}`' if scales else 'a stand-in curve'}"]
    if data.get("poshidden_setting"):
        settings.append(f"positional hidden-state scaling: `{data['poshidden_setting']}`")
    if data.get("string_offset"):
        settings.append(f"STRING: `shifted_offset={data['string_offset']}`")
    refused = ", ".join(sorted(data.get("refused") or {}))
    own = len(data.get("settings") or {})
    return (f"Latency ([{board.latency}](../{board.latency})): {board.latency_where}; {span} tokens, "
            f"{data.get('new_tokens', '?')} new tokens each, {data.get('dtype', 'float32')}, "
            f"{data.get('threads', '?')} threads, median of {data.get('repeats', '?')} repeats; each method at its "
            f"defaults but for these settings: {'; '.join(settings)}"
            + (f"; a row that sets its method's parameters is timed at its own setting where `--setting` timed it "
               f"({own} here), else marked \"at its defaults\"" if own else "")
            + (f". Not timed, as it refuses this model: {refused}." if refused else "."))
