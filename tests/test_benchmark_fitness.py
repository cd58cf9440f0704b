"""benchmarks/fitness.py scores through the fitness's public API: the same value as the fitness itself."""

import random

import pytest
from conftest import load_benchmark as load_fitness_benchmark
from test_search_scoring import answering  # noqa: F401 (fixture)

from lpes_harness.search import GenomeSpec, initial_genome, random_genome
from lpes_harness.search.fitness import FitnessConfig, LMEvalFitness


def load_benchmark():
    return load_fitness_benchmark("fitness")


def test_random_genomes_are_valid_and_the_benchmark_starts_from_the_initial_one():
    spec = GenomeSpec(num_layers=30, num_points=4)
    rng = random.Random(3)
    assert all(spec.is_valid(random_genome(spec, rng)) for _ in range(200))
    genomes = load_benchmark().draw_genomes(spec, 5, seed=0)
    assert [list(p) for p in genomes[0]] == [list(p) for p in initial_genome(spec)]
    assert len(genomes) == 5 and all(g.scales == spec.scales(g) for g in genomes)


@pytest.mark.parametrize("mode", ["greedy", "logprob"])
def test_scored_fitness_is_the_fitness_with_every_sample_kept(answering, mode):  # noqa: F811
    lm, records = answering
    config = FitnessConfig(fitness=mode, num_samples=4, chunk_size=3, metadata={"data_path": records}, racing=False)
    fitness = LMEvalFitness(lm, config)
    scales = [1.3] * 4
    value, samples = load_benchmark().scored_fitness(fitness, scales)
    expected, info = fitness(scales)
    assert value == pytest.approx(expected, abs=1e-9)
    assert len(samples) == sum(fitness.sizes.values())
    for role, mean in info["scores"].items():
        scores = [s for (r, _), s in samples.items() if r == role]
        assert sum(scores) / len(scores) == pytest.approx(mean, abs=1e-9)
