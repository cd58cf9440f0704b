"""The leaderboard (``python -m lpes_harness.commands.leaderboard``): committed per-sample records in, one page out.

- its paired numbers are :mod:`lpes_harness.evaluation.stats`'s on the same samples, to vanilla and to the
  best LPES row, from either kind of record (a paired ``heldout.json``, a kept ``lpes-report`` folder);
- rows are named for what they ran: one factor on every layer it moved is PI (position or base, with
  ``layer_type`` or ``pi=true``), not LPES; vanilla through ``lpes_hf`` is the plain model;
- a method of the table with no row gets "not scored on this table" and the command that would score
  it, or the reason the model refuses it (a baseline without its authors' or its tuned row: that row);
  where a baseline beats LPES, the page says so;
- records that do not pair (other samples, a row that differs between two records) are refused by name;
- ``docs/leaderboard.md`` is what the command writes now from the committed records.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lpes_harness.commands.leaderboard import main
from lpes_harness.evaluation import leaderboard
from lpes_harness.evaluation.leaderboard import render
from lpes_harness.evaluation.leaderboard_boards import Board, CompareBoard
from lpes_harness.evaluation.leaderboard_rows import LeaderboardError, read_table
from lpes_harness.evaluation.stats import accuracy_with_interval, compare_paired, format_p
from lpes_harness.methods import METHODS

ROOT = Path(__file__).resolve().parents[1]
POSITIONS = (0, 50, 100)
PER_POSITION = 40


def _scores(rate: float, seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    return {str(p): [float(rng.random() < rate) for _ in range(PER_POSITION)] for p in POSITIONS}


def _pooled(by_position: dict[str, list[float]]) -> list[float]:
    return [v for p in POSITIONS for v in by_position[str(p)]]


def _points(value: float) -> str:
    return f"{value * 100:+.1f}".replace("-", "−")


def _interval(test: dict) -> str:
    low, high = test["difference_interval"]
    return f"{_points(test['difference'])} [{_points(low)}, {_points(high)}]"


def _row_line(page: str, name: str) -> str:
    return next(line for line in page.splitlines() if line.startswith("| ") and f"| {name} |" in line
                or f"| **{name}** |" in line)


def _paired_record(tmp_path: Path, rows: dict) -> str:
    """A heldout.json as python -m lpes_harness.commands.paired writes it: row -> (scales or model:args, scores)."""
    scored = {"task": "multi_needle", "split": "heldout", "num_samples": PER_POSITION,
              "methods": {name: ran for name, (ran, _) in rows.items()},
              "scores": {name: scores for name, (_, scores) in rows.items()}}
    path = tmp_path / "paired" / "heldout.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"table": {}, "scored": scored}))
    return "paired/heldout.json"


def _kept_record(tmp_path: Path, folder: str, rows: dict) -> str:
    """A kept lpes-report record: results_<row>.json (model, model_args, lpes_scales) beside per_sample.json."""
    directory = tmp_path / folder
    directory.mkdir(parents=True, exist_ok=True)
    record = {}
    for name, (config, scores) in rows.items():
        results = {f"multi_needle_pos{p}": {"acc,none": sum(scores[str(p)]) / PER_POSITION} for p in POSITIONS}
        (directory / f"results_{name.replace(' ', '_')}.json").write_text(json.dumps({"results": results, "config": config}))
        record[name] = {f"multi_needle_pos{p}": {str(doc): {"acc": v, "doc_hash": f"h{p}-{doc}"}
                                                 for doc, v in enumerate(scores[str(p)])} for p in POSITIONS}
    (directory / "per_sample.json").write_text(json.dumps(record))
    return folder


def _latency(tmp_path: Path) -> Path:
    """Writes the boards' latency file under ``tmp_path`` (the page's root) and returns that root."""
    summary = {"vanilla": {"ratio": 1.0}, "LPES": {"ratio": 1.01}, "PI": {"ratio": 1.0}, "PI base": {"ratio": 1.02},
               "Buckets": {"ratio": 6.0}}
    (tmp_path / "latency.json").write_text(json.dumps({"prompt_tokens": [100, 120], "new_tokens": 4, "threads": 1,
                                                       "repeats": 2, "refused": {"MoICE": "not on tiny models"},
                                                       "summary": summary}))
    return tmp_path


def _board(sources, **fields) -> Board:
    defaults = dict(model="Tiny", about="A fake table.", tune="tune {label}={model}{colon_args} -> {name}{tune_args}",
                    score="score \"{label}={model}{colon_args}\" into {name}", score_curve="curve {name}={scales}",
                    latency="latency.json", latency_where="a test machine")
    return Board(sources=tuple(sources), **{**defaults, **fields})


VANILLA, CURVE, PI_ROW = _scores(0.5, 1), _scores(0.8, 2), _scores(0.6, 3)
BUCKETS, MSPOE = _scores(0.7, 4), _scores(0.45, 5)


@pytest.fixture
def paired(tmp_path):
    source = _paired_record(tmp_path, {
        "vanilla": ([1.0] * 4, VANILLA), "LPES a": ([0.5, 0.7, 1.1, 1.2], CURVE), "uniform 0.9": ([0.9] * 4, PI_ROW),
        "Buckets tuned": ("buckets_hf:bases=1.0;2.0", BUCKETS), "Ms-PoE": ("mspoe_hf", MSPOE)})
    return tmp_path, source


def test_paired_numbers_are_the_stats_modules_to_vanilla_and_to_the_best_lpes_row(paired):
    tmp_path, source = paired
    page = render([_board([source])], _latency(tmp_path), compares=())
    line = _row_line(page, "Buckets tuned")
    to_vanilla = compare_paired(_pooled(BUCKETS), _pooled(VANILLA))
    to_best = compare_paired(_pooled(BUCKETS), _pooled(CURVE))
    accuracy = accuracy_with_interval(_pooled(BUCKETS))
    assert f"{_interval(to_vanilla)}, {to_vanilla['gained']} / {to_vanilla['lost']}, p = {format_p(to_vanilla['p'])}" in line
    assert f"{_interval(to_best)}, p = {format_p(to_best['p'])}" in line
    assert f"{accuracy['accuracy']:.3f}".removeprefix("0") in line
    assert "6.00x at its defaults" in line and "`bases=1.0;2.0`" in line  # latency.py ran its 7 default bases
    assert "| **LPES a** |" in page  # the best LPES row, the one every row is paired with
    assert "authors' defaults" in _row_line(page, "Ms-PoE") and "not measured" in _row_line(page, "Ms-PoE")


def test_a_uniform_row_is_pi_and_vanilla_is_the_plain_model(paired):
    tmp_path, source = paired
    rows = {row.name: row for row in read_table([source], tmp_path).rows}
    assert rows["uniform 0.9"].entry.name == "pi" and rows["uniform 0.9"].setting == "position factor 0.9 on every layer"
    assert rows["LPES a"].entry.name == "lpes" and rows["vanilla"].entry is None
    assert rows["Buckets tuned"].entry.name == "buckets" and rows["Buckets tuned"].sets_parameters


def test_kept_records_name_uniform_base_and_layer_type_rows_pi(tmp_path):
    base = {"model": "lpes_hf"}
    source = _kept_record(tmp_path, "kept", {
        "vanilla": ({**base, "model_args": "pretrained=x", "lpes_scales": [1.0] * 4}, VANILLA),
        "LPES-base a": ({**base, "model_args": "scales=a.json,scaling=base", "lpes_scales": [2.0, 1.8, 1.5, 1.2]}, CURVE),
        "uniform base 2": ({**base, "model_args": "scales=2.0,scaling=base", "lpes_scales": [2.0] * 4}, PI_ROW),
        "PI tuned": ({**base, "model_args": "scales=2.5,layer_type=full_attention", "lpes_scales": [1, 2.5, 1, 2.5]}, MSPOE),
        "Buckets authors": ({"model": "buckets_hf", "model_args": "pretrained=x"}, BUCKETS)})
    rows = {row.name: row for row in read_table([source], tmp_path).rows}
    assert rows["vanilla"].entry is None
    assert rows["LPES-base a"].entry.name == "lpes_base"
    assert rows["uniform base 2"].entry.name == "pi" and rows["uniform base 2"].setting == "base factor 2 on every layer"
    assert rows["PI tuned"].entry.name == "pi"
    assert rows["PI tuned"].setting == "position factor 2.5 on 2 of 4 layers (the others at 1)"
    assert rows["Buckets authors"].setting == "authors' defaults"
    page = render([_board([source])], _latency(tmp_path), compares=())
    assert "1.02x" in _row_line(page, "uniform base 2")  # PI at base scaling is timed as "PI base"
    to_vanilla = compare_paired(_pooled(PI_ROW), _pooled(VANILLA))
    assert _interval(to_vanilla) in _row_line(page, "uniform base 2")


def test_methods_without_a_row_are_named_with_the_command_or_the_reason(paired):
    tmp_path, source = paired
    board = _board([source], needs={"poshidden": "setting=p.json"}, refused={"string": "it refuses tiny models"},
                   searches={"lpes_both": ("search both", "both/scales.json")}, tune_args={"fitm": "--grid G"})
    page = render([board], _latency(tmp_path), compares=())
    assert "tune Found in the Middle=fitm_hf -> fitm \\\n      --grid G" in page  # the board's own grid for it
    assert "-> poshidden\n" in page  # and only for it
    assert ("- **Found in the Middle** (`fitm_hf`): not scored on this table. Forwards per token: "
            f"{METHODS['fitm'].forwards}." in page)
    assert 'score "Found in the Middle=fitm_hf" into fitm' in page
    assert "tune Positional hidden-state scaling=poshidden_hf:setting=p.json -> poshidden" in page
    assert "- **STRING** (`string_hf`): not scored on this table. it refuses tiny models." in page
    assert "search both" in page and "curve lpes_both=both/scales.json" in page
    assert "- **LPES base** (`lpes_hf` scaling=base): not scored on this table. No curve of this scaling" in page
    assert "- **MoICE** (`moice_hf`): not scored on this table. Forwards per token: 1, with E attention" in page
    # a baseline with a row, but not both kinds: the fixture's Ms-PoE ran its defaults only, its Buckets only tuned
    assert "- **Ms-PoE** (`mspoe_hf`): no tuned row on this table" in page
    assert "- **Buckets** (`buckets_hf`): no row at the authors' defaults on this table." in page
    assert "**PI**" not in page.split("no row here")[1]  # its uniform row is PI's


def test_the_page_says_where_lpes_is_not_first(tmp_path):
    source = _paired_record(tmp_path, {"vanilla": ([1.0] * 4, VANILLA), "LPES a": ([0.5, 0.7, 1.1, 1.2], PI_ROW),
                                       "Buckets": ("buckets_hf", _scores(0.95, 6))})
    page = render([_board([source])], _latency(tmp_path), compares=())
    behind = compare_paired(_pooled(PI_ROW), _pooled(_scores(0.95, 6)))
    assert "**First: Buckets** (Buckets)" in page and "**LPES is not first here**" in page
    assert f"its best row, LPES a (LPES), is at {_interval(behind)} points from it" in page
    assert "- LPES a (LPES): below 1 row(s) of other methods at p < 0.05, most of all Buckets (Buckets)" in page


def test_records_that_do_not_pair_are_refused_by_name(tmp_path):
    first = _kept_record(tmp_path, "one", {"vanilla": ({"model": "hf", "model_args": ""}, VANILLA),
                                           "Buckets": ({"model": "buckets_hf", "model_args": ""}, BUCKETS)})
    second = _kept_record(tmp_path, "two", {"vanilla": ({"model": "hf", "model_args": ""}, VANILLA),
                                            "Buckets": ({"model": "buckets_hf", "model_args": ""}, MSPOE)})
    with pytest.raises(LeaderboardError, match="row 'Buckets' of 'two' differs"):
        read_table([first, second], tmp_path)
    other = _paired_record(tmp_path, {"vanilla": ([1.0] * 4, VANILLA)})
    with pytest.raises(LeaderboardError, match="'paired/heldout.json' holds other samples than 'one'"):
        read_table([first, other], tmp_path)
    with pytest.raises(LeaderboardError, match="'nowhere' does not exist"):
        read_table(["nowhere"], tmp_path)
    foreign = _kept_record(tmp_path, "foreign", {"vanilla": ({"model": "hf", "model_args": ""}, VANILLA),
                                                 "mine": ({"model": "my_model", "model_args": ""}, BUCKETS)})
    with pytest.raises(LeaderboardError, match="'mine' ran 'my_model', which is not in the table of methods"):
        read_table([foreign], tmp_path)


def test_each_board_reads_its_own_latency_file_or_says_it_has_none(paired):
    tmp_path, source = paired
    _latency(tmp_path)
    page = render([_board([source], model="Timed"), _board([source], model="Untimed", latency="")], tmp_path, compares=())
    timed, untimed = page.split("## Timed")[1].split("## Untimed")
    assert "Latency ([latency.json](../latency.json)): a test machine; 2 MDQA-shaped prompts of 100-120 tokens" in timed
    assert "Not timed, as it refuses this model: MoICE." in timed
    assert "1.01x" in _row_line(timed, "LPES a") and "6.00x at its defaults" in _row_line(timed, "Buckets tuned")
    assert "no `benchmarks/latency.py` run on this model" in untimed
    assert "| not measured |" in _row_line(untimed, "LPES a") and "| 1.00x |" not in untimed
    with pytest.raises(LeaderboardError, match="latency file '.*none.json' does not exist"):
        render([_board([source], latency="none.json")], tmp_path, compares=())


def test_latency_is_read_from_what_latency_py_writes_now(tmp_path):
    """benchmarks/latency.py --json keeps each workload's paired ratios; the page shows generation's median."""
    def measured(prefill: float, generate: float) -> dict:
        return {"prefill": {"paired_ratio": {"median": prefill, "p10": prefill, "p90": prefill}},
                "generate": {"paired_ratio": {"median": generate, "p10": generate, "p90": generate}}}

    summary = {"vanilla": measured(1.0, 1.0), "Found in the Middle": measured(11.5, 10.8)}
    (tmp_path / "latency.json").write_text(json.dumps({"prompt_tokens": [1500], "new_tokens": 16, "summary": summary}))
    assert leaderboard.read_latency(tmp_path / "latency.json").ratios == {"vanilla": 1.0, "Found in the Middle": 10.8}


def test_a_row_timed_at_its_own_setting_gets_that_ratio_and_not_its_methods_defaults(tmp_path):
    """latency.py --setting times a method as a row ran it: that row shows the ratio, unmarked, however the
    numbers are spelled; a row at another setting keeps its method's ratio at its defaults, marked."""
    source = _kept_record(tmp_path, "kept", {
        "vanilla": ({"model": "hf", "model_args": "pretrained=x"}, VANILLA),
        "FitM one copy": ({"model": "fitm_hf", "model_args": "pretrained=x,dtype=bfloat16,spans_per_copy=10,"
                                                               "temperature=0.00005,strength=0.5"}, CURVE),
        "FitM other": ({"model": "fitm_hf", "model_args": "spans_per_copy=5,temperature=5e-05,strength=0.5"}, PI_ROW)})
    summary = {"vanilla": {"ratio": 1.0}, "Found in the Middle": {"ratio": 10.7},
               "Found in the Middle (spans_per_copy=10,temperature=5e-05,strength=0.5)": {"ratio": 2.13}}
    settings = {"Found in the Middle (spans_per_copy=10,temperature=5e-05,strength=0.5)": {
        "method": "Found in the Middle", "args": "spans_per_copy=10,temperature=5e-05,strength=0.5"}}
    (tmp_path / "latency.json").write_text(json.dumps({"prompt_tokens": [100], "new_tokens": 4, "summary": summary,
                                                       "settings": settings}))
    latency = leaderboard.read_latency(tmp_path / "latency.json")
    assert latency.ratios == {"vanilla": 1.0, "Found in the Middle": 10.7}  # a setting is not its method's default
    page = render([_board([source], latency_command="time them")], tmp_path, compares=())
    assert "| 2.13x |" in _row_line(page, "FitM one copy")
    # and the command that would time the other at its own setting, beside every method again
    assert 'time them \\\n    --setting "fitm:spans_per_copy=5,temperature=5e-05,strength=0.5"\n```' in page
    assert "a row that sets its method's parameters is timed at its own setting where `--setting` timed it (1 here)" in page
    assert "10.70x at its defaults" in _row_line(page, "FitM other")


