"""The leaderboard of an lpes-compare run (lpes_harness/evaluation/compare_board.py), on hand-made 0/1 rows.

Two conditions x five gold percents x ten samples. A row's cell with k correct is ten samples whose first
k are right (unless a test says otherwise), so gained / lost against vanilla (k = 5) can be counted by hand.
"""

from __future__ import annotations

import json

import pytest

from lpes_harness.evaluation.compare_board import FILES, build_board, write_board
from lpes_harness.evaluation.stats import compare_paired, wilson_interval

CONDITIONS = ("plain", "shuffled")
PERCENTS = (0, 25, 50, 75, 100)
PER_CELL = 10
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def first_right(k: int) -> list[float]:
    return [1.0] * k + [0.0] * (PER_CELL - k)


def row(name, method, cell, **extra):
    """A row whose (condition, percent) cell is ``cell(condition, percent)``: a 0/1 list or a count of right answers."""
    def values(c, p):
        made = cell(c, p)
        return first_right(made) if isinstance(made, int) else made

    base = {"name": name, "method": method, "setting": f"`{name} setting`", "tuning_forwards": 0 if method == "vanilla" else 1200,
            "candidates": 0 if method == "vanilla" else 6, "latency": None,
            "scores": {c: {p: values(c, p) for p in PERCENTS} for c in CONDITIONS}}
    return {**base, **extra}


def vanilla(**extra):
    return row("vanilla", "vanilla", lambda c, p: 5, **extra)


def lpes(name="lpes", **extra):
    # 7 right everywhere, but 9 at the middle of "plain": .74 plain, .70 shuffled, .72 pooled; .80 at 50 %
    return row(name, "lpes_both", lambda c, p: 9 if (c, p) == ("plain", 50) else 7, **extra)


def pi(**extra):
    return row("pi", "pi", lambda c, p: 6, **extra)


def mspoe(**extra):
    # right at samples 2..7: against vanilla's 0..4, 3 gained (5, 6, 7) and 2 lost (0, 1) per cell
    return row("mspoe", "mspoe", lambda c, p: [0.0, 0.0] + [1.0] * 6 + [0.0, 0.0], **extra)


def pcd(**extra):
    return row("pcd", "pcd", lambda c, p: 9, **extra)


def board_of(rows, **kwargs):
    return build_board(rows, title="Compare: test model", command="lpes-compare --model tiny --rows all",
                       machine="test machine, 2 CPU cores", **kwargs)


def by_name(board):
    return {entry["name"]: entry for entry in board["rows"]}


def pooled_by_hand(scores):
    return [v for c in CONDITIONS for p in PERCENTS for v in scores[c][p]]


def as_lists(test):
    return {key: list(value) if isinstance(value, tuple) else value for key, value in test.items()}


def test_rows_are_ranked_by_pooled_accuracy_ties_in_input_order():
    board = board_of([vanilla(), pi(), mspoe(), lpes()])
    assert [e["name"] for e in board["rows"]] == ["lpes", "pi", "mspoe", "vanilla"]
    entries = by_name(board)
    assert entries["lpes"]["accuracy"] == pytest.approx(0.72)
    assert entries["lpes"]["n"] == 100
    assert entries["lpes"]["interval"] == list(wilson_interval(72, 100))
    assert entries["lpes"]["by_condition"] == pytest.approx({"plain": 0.74, "shuffled": 0.70})
    assert entries["lpes"]["by_position"]["50"] == pytest.approx(0.8)
    assert entries["lpes"]["by_position"]["0"] == pytest.approx(0.7)
    assert entries["pi"]["accuracy"] == entries["mspoe"]["accuracy"] == pytest.approx(0.6)
    assert board["best"] == "lpes" and board["best_lpes"] == "lpes" and board["best_other"] == "pi"
    # the tie between pi and mspoe goes to whichever was given first
    swapped = board_of([vanilla(), mspoe(), pi(), lpes()])
    assert [e["name"] for e in swapped["rows"]] == ["lpes", "mspoe", "pi", "vanilla"]
    assert swapped["best_other"] == "mspoe"


def test_labels_forwards_and_tuning_cost_come_from_the_table_of_methods():
    entries = by_name(board_of([vanilla(), lpes(), pcd()]))
    assert entries["lpes"]["label"] == "LPES both" and entries["pcd"]["label"] == "PCD"
    assert entries["vanilla"]["label"] == "vanilla" and entries["vanilla"]["forwards_per_token"] == "1"
    assert entries["pcd"]["forwards_per_token"].startswith("2")
    assert (entries["pcd"]["tuning_forwards"], entries["pcd"]["candidates"]) == (1200, 6)


