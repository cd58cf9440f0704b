"""Racing with an exact bound: it saves work and never changes which parents are selected."""

import hashlib
import math

import pytest

from lpes_harness.search import GeneticSearch, GenomeSpec, SearchConfig
from lpes_harness.search.fitness import (DEFAULT_WEIGHTS, FitnessConfig, check_tiebreak, combine, raced_fitness,
                                         roles_order)

SIZES = {"begin": 20, "middle": 20, "end": 20}


def sample_correct(scales, role, index) -> float:
    """A deterministic synthetic model: accuracy rises as the scales approach a target curve."""
    target = {"begin": 1.2, "middle": 1.5, "end": 1.7}[role]
    p = math.exp(-4 * sum((s - target) ** 2 for s in scales) / len(scales))
    digest = hashlib.sha256(f"{[round(s, 6) for s in scales]}|{role}|{index}".encode()).digest()
    return 1.0 if digest[0] / 256 < p else 0.0


class CountingFitness:
    def __init__(self, racing: bool, objective: str = "weighted"):
        self.racing = racing
        self.objective = objective
        self.samples_scored = 0

    def __call__(self, scales, threshold=-math.inf):
        scales = list(scales)

        def score_chunk(role, indices):
            self.samples_scored += len(indices)
            return [sample_correct(scales, role, i) for i in indices]

        return raced_fitness(
            score_chunk, SIZES, DEFAULT_WEIGHTS, chunk_size=5, threshold=threshold if self.racing else -math.inf,
            objective=self.objective,
        )


class ParentsRecorder:
    """Records the parents each generation hands to the next (top parents by fitness)."""

    def __init__(self):
        self.parents = []

    def on_search_start(self, search): ...
    def on_individual(self, search, record): ...
    def on_search_end(self, search, result): ...

    def on_generation_end(self, search, stats):
        selected = search.toolbox.select(search.population)
        self.parents.append([(tuple(map(tuple, p)), p.fitness.values[0]) for p in selected])


def run_search(racing: bool, seed: int, objective: str = "weighted"):
    fitness = CountingFitness(racing, objective)
    recorder = ParentsRecorder()
    spec = GenomeSpec(num_layers=12, y_min=1.0, y_max=2.0)
    config = SearchConfig(population=12, parents=4, mutants=6, crossovers=2, generations=6, seed=seed)
    result = GeneticSearch(spec, fitness, config, [recorder]).run()
    return result, recorder.parents, fitness.samples_scored


@pytest.mark.parametrize("seed, objective", [(0, "weighted"), (1, "weighted"), (2, "weighted"), (0, "ranked"), (1, "ranked")])
def test_racing_selects_exactly_the_same_parents_with_less_work(seed, objective):
    full_result, full_parents, full_work = run_search(racing=False, seed=seed, objective=objective)
    raced_result, raced_parents, raced_work = run_search(racing=True, seed=seed, objective=objective)
    assert raced_parents == full_parents
    assert raced_result["best"]["genome"] == full_result["best"]["genome"]
    assert raced_result["best"]["fitness"] == full_result["best"]["fitness"]
    assert raced_work < full_work, "racing should have stopped some evaluations early"


def test_a_raced_result_is_an_upper_bound_below_the_threshold():
    scales = [3.0] * 12  # far from every target: accuracy near 0

    def score_chunk(role, indices):
        return [sample_correct(scales, role, i) for i in indices]

    exact, exact_info = raced_fitness(score_chunk, SIZES, DEFAULT_WEIGHTS, chunk_size=5)
    raced, info = raced_fitness(score_chunk, SIZES, DEFAULT_WEIGHTS, chunk_size=5, threshold=0.6)
    assert info["raced"] and not exact_info["raced"]
    assert exact <= raced < 0.6
    assert sum(info["samples"].values()) < sum(exact_info["samples"].values())


