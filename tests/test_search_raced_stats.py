"""Generation statistics are honest: a raced-out individual's upper bound is never averaged as a fitness."""

import io
import json
import math
import sys

import pytest

from lpes_harness.core.files import read_jsonl
from lpes_harness.evaluation.plots import plot_fitness
from lpes_harness.search import GeneticSearch, GenomeSpec, SearchConfig
from lpes_harness.search.callbacks import HistoryCallback, PlotCallback, ProgressCallback, generation_postfix
from lpes_harness.search.loop import Callback

SPEC = GenomeSpec(num_layers=10, num_points=3)
CONFIG = SearchConfig(population=8, parents=3, mutants=4, crossovers=1, generations=3, seed=2)


def true_fitness(scales):
    return -sum((s - 1.4 - 0.2 * math.cos(i)) ** 2 for i, s in enumerate(scales))


def racing_fitness(scales, threshold=-math.inf):
    """Like fitness.py's racing: below the threshold, stop and return an upper bound (here well above)."""
    value = true_fitness(scales)
    if value < threshold:
        return threshold - 1e-3, {"raced": True}
    return value, {"raced": False}


def run(tmp_path, *callbacks):
    recorded = []

    class Keep(Callback):
        def on_generation_end(self, search, stats):
            recorded.append([(ind.fitness.values[0], ind.info["raced"], list(ind.scales)) for ind in search.population])

    search = GeneticSearch(SPEC, racing_fitness, CONFIG, [*callbacks, Keep()])
    search.run()
    return search, recorded


def test_generation_means_use_complete_individuals_and_count_raced_ones_apart(tmp_path):
    search, populations = run(tmp_path)
    assert sum(s["raced_out"] for s in search.generation_stats) > 0, "the test search raced nobody"
    for stats, population in zip(search.generation_stats, populations):
        complete = [f for f, raced, _ in population if not raced]
        raced = [f for f, raced, _ in population if raced]
        assert stats["complete"] == len(complete) and stats["raced_out"] == len(raced)
        assert stats["mean_fitness"] == pytest.approx(sum(complete) / len(complete))
        assert stats["fitnesses"] == complete and stats["raced_bounds"] == raced
        assert stats["best_fitness"] == max(complete)
        # A raced individual's bound is above its true fitness: averaging it would flatter the generation.
        for fitness, was_raced, scales in population:
            if was_raced:
                assert fitness > true_fitness(scales)
    with_bounds = [s for s, p in zip(search.generation_stats, populations) if s["raced_out"]]
    stats = with_bounds[0]
    everyone = stats["fitnesses"] + stats["raced_bounds"]
    assert stats["mean_fitness"] != pytest.approx(sum(everyone) / len(everyone))


def test_generations_jsonl_and_progress_show_raced_out_apart(tmp_path, monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buffer)
    search, _ = run(tmp_path, HistoryCallback(tmp_path / "history.jsonl", tmp_path / "generations.jsonl"),
                    ProgressCallback(disable=False))
    lines = read_jsonl(tmp_path / "generations.jsonl")
    assert [line["raced_out"] for line in lines] == [s["raced_out"] for s in search.generation_stats]
    assert all(line["complete"] + line["raced_out"] == CONFIG.population for line in lines)
    last = search.generation_stats[-1]
    assert f"raced_out={last['raced_out']}" in buffer.getvalue()
    assert f"mean={last['mean_fitness']:.4f}" in buffer.getvalue()
    assert json.loads(json.dumps(lines)) == lines


def test_postfix_without_complete_individuals_and_for_old_statistics():
    assert generation_postfix({"best_fitness": 0.5, "mean_fitness": None, "complete": 0, "raced_out": 4}) == {
        "best": "0.5000", "mean": "n/a", "complete": 0, "raced_out": 4}
    assert generation_postfix({"best_fitness": 0.5, "mean_fitness": 0.25}) == {"best": "0.5000", "mean": "0.2500"}


def test_fitness_plot_marks_raced_individuals_apart_and_keeps_them_out_of_the_mean(tmp_path, monkeypatch):
    figures = []
    from lpes_harness.evaluation import plots  # the figures are drawn there (one plotting module for search and report)

    monkeypatch.setattr(plots, "save_agg", lambda figure, path: figures.append(figure))
    search, _ = run(tmp_path, PlotCallback(tmp_path))
    axes = figures[-1].axes[0]
    lines = {line.get_label(): line for line in axes.get_lines()}
    raced_label = next(label for label in lines if label.startswith("raced out"))
    total = sum(s["raced_out"] for s in search.generation_stats)
    assert f"({total}, not in the mean)" in raced_label
    raced_line, complete_line = lines[raced_label], lines["individual (complete)"]
    assert raced_line.get_marker() != complete_line.get_marker()
    assert list(raced_line.get_ydata()) == [b for s in search.generation_stats for b in s["raced_bounds"]]
    assert list(complete_line.get_ydata()) == [f for s in search.generation_stats for f in s["fitnesses"]]
    assert list(lines["mean of complete"].get_ydata()) == [s["mean_fitness"] for s in search.generation_stats]


def test_old_generation_statistics_still_plot(tmp_path):
    old = [{"generation": 0, "best_fitness": 0.4, "mean_fitness": 0.2}, {"generation": 1, "best_fitness": 0.5, "mean_fitness": 0.3}]
    plot_fitness(tmp_path / "fitness.png", old)
    assert (tmp_path / "fitness.png").read_bytes().startswith(b"\x89PNG")