def test_a_stack_row_is_labelled_lpes_plus_the_method_costs_its_forwards_and_is_not_an_lpes_row():
    stack = row("lpes+pcd", "lpes+pcd", lambda c, p: 9)
    board = board_of([vanilla(), lpes(), pcd(), stack])
    entries = by_name(board)
    assert entries["lpes+pcd"]["label"] == "LPES+PCD" and entries["lpes+pcd"]["forwards_per_token"].startswith("2")
    # A stack is another method's row (the best LPES row is a curve alone), so a better stack is named as such.
    assert board["best_lpes"] == "lpes" and board["best_other"] in ("pcd", "lpes+pcd")


@pytest.mark.parametrize("method", ["lpes+mspoe", "lpes+nothing", "lpes+"])
def test_a_stack_of_a_method_that_does_not_stack_is_refused(method):
    with pytest.raises(ValueError, match="stacks"):
        board_of([vanilla(), row("x", method, lambda c, p: 5)])


def test_vs_vanilla_is_the_paired_test_on_the_pooled_samples():
    rows = [vanilla(), lpes(), mspoe()]
    entries = by_name(board_of(rows))
    assert entries["vanilla"]["vs_vanilla"] is None
    test = entries["mspoe"]["vs_vanilla"]
    assert (test["gained"], test["lost"]) == (30, 20)
    expected = as_lists(compare_paired(pooled_by_hand(rows[2]["scores"]), pooled_by_hand(rows[0]["scores"])))
    assert {k: v for k, v in test.items() if k != "by_condition"} == expected
    lpes_test = entries["lpes"]["vs_vanilla"]
    assert (lpes_test["gained"], lpes_test["lost"]) == (22, 0)
    plain = lpes_test["by_condition"]["plain"]
    assert (plain["n"], plain["gained"], plain["lost"]) == (50, 12, 0)
    assert lpes_test["by_condition"]["shuffled"]["gained"] == 10


def test_vs_best_pairs_each_row_with_the_first():
    entries = by_name(board_of([vanilla(), lpes(), pcd()]))
    assert entries["pcd"]["vs_best"] is None
    test = entries["lpes"]["vs_best"]
    assert (test["gained"], test["lost"]) == (0, 18)
    assert test["difference"] == pytest.approx(-0.18)


def test_headline_says_an_lpes_row_is_first():
    headline = " ".join(board_of([vanilla(), pi(), lpes()])["headline"])
    assert "First: lpes" in headline and "+22.0" in headline
    assert "An LPES row is first" in headline
    assert "LPES is not first" not in headline
    assert "pi (PI)" in headline  # the best row of another method, and the lead over it


def test_headline_names_the_method_that_beats_the_best_lpes_row():
    board = board_of([vanilla(), lpes(), row("weak", "lpes", lambda c, p: 4), pcd(), pi()])
    assert board["best"] == "pcd" and board["best_lpes"] == "lpes" and board["best_other"] == "pcd"
    headline = " ".join(board["headline"])
    assert "First: pcd" in headline
    assert "LPES is not first" in headline and "An LPES row is first" not in headline
    # PCD over the best LPES row (not the weak one): 90 - 72 = 18 samples gained, none lost
    assert "PCD (pcd) beats the best LPES row, lpes" in headline
    assert "by +18.0 [" in headline


def test_headline_when_vanilla_is_first_or_there_is_no_lpes_row():
    worse = board_of([row("low", "lpes_base", lambda c, p: 3), vanilla()])
    text = " ".join(worse["headline"])
    assert worse["best"] == "vanilla" and "First: vanilla" in text
    assert "The best LPES row, low (LPES base), against vanilla: −" in text  # its loss, stated against the plain model
    no_lpes = board_of([vanilla(), pi()])
    assert no_lpes["best_lpes"] is None
    assert "No LPES row" in " ".join(no_lpes["headline"])


@pytest.mark.parametrize("broken, where", [
    (lambda r: r["scores"]["plain"][50].append(1.0), "position 50"),
    (lambda r: r["scores"].pop("shuffled"), "conditions"),
    (lambda r: r["scores"]["plain"].pop(75), "gold percents"),
    (lambda r: r["scores"]["plain"][0].__setitem__(0, 0.5), "0/1"),
])
def test_a_row_that_cannot_be_paired_is_refused_by_name(broken, where):
    bad = pi()
    broken(bad)
    with pytest.raises(ValueError, match=rf"row 'pi'.*{where}"):
        board_of([vanilla(), lpes(), bad])


