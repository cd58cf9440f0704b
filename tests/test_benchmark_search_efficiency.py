"""benchmarks/search_efficiency.py on a tiny model: every method stops at its budget, a rerun scores
nothing again, a run cut short replays its journal to the same result, and CMA-ES candidates are
repaired into valid genomes."""

import json
import random

import numpy as np
import pytest
from conftest import load_benchmark
from tiny_models import save_tiny_checkpoint

from lpes_harness.search import GenomeSpec

BUDGETS = (12, 24)


@pytest.fixture(scope="module")
def benchmark():
    return load_benchmark("search_efficiency")


@pytest.fixture(scope="module")
def methods():
    return load_benchmark("efficiency_methods")


@pytest.fixture(scope="module")
def report():
    return load_benchmark("efficiency_report")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, benchmark):
    folder = tmp_path_factory.mktemp("efficiency")
    checkpoint = save_tiny_checkpoint(folder / "model")
    argv = ["--quick", "--pretrained", str(checkpoint), "--device", "cpu", "--dtype", "float32", "--fitness",
            "logprob", "--budgets", ",".join(map(str, BUDGETS)), "--output", str(folder / "out")]
    assert benchmark.main(argv) == 0
    return argv, folder / "out"


def test_every_method_stops_at_the_first_evaluation_past_its_budget(finished, methods):
    _, out = finished
    record = json.loads((out / "efficiency.json").read_text())
    runs = {(r["method"], r["budget"]): r for r in record["runs"]}
    assert set(runs) == {(m, b) for m in methods.METHODS for b in BUDGETS}
    spec = GenomeSpec(num_layers=len(runs[("random", 12)]["best"]["scales"]), num_points=4, y_min=0.25, y_max=2.5,
                      y_step=0.05)
    for (method, budget), run in runs.items():
        assert run["forwards"] >= budget > run["forwards"] - run["last_evaluation_forwards"], (method, budget)
        assert spec.is_valid([tuple(p) for p in run["best"]["genome"]]), run["best"]["genome"]
        assert run["best"]["found_at_forwards"] <= run["forwards"]
    for method in methods.METHODS:  # one search serves both budgets: the larger budget's best is no worse
        assert runs[(method, 24)]["best"]["fitness"] >= runs[(method, 12)]["best"]["fitness"]
        assert runs[(method, 24)]["forwards"] >= runs[(method, 12)]["forwards"]
    assert (out / "efficiency.png").stat().st_size > 0
    assert "## Budget 12 forwards" in (out / "efficiency.md").read_text()


def test_a_rerun_scores_nothing_and_a_cut_run_replays_its_journal(finished, benchmark, capsys):
    argv, out = finished
    before = json.loads((out / "efficiency.json").read_text())
    capsys.readouterr()
    assert benchmark.main(argv) == 0
    assert "new search forwards: 0; new held-out samples: 0" in capsys.readouterr().out
    # Forget the larger budget's runs, as a kill after the smaller budget would: the rerun replays
    # every evaluation from evaluations.jsonl, scores none, and finds the same bests at the same cost.
    cut = {**before, "runs": [r for r in before["runs"] if r["budget"] == BUDGETS[0]]}
    (out / "efficiency.json").write_text(json.dumps(cut))
    assert benchmark.main(argv) == 0
    assert "new search forwards: 0; new held-out samples: 0" in capsys.readouterr().out
    after = json.loads((out / "efficiency.json").read_text())
    key = lambda r: (r["method"], r["seed"], r["budget"])  # noqa: E731
    assert sorted(after["runs"], key=key) == sorted(before["runs"], key=key)


def test_a_rerun_with_other_settings_is_refused(finished, benchmark, capsys):
    argv, out = finished
    before = (out / "efficiency.json").read_text()
    assert benchmark.main(argv + ["--num-samples", "3"]) == 2
    assert "holds runs made with other settings (num_samples" in capsys.readouterr().err
    assert (out / "efficiency.json").read_text() == before


def test_repair_makes_any_cma_vector_a_valid_genome(methods):
    spec = GenomeSpec(num_layers=30, num_points=4, y_min=0.25, y_max=2.5, y_step=0.05)
    rng = random.Random(0)
    for _ in range(500):
        vector = [rng.gauss(0.5, 1.0) for _ in range(8)]
        genome = methods.repair(spec, vector)
        assert spec.is_valid(genome), (vector, genome)
    crowded = methods.repair(spec, [1.0, 1.0, 1.0, 1.0, 0.0, 0.6, 1.0, np.nan])
    assert [x for x, _ in crowded] == [26, 27, 28, 29]  # all at the right end: pushed apart, still on the grid
    ys = [y for _, y in crowded]
    assert ys[:3] == [0.25, pytest.approx(1.6), 2.5] and 1.35 <= ys[3] <= 1.4  # nan is the middle of the range


def test_the_hardest_sample_order_replays_the_journal_with_the_same_results(finished, tmp_path):
    """benchmarks/sample_order.py: the same evaluations in the hardest order, nothing selected changes."""
    from lpes_harness.core.files import read_jsonl

    _, out = finished
    journal = read_jsonl(out / "evaluations.jsonl")
    report = tmp_path / "order.json"
    assert load_benchmark("sample_order").main(["--journal", str(out / "evaluations.jsonl"), "--device", "cpu",
                                                "--evaluations", "20", "--json", str(report)]) == 0
    summary = json.loads(report.read_text())["summary"]
    assert summary["evaluations"] == min(20, len(journal)) and summary["changed"] == []
    assert summary["roles_forwards"] == sum(e["forwards"] for e in journal[:20])
    assert 0 < summary["hardest_forwards"]


