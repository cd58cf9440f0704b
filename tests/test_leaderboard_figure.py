"""The leaderboard's picture (``--figure``, issue #97): committed records in, one PNG and its numbers out.

- each board's panel shows vanilla, the best LPES row and the best row of a method that is neither LPES nor
  PI, the highest of the board's ranking of each kind; the best PI row is named, not drawn;
- a row's numbers per gold position are its own samples at that position (Wilson intervals, n);
- ``docs/images/positions_by_method.json`` is what the command computes now from the committed records,
  and the PNG beside it is a PNG; the page the command writes with it is unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpes_harness.commands.leaderboard import main
from lpes_harness.evaluation.leaderboard import ranked
from lpes_harness.evaluation.leaderboard_boards import BOARDS, Board
from lpes_harness.evaluation.leaderboard_figure import figure_data, readable_json, write_figure
from lpes_harness.evaluation.leaderboard_rows import read_table
from lpes_harness.evaluation.stats import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
FIGURE = ROOT / "docs" / "images" / "positions_by_method.png"
NUMBERS = FIGURE.with_suffix(".json")
COMMAND = "python -m lpes_harness.commands.leaderboard --out docs/leaderboard.md --figure docs/images/positions_by_method.png"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _pooled(row) -> float:
    return sum(row.scores) / len(row.scores)


def _by_role(panel: dict) -> dict[str, str]:
    return {row["role"]: row["name"] for row in panel["rows"]}


def test_the_committed_numbers_are_what_the_records_give_now():
    committed = NUMBERS.read_text(encoding="utf-8")
    assert committed == readable_json(figure_data(BOARDS, ROOT)) + "\n", f"{NUMBERS} is out of date; run {COMMAND}"


@pytest.mark.parametrize("board", BOARDS, ids=lambda board: board.model.split()[0])
def test_each_panel_shows_vanilla_the_best_lpes_row_and_the_best_rival(board):
    rows = read_table(board.sources, ROOT).rows
    order = ranked(rows)
    lpes = [row for row in order if row.entry is not None and row.entry.name.startswith("lpes")]
    pi = [row for row in order if row.entry is not None and row.entry.name == "pi"]
    rivals = [row for row in order if row.entry is not None and row not in lpes and row not in pi]
    # the picks are the tops of their kinds: nothing of a kind scores above its pick
    assert all(_pooled(row) <= _pooled(lpes[0]) for row in lpes) and all(_pooled(r) <= _pooled(rivals[0]) for r in rivals)
    panel = next(p for p in json.loads(NUMBERS.read_text(encoding="utf-8"))["boards"] if board.model.startswith(p["model"]))
    assert _by_role(panel) == {"vanilla": "vanilla", "best LPES row": lpes[0].name, "best rival": rivals[0].name}
    assert panel["best_pi_row"]["name"] == pi[0].name
    for row in panel["rows"]:  # drawn rows carry their own pooled accuracy
        drawn = next(r for r in rows if r.name == row["name"])
        assert row["pooled"]["accuracy"] == round(_pooled(drawn), 4) and row["pooled"]["n"] == len(drawn.scores)


def _record(tmp_path: Path, rows: dict) -> Board:
    """A paired heldout.json (row -> scales or model:args, and 0/1 scores by position) and a board of it."""
    scored = {"task": "multi_needle", "split": "heldout", "methods": {name: ran for name, (ran, _) in rows.items()},
              "scores": {name: scores for name, (_, scores) in rows.items()}}
    (tmp_path / "heldout.json").write_text(json.dumps({"table": {}, "scored": scored}))
    return Board(model="Tiny (a fake)", sources=("heldout.json",), about="", tune="", score="", score_curve="",
                 figure_setting="a fake setting", figure_machine="nowhere")


def test_a_pi_row_above_every_rival_is_named_not_drawn_and_positions_keep_their_own_samples(tmp_path):
    # position 0 / 100: vanilla 4 / 1 of 5, the curve 5 / 3, PI above the rival at both
    board = _record(tmp_path, {
        "vanilla": ([1.0] * 4, {"0": [1, 1, 1, 1, 0], "100": [1, 0, 0, 0, 0]}),
        "LPES a": ([0.5, 0.7, 1.1, 1.2], {"0": [1] * 5, "100": [1, 1, 1, 0, 0]}),
        "uniform 0.9": ([0.9] * 4, {"0": [1] * 5, "100": [1, 1, 1, 1, 0]}),
        "Buckets": ("buckets_hf", {"0": [1, 1, 1, 0, 0], "100": [1, 1, 0, 0, 0]})})
    panel = figure_data([board], tmp_path)["boards"][0]
    assert _by_role(panel) == {"vanilla": "vanilla", "best LPES row": "LPES a", "best rival": "Buckets"}
    assert panel["best_pi_row"]["name"] == "uniform 0.9" and panel["best_pi_row"]["accuracy"] == 0.9
    assert panel["model"] == "Tiny" and panel["samples"] == 10 and panel["positions"] == [0, 100]
    vanilla = panel["rows"][0]["by_position"]
    assert [point["accuracy"] for point in vanilla] == [0.8, 0.2] and [point["n"] for point in vanilla] == [5, 5]
    assert vanilla[1]["interval"] == [round(bound, 4) for bound in wilson_interval(1, 5)]


def test_a_board_without_a_rival_or_an_lpes_row_draws_what_it_has(tmp_path):
    board = _record(tmp_path, {"vanilla": ([1.0] * 4, {"0": [1, 0]}), "uniform 0.9": ([0.9] * 4, {"0": [1, 1]})})
    assert _by_role(figure_data([board], tmp_path)["boards"][0]) == {"vanilla": "vanilla"}


def test_the_command_writes_the_png_and_its_numbers_and_leaves_the_page_as_committed(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    figure = tmp_path / "images" / "figure.png"
    assert main(["--out", str(tmp_path / "leaderboard.md"), "--figure", str(figure)]) == 0
    data = figure.read_bytes()
    assert len(data) > 10_000 and data.startswith(PNG_SIGNATURE) and data.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82")
    assert figure.with_suffix(".json").read_text(encoding="utf-8") == NUMBERS.read_text(encoding="utf-8")
    assert (tmp_path / "leaderboard.md").read_text(encoding="utf-8") == (ROOT / "docs" / "leaderboard.md").read_text(
        encoding="utf-8")
    assert FIGURE.read_bytes().startswith(PNG_SIGNATURE)  # the committed picture is a PNG too


def test_a_figure_path_that_is_not_a_png_is_refused_before_anything_is_written(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "page.md"), "--figure", str(tmp_path / "figure.json")])
    assert exit_info.value.code == 2 and "give a .png path" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_write_figure_returns_the_numbers_beside_the_picture(tmp_path):
    board = _record(tmp_path, {"vanilla": ([1.0] * 4, {"0": [1, 0]}), "LPES a": ([0.5, 0.7, 1.1, 1.2], {"0": [1, 1]})})
    numbers = write_figure(tmp_path / "out.png", [board], tmp_path)
    assert numbers == tmp_path / "out.json" and (tmp_path / "out.png").read_bytes().startswith(PNG_SIGNATURE)
    assert json.loads(numbers.read_text(encoding="utf-8")) == figure_data([board], tmp_path)