def test_missing_vanilla_duplicate_and_unknown_methods_are_refused():
    with pytest.raises(ValueError, match="no row named 'vanilla'"):
        board_of([lpes(), pi()])
    with pytest.raises(ValueError, match="row 'pi' appears 2 times"):
        board_of([vanilla(), pi(), pi()])
    with pytest.raises(ValueError, match="row 'odd'.*'nosuch'"):
        board_of([vanilla(), row("odd", "nosuch", lambda c, p: 5)])
    with pytest.raises(ValueError, match="row 'pi' lacks candidates"):
        board_of([vanilla(), {k: v for k, v in pi().items() if k != "candidates"}])


def test_latency_ratio_to_vanilla_and_not_measured(tmp_path):
    board = board_of([vanilla(latency=2.0), lpes(latency=2.5), pi(latency=3.0), mspoe()])
    entries = by_name(board)
    assert entries["vanilla"]["latency_ratio"] == pytest.approx(1.0)
    assert entries["lpes"]["latency_ratio"] == pytest.approx(1.25)
    assert entries["pi"]["latency_ratio"] == pytest.approx(1.5)
    assert entries["mspoe"]["latency"] is None and entries["mspoe"]["latency_ratio"] is None
    unmeasured = by_name(board_of([vanilla(), lpes(latency=1.0)]))
    assert unmeasured["lpes"]["latency_ratio"] is None  # no vanilla latency: no ratio
    page = write_board(tmp_path, board)["leaderboard.md"].read_text(encoding="utf-8")
    line = next(l for l in page.splitlines() if l.startswith("| ") and "| mspoe |" in l)
    assert line.rstrip(" |").endswith("not measured")
    assert "| 1.25x |" in next(l for l in page.splitlines() if "| lpes |" in l and l.startswith("| 1 "))


def test_write_board_writes_four_files_and_the_json_reloads_equal(tmp_path):
    board = board_of([vanilla(latency=1.0), lpes(note="searched on the search split"), pi(), mspoe(),
                      row("low", "lpes_base", lambda c, p: 3)], notes=("a note on the run",))
    paths = write_board(tmp_path / "board", board)
    assert sorted(paths) == sorted(FILES)
    assert all(path.parent == tmp_path / "board" and path.is_file() for path in paths.values())
    for name in ("positions.png", "gains.png"):
        assert paths[name].read_bytes()[:8] == PNG_MAGIC
    assert json.loads(paths["leaderboard.json"].read_text(encoding="utf-8")) == board
    assert not [p for p in (tmp_path / "board").iterdir() if p.name.endswith(".tmp")]


def test_markdown_has_the_command_one_line_per_row_and_signed_points(tmp_path):
    rows = [vanilla(), lpes(), mspoe(), row("low", "lpes_base", lambda c, p: 3, setting="a | b")]
    board = board_of(rows, notes=("held-out split only",))
    page = write_board(tmp_path, board)["leaderboard.md"].read_text(encoding="utf-8")
    lines = page.splitlines()
    assert lines[0] == "# Compare: test model"
    assert "```bash\nlpes-compare --model tiny --rows all\n```" in page
    assert "Machine: test machine, 2 CPU cores" in page and "- held-out split only" in page
    for rank, entry in enumerate(board["rows"], 1):
        assert sum(line.startswith(f"| {rank} | {entry['name']} | ") for line in lines) == 1
    assert sum(line.startswith("| ") and line[2].isdigit() for line in lines) == len(rows)
    assert ".720 [" in page
    assert "**+22.0 [" in page  # lpes over vanilla at p < 0.05: bold
    mspoe_line = next(line for line in lines if line.startswith("| ") and "| mspoe |" in line and line[2].isdigit())
    assert "+10.0 [" in mspoe_line and "30 / 20" in mspoe_line and "**+10.0" not in mspoe_line
    assert "−20.0 [" in page  # a true minus sign for a loss
    assert "a \\| b" in page  # a pipe in a setting does not split the table
    assert "## By condition" in page
    by_condition = lines[lines.index("## By condition"):]
    assert any(line.startswith("| lpes | .740, **+24.0 [") for line in by_condition)
    assert "median seconds of one prefill forward" in page