def _compare_folder(tmp_path: Path) -> str:
    """An lpes-compare --output folder as the command leaves it: its board's four files."""
    from lpes_harness.evaluation.compare_board import build_board, write_board

    def row(name, method, right):
        return {"name": name, "method": method, "setting": f"`{name}`", "tuning_forwards": 0 if method == "vanilla" else 20,
                "candidates": 0 if method == "vanilla" else 4, "latency": 1.0,
                "scores": {"8 needles": {p: [1] * right + [0] * (10 - right) for p in POSITIONS}}}

    board = build_board([row("vanilla", "vanilla", 5), row("LPES lines", "lpes_both", 9), row("PCD tuned", "pcd", 6)],
                        title="lpes-compare: tiny", command="lpes-compare --pretrained tiny --output cmp",
                        machine="a test machine", notes=("30 paired samples a row",))
    write_board(tmp_path / "cmp", board)
    return "cmp"


def test_an_lpes_compare_board_opens_the_page_as_the_command_wrote_it(paired):
    tmp_path, source = paired
    page = render([_board([source])], _latency(tmp_path), compares=[CompareBoard("Tiny model", _compare_folder(tmp_path))])
    compare, held_out = page.split("## Held-out tables")
    assert "## `lpes-compare` boards\n\n### Tiny model\n" in compare and "### Tiny" in held_out
    assert "```bash\nlpes-compare --pretrained tiny --output cmp\n```" in compare  # the one command that made it
    assert "- 30 paired samples a row" in compare and "#### By condition" in compare
    assert "![accuracy by gold position](../cmp/positions.png)" in compare
    first = next(line for line in compare.splitlines() if line.startswith("| 1 | LPES lines |"))
    assert "+40.0 [" in first and "4 candidates" in first  # 9 of 10 against 5 of 10 at each of 3 positions
    assert "**First: LPES lines** (LPES both)" in compare
    with pytest.raises(LeaderboardError, match="gone: no leaderboard.json"):
        render([_board([source])], tmp_path, compares=[CompareBoard("Gone", "gone")])


def test_the_committed_page_is_what_the_command_writes_now(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["--out", str(tmp_path / "leaderboard.md")]) == 0
    written = (tmp_path / "leaderboard.md").read_text(encoding="utf-8")
    committed = (ROOT / "docs" / "leaderboard.md").read_text(encoding="utf-8")
    assert written == committed, f"docs/leaderboard.md is out of date; run {leaderboard.COMMAND}"