@pytest.mark.parametrize("curve", [0.5, 1.0, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("threshold", [0.3, 0.6, 0.9])
def test_chunks_of_one_sample_stop_at_the_first_sample_that_proves_an_individual_cannot_win(curve, threshold):
    """In a given sample order a smaller racing chunk changes no verdict and no complete fitness, and never
    scores more samples (results/demo_chunk1_avx2: what that saves a search, whose order learns from them)."""
    scales = [curve] * 12

    def score_chunk(role, indices):
        return [sample_correct(scales, role, i) for i in indices]

    one, one_info = raced_fitness(score_chunk, SIZES, DEFAULT_WEIGHTS, chunk_size=1, threshold=threshold)
    for chunk_size in (2, 5, 20):
        other, other_info = raced_fitness(score_chunk, SIZES, DEFAULT_WEIGHTS, chunk_size=chunk_size, threshold=threshold)
        assert one_info["raced"] == other_info["raced"]
        assert sum(one_info["samples"].values()) <= sum(other_info["samples"].values())
        if not one_info["raced"]:
            assert one == other
    if one_info["raced"]:  # before its last sample, the bound could still reach the threshold
        order = [(role, i) for role in roles_order(SIZES, DEFAULT_WEIGHTS) for i in range(SIZES[role])]
        before = order[: sum(one_info["samples"].values()) - 1]
        reachable = {role: float(SIZES[role]) for role in SIZES}
        for role, i in before:
            reachable[role] -= 1.0 - sample_correct(scales, role, i)
        assert one < threshold <= combine({r: reachable[r] / SIZES[r] for r in SIZES}, DEFAULT_WEIGHTS)


def test_no_racing_when_the_threshold_is_reachable():
    fitness, info = raced_fitness(lambda role, idx: [1.0] * len(idx), SIZES, DEFAULT_WEIGHTS, chunk_size=5, threshold=0.99)
    assert fitness == pytest.approx(1.0) and not info["raced"]


def test_logprob_mode_bounds_with_zero_as_the_best_sample():
    fitness, info = raced_fitness(
        lambda role, idx: [-2.0] * len(idx), SIZES, DEFAULT_WEIGHTS, chunk_size=5, threshold=-0.5, max_score=0.0
    )
    assert info["raced"] and -2.0 <= fitness < -0.5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"fitness": "sample"}, "fitness mode 'sample' is not one of"),
        ({"objective": "worst"}, "fitness objective 'worst' is not one of"),
        ({"weights": {"begin": 1.0, "end": 1.0}}, "weights need exactly the roles"),
        ({"weights": {"begin": -1.0, "middle": 1.0, "end": 1.0}}, "weights must be finite, >= 0"),
        ({"task": "no_such_task"}, "unknown position task 'no_such_task'"),
        ({"task": "needle", "positions": {"begin": 0, "middle": 40, "end": 100}}, r"middle=\[40\] is not among"),
    ],
)
def test_bad_fitness_settings_are_named(kwargs, message):
    # Any registered position task is accepted (its roles are its own); an unknown one is named.
    with pytest.raises(ValueError, match=message):
        FitnessConfig(**kwargs)


def test_racing_scores_the_heaviest_position_first_and_stops_a_hopeless_individual_soonest():
    requested = []

    def all_wrong(role, indices):
        requested.append(role)
        return [0.0] * len(indices)

    fitness, info = raced_fitness(all_wrong, SIZES, DEFAULT_WEIGHTS, chunk_size=5, threshold=0.15)
    # end (0.5) then middle (0.3): bound 0.2; two chunks of begin (0.2) take it to 0.1 < 0.15.
    assert requested[:4] == ["end"] * 4 and requested[4:8] == ["middle"] * 4
    assert info["raced"] and info["samples"] == {"end": 20, "middle": 20, "begin": 10}
    assert fitness == pytest.approx(0.1)


def test_any_registered_position_task_brings_its_own_roles():
    assert FitnessConfig(task="needle").positions == {"begin": (0,), "middle": (50,), "end": (100,)}
    assert FitnessConfig(task="kv_retrieval").positions == {"begin": (0,), "middle": (40,), "end": (100,)}
    assert FitnessConfig(task="multi_needle").positions == {"begin": (0,), "middle": (25, 50, 75), "end": (100,)}


