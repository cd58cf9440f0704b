"""benchmarks/robust_efficiency.py: a recorded run's best at a forward budget, read from its journal, and the report."""

import json

import pytest
from conftest import REPO_ROOT
from conftest import load_benchmark as load


def test_the_best_at_a_budget_is_the_best_complete_evaluation_started_before_it():
    best_at = load("robust_efficiency").best_at
    journal = [{"label": "start", "score": 0.5, "forwards": 100, "complete": True},
               {"label": "raced out", "score": 0.9, "forwards": 30, "complete": False},  # a racing bound, not a fitness
               {"label": "better", "score": 0.6, "forwards": 100, "complete": True},
               {"label": "later", "score": 0.8, "forwards": 100, "complete": True}]
    assert best_at(journal, 100)["label"] == "start" and best_at(journal, 100)["forwards_used"] == 100
    # the evaluation that crosses the budget still counts (started at 130, ends at 230)
    assert best_at(journal, 131)["label"] == "better" and best_at(journal, 131)["forwards_used"] == 230
    assert best_at(journal, 10_000)["label"] == "later" and best_at(journal, 10_000)["forwards_used"] == 330
    assert best_at([{"label": "x", "score": 1, "forwards": 5, "complete": False}], 100) is None


def test_journals_charge_each_evaluation_its_own_forwards(tmp_path):
    bench = load("robust_efficiency")
    ga = tmp_path / "ga"
    ga.mkdir()
    (ga / "sweep.json").write_text(json.dumps({"points": [
        {"kind": "position", "scale": 0.8, "fitness": 0.7, "info": {"samples": 20, "raced": True}},
        {"kind": "base", "scale": 2.0, "fitness": 0.8, "info": {"samples": 30, "raced": False}}]}))
    history = [{"index": 0, "cached": True, "scales": [1.0] * 60, "fitness": 0.8, "info": {"samples": 30}},
               {"index": 1, "cached": False, "scales": [0.9] * 60, "fitness": 0.85, "info": {"samples": 30, "raced": False}}]
    (ga / "history.jsonl").write_text("".join(json.dumps(row) + "\n" for row in history))
    rows = bench.ga_evaluations(ga)
    assert [row["label"] for row in rows] == ["uniform position 0.8", "uniform base 2", "#1"]  # the cached start is free
    assert [row["forwards"] for row in rows] == [20, 30, 30]
    assert rows[1]["scales"] == [1.0] * 30 + [2.0] * 30 and rows[0]["complete"] is False
    gradient = tmp_path / "gradient"
    gradient.mkdir()
    steps = [{"step": 0, "loss": 0.6, "factors": [1.0] * 60, "forwards": 48, "rejected": False},
             {"step": 1, "loss": 0.5, "factors": [1.1] * 60, "forwards": 96, "rejected": True},
             {"step": 2, "loss": 0.55, "factors": [1.05] * 60, "forwards": 144, "rejected": False}]
    (gradient / "gradient.jsonl").write_text("".join(json.dumps(step) + "\n" for step in steps))
    rows = bench.gradient_evaluations(gradient)
    assert [row["forwards"] for row in rows] == [48, 48, 48]  # the journal's counts are cumulative
    assert bench.best_at(rows, 1000)["label"] == "step 2"  # the rejected step's lower loss is not a candidate


def test_the_plan_of_the_committed_runs():
    bench = load("robust_efficiency")
    cells = bench.plan()
    names = bench.name_curves(cells)
    races = [c for c in cells if c["method"] == "race"]
    assert [(c["seed"], c["budget"]) for c in races] == [(4, 576), (5, 576), (6, 576)]
    final = [c for c in cells if c["budget"] == "final"]
    assert [(c["method"], c["seed"]) for c in final] == [bench.REFERENCE]
    committed = json.loads((REPO_ROOT / "results/robust_smollm2_gpu_seed1/scales.json").read_text())
    assert final[0]["scales"] == committed["scales"] + committed["base_scales"]
    for cell in cells:  # a run either reached the budget or ended before it, having spent every forward it made
        if cell["method"] != "race" and cell["budget"] != "final" and cell["forwards_used"] < cell["budget"]:
            folder = REPO_ROOT / "results" / cell["folder"]
            journal = bench.gradient_evaluations(folder) if cell["method"] == "gradient" else bench.ga_evaluations(folder)
            assert cell["forwards_used"] == sum(row["forwards"] for row in journal)
    assert "vanilla" in names.values() and len(set(names.values())) == len(names)


def test_the_report_pairs_every_row_with_vanilla_per_condition_and_pooled(tmp_path):
    report = load("efficiency_robust_report")
    conditions = load("robust_efficiency").CONDITIONS
    scores = {"vanilla": [0, 0, 1, 1], "LPES r4": [1, 1, 1, 1], "LPES g1": [1, 0, 0, 1]}
    for number, name in enumerate(conditions):
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        table = {"task": "multi_needle", "split": "heldout", "metadata": {"n": number}, "chat_template": True,
                 "scores": {row: {"0": values[:2], "50": values[2:]} for row, values in scores.items()}}
        (folder / "heldout.json").write_text(json.dumps({"scored": table}))
    cells = [{"method": "race", "seed": 4, "budget": 576, "forwards_used": 576, "row": "r4"},
             {"method": "ga-cpu", "seed": 1, "budget": 576, "forwards_used": 651, "row": "g1"}]
    report.write_report(tmp_path, cells, {"num_samples": 2, "seed": 7, "dtype": "bfloat16", "conditions": conditions})
    record = json.loads((tmp_path / "efficiency.json").read_text())
    race, ga = record["cells"]
    assert race["pooled"]["difference"] == pytest.approx(0.5) and race["pooled"]["n"] == 16
    assert race["pooled"]["gained"] == 8 and race["pooled"]["lost"] == 0
    assert ga["pooled"]["difference"] == 0 and ga["pooled"]["gained"] == 4 and ga["pooled"]["lost"] == 4
    (row,) = [r for r in record["summary"] if r["method"] == "ga-cpu"]
    assert row["against_race"]["difference"] == pytest.approx(-0.5)
    assert (tmp_path / "efficiency.png").stat().st_size > 0
    assert "| race | 576 | 4 | 576 | r4 |" in (tmp_path / "efficiency.md").read_text()


def test_a_cell_names_a_uniform_pair_pi_and_a_curve_by_its_ends():
    describe = load("efficiency_robust_report").describe
    assert describe([1.0] * 60) == "the plain model"
    assert describe([1.05] * 30 + [0.9] * 30) == "uniform position 1.05, base 0.9 (PI)"
    assert describe([0.5 + i / 29 for i in range(30)] + [1.0] * 30) == "position 0.50 → 1.50, base 1.00 → 1.00"


@pytest.mark.parametrize("argv, message", [
    (["--num-samples", "0"], "--num-samples"),
    (["--dtype", "float8"], "--dtype"),
    (["--report"], "has no held-out table for 120 sentences"),
])  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    output = tmp_path / "eff"
    with pytest.raises(SystemExit):
        load("robust_efficiency").main([*argv, "--output", str(output)])
    assert message in capsys.readouterr().err
    assert not output.exists()