def test_a_seed_that_kept_a_uniform_scale_is_named_pi(report):
    run = {"method": "ga", "seed": 2, "budget": 8, "forwards": 9, "best": {"fitness": 0.9, "scales": [0.8] * 4},
           "heldout": {"accuracy": 0.6, "over_vanilla": {"difference": 0.05, "difference_interval": [0.0, 0.1], "p": 0.06},
                       "over_start": {"difference": 0.0, "difference_interval": [0.0, 0.0], "p": 1.0}}}
    curve = {**run, "seed": 3, "best": {"fitness": 0.95, "scales": [0.8, 0.9, 1.0, 1.1]}}
    assert report.kept_uniform(run) == "uniform 0.8 (PI)" and report.kept_uniform(curve) is None
    record = {"settings": {"task": "multi_needle", "metadata": {}, "pretrained": None, "dtype": "float32",
                           "fitness": "greedy", "num_samples": 8, "heldout_samples": 40, "sweep": "1,0.8"},
              "start": 0.8, "runs": [run, curve]}
    text = report.format_report(record)
    assert "2, uniform 0.8 (PI): +5.0" in text and "3: +5.0" in text


def test_each_budgets_mean_says_over_how_many_seeds(report, tmp_path):
    def run(seed, budget):
        return {"method": "random", "seed": seed, "budget": budget, "forwards": budget + 1,
                "best": {"fitness": 0.9, "scales": [0.8, 0.9, 1.0, 1.1]},
                "heldout": {"accuracy": 0.6, "over_vanilla": {"difference": 0.01 * seed, "difference_interval": [0.0, 0.1], "p": 0.5},
                            "over_start": {"difference": 0.0, "difference_interval": [0.0, 0.0], "p": 1.0}}}
    record = {"settings": {"task": "multi_needle", "metadata": {}, "pretrained": None, "dtype": "float32",
                           "fitness": "greedy", "num_samples": 8, "heldout_samples": 40, "sweep": "1,0.8"},
              "start": 0.8, "runs": [run(1, 8), run(2, 8), run(3, 8), run(1, 16)]}
    text = report.format_report(record)
    small, large = text.split("## Budget 16 forwards")
    assert "| random | 3 | 9 |" in small and "+2.0 [+1.0, +3.0]" in small
    assert "| random | 1 | 17 |" in large and "+1.0 [+1.0, +1.0]" in large
    report.plot_report(record, tmp_path / "efficiency.png")
    assert (tmp_path / "efficiency.png").stat().st_size > 0


def test_each_method_is_compared_with_the_demos_search_on_the_same_samples(report, tmp_path):
    """The head-to-head pairs two searches' bests sample by sample from the held-out score cache."""
    from lpes_harness.evaluation.score_cache import ScoreCache

    curve, other = [0.8, 0.9, 1.0, 1.1], [0.7, 0.9, 1.1, 1.3]
    scores = {  # two positions of 4 samples: the demo's curve right on 6, the other on 4, both right on 3
        (tuple(curve), 0): [1, 1, 1, 0], (tuple(curve), 100): [1, 1, 1, 0],
        (tuple(other), 0): [1, 0, 0, 1], (tuple(other), 100): [1, 1, 0, 0],
    }
    cache = {"identity": {}, "fingerprints": {"0": ["a"] * 4, "100": ["b"] * 4},
             "blocks": {ScoreCache.key(list(s), p): v for (s, p), v in scores.items()}}
    (tmp_path / "scores.cache.json").write_text(json.dumps(cache))

    def run(method, seed, scales):
        return {"method": method, "seed": seed, "budget": 8, "best": {"scales": scales}}
    record = {"settings": {"heldout_samples": 4},
              "runs": [run(report.DEFAULT_METHOD, 1, curve), run("paper-ga", 1, other), run("paper-ga", 2, other),
                       run("random", 1, curve)]}
    rows = report.head_to_head(record, tmp_path / "scores.cache.json")
    # paper-ga seed 2 has no demo seed 2 to face; random seed 1 holds the same curve: a tie
    assert [(r["method"], r["seed"]) for r in rows] == [("paper-ga", 1), ("random", 1)]
    versus, tie = rows
    assert (versus["gained"], versus["lost"]) == (1, 3) and versus["difference"] == pytest.approx(-2 / 8)
    assert (tie["gained"], tie["lost"], tie["difference"]) == (0, 0, 0)
    lines = "\n".join(report.format_head_to_head(rows))
    assert "| 8 | paper-ga | -25.0 [" in lines and "1 / 3, p = 0.625" in lines
    assert "| 8 | random | the same curve | +0.0 |" in lines and not versus["same_curve"]
    # a best whose held-out scores are missing is left out rather than compared on fewer samples
    record["settings"]["heldout_samples"] = 5
    assert report.head_to_head(record, tmp_path / "scores.cache.json") == []
