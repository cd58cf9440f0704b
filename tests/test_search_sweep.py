"""The uniform sweep chooses the start without narrowing the range."""

import pytest

from lpes_harness.search.genome import GenomeSpec, initial_genome
from lpes_harness.search.config import SearchConfig
from lpes_harness.search.loop import GeneticSearch
from lpes_harness.search.sweep import parse_sweep, run_sweep, snap_initial_y

LAYERS = 8


def stub_fitness(scales, threshold=float("-inf")):
    """Best uniform scale is 1; the best curve rises to 2 in the last layers (as on SmolLM2)."""
    uniform = len(set(scales)) == 1
    if uniform:
        return -abs(scales[0] - 1.0), {"raced": False}
    target = [1.0] * (LAYERS // 2) + [2.0] * (LAYERS - LAYERS // 2)
    return 1.0 - sum(abs(s - t) for s, t in zip(scales, target)) / LAYERS, {"raced": False}


def test_sweep_picks_the_best_uniform_scale_and_keeps_the_range_open():
    sweep = run_sweep(stub_fitness, parse_sweep("0.5,1,1.5,2"), GenomeSpec(num_layers=LAYERS).uniform)
    assert sweep["best"] == 1.0
    start = snap_initial_y(sweep["best"], 0.25, 2.5, 0.05)
    spec = GenomeSpec(num_layers=LAYERS, num_points=4, y_min=0.25, y_max=2.5, y_step=0.05, initial_y=start)
    assert spec.y_max == 2.5  # not clipped to where uniform scales still work
    assert {y for _, y in initial_genome(spec)} == {1.0}
    config = SearchConfig(population=8, parents=3, mutants=4, crossovers=1, generations=12,
                          my=0.4, mx=2, seed=0)
    result = GeneticSearch(spec, lambda scales: stub_fitness(scales), config).run()
    assert max(result["best"]["scales"]) >= 1.8  # the search reached the high-late curve


def test_sweep_races_later_values_against_the_best():
    calls = []

    def evaluate(scales, threshold):
        calls.append((scales[0], threshold))
        fitness, info = stub_fitness(scales)
        return fitness, {**info, "raced": fitness < threshold}

    sweep = run_sweep(evaluate, parse_sweep("2,1"), GenomeSpec(num_layers=LAYERS).uniform)
    assert calls[0] == (1.0, float("-inf"))  # nearest 1 first
    assert calls[1][1] == 0.0
    assert sweep["best"] == 1.0


@pytest.mark.parametrize("text, message", [("a,b", "separated by commas"), ("0,1", "positive")])
def test_bad_sweep_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_sweep(text)
    assert parse_sweep("none") == []