def test_the_ranked_objective_gives_the_largest_weight_to_the_worst_off_role():
    means = {"begin": 1.0, "middle": 0.4, "end": 0.9}
    assert combine(means, DEFAULT_WEIGHTS) == pytest.approx(0.2 * 1.0 + 0.3 * 0.4 + 0.5 * 0.9)
    assert combine(means, DEFAULT_WEIGHTS, "ranked") == pytest.approx(0.5 * 0.4 + 0.3 * 0.9 + 0.2 * 1.0)
    # The smallest weighted sum over every way of handing out the weights (rearrangement inequality).
    import itertools
    import random

    rng = random.Random(0)
    for _ in range(200):
        means = {role: rng.random() for role in SIZES}
        every = [sum(w * means[r] for w, r in zip(order, SIZES)) for order in itertools.permutations(DEFAULT_WEIGHTS.values())]
        assert combine(means, DEFAULT_WEIGHTS, "ranked") == pytest.approx(min(every))


def test_one_score_reached_by_two_sums_is_one_fitness_and_the_ga_keeps_population_order_on_it():
    """0.2 * 1 + 0.3 * 0.4 + 0.5 * 1 is 0.8200000000000001 as floats, 0.2 * 0.95 + 0.3 * 31 / 60 + 0.5 * 0.95
    is 0.82: without rounding the GA's selection (deap's selBest), its fitter parent and the best-so-far
    would rank them by their last bits, not by population order as documented."""
    import random

    from lpes_harness.search.condition_fitness import combine_conditions
    from lpes_harness.search.genome import make_individual
    from lpes_harness.search.operators import build_toolbox, fitter

    first, second = {"begin": 1.0, "middle": 0.4, "end": 1.0}, {"begin": 0.95, "middle": 31 / 60, "end": 0.95}
    assert 0.2 * 1.0 + 0.3 * 0.4 + 0.5 * 1.0 != 0.2 * 0.95 + 0.3 * (31 / 60) + 0.5 * 0.95  # the floats differ
    assert combine(first, DEFAULT_WEIGHTS) == combine(second, DEFAULT_WEIGHTS) == 0.82
    assert combine_conditions({"a": combine(first, DEFAULT_WEIGHTS), "b": 0.7, "c": 0.1}) == combine_conditions(
        {"a": 0.1, "b": combine(second, DEFAULT_WEIGHTS), "c": 0.7})
    spec = GenomeSpec(num_layers=8)
    population = []
    for index, means in enumerate((first, second, first, second)):
        individual = make_individual([(0.0, 1.0 + index / 10), (7.0, 1.0)])
        individual.fitness.values = (combine(means, DEFAULT_WEIGHTS),)
        population.append(individual)
    toolbox = build_toolbox(spec, random.Random(0), num_parents=2)
    for order in (population, population[::-1]):
        assert [id(i) for i in toolbox.select(order)] == [id(i) for i in order[:2]]  # ties keep population order
        assert fitter(order) is order[0]


def test_a_ranked_search_cannot_trade_one_position_away_for_another():
    lopsided = {"begin": 1.0, "middle": 0.30, "end": 1.0}  # what the ramp of issue #12 did: ends kept, middle lost
    even = {"begin": 0.75, "middle": 0.60, "end": 0.75}
    assert combine(lopsided, DEFAULT_WEIGHTS) > combine(even, DEFAULT_WEIGHTS)
    assert combine(lopsided, DEFAULT_WEIGHTS, "ranked") < combine(even, DEFAULT_WEIGHTS, "ranked")


def test_the_tiebreak_check_knows_a_ranked_role_may_take_any_weight():
    weights = {"begin": 0.01, "middle": 1.0, "end": 1.0}
    positions = {"begin": (0,), "middle": (25, 50, 75), "end": (100,)}
    check_tiebreak(weights, 200, positions)  # weighted: a begin sample is worth 5e-5, above the 2e-5 tie-break
    with pytest.raises(ValueError, match="one sample is worth only"):
        check_tiebreak(weights, 200, positions, "ranked")  # ranked: 0.01 may fall on a middle sample, 1.7e-5
