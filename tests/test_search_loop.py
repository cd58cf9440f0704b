"""Algorithm 1: generation structure, elitism, the fitness cache, determinism, in-process resume."""

import json
import math
import random

import numpy as np
import pytest

from lpes_harness.search import Callback, GeneticSearch, GenomeSpec, SearchConfig, cache_key, initial_genome
from lpes_harness.search.genome import ramp_genome

SMALL = SearchConfig(population=10, parents=4, mutants=4, crossovers=2, generations=5, seed=1)


def target_curve(num_layers):
    return [1.3 + 0.4 * math.sin(3.0 * layer / num_layers) for layer in range(num_layers)]


def synthetic_fitness(scales):
    """A smooth fitness of the layer scales, best at `target_curve`."""
    target = target_curve(len(scales))
    error = sum((s - t) ** 2 for s, t in zip(scales, target)) / len(target)
    return -error, {"error": error, "begin": 1 - error, "middle": 1 - 2 * error, "end": 1 - 3 * error}


class Recorder(Callback):
    def __init__(self):
        self.records, self.stats, self.populations = [], [], []
        self.started = self.ended = 0

    def on_search_start(self, search):
        self.started += 1

    def on_individual(self, search, record):
        self.records.append(record)

    def on_generation_end(self, search, stats):
        self.stats.append(stats)
        self.populations.append([(list(map(tuple, ind)), ind.fitness.values[0]) for ind in search.population])

    def on_search_end(self, search, result):
        self.ended += 1


def run_search(spec, config, evaluate=synthetic_fitness):
    recorder = Recorder()
    search = GeneticSearch(spec, evaluate, config, [recorder])
    result = search.run()
    return search, result, recorder


def without_timing(records):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


# -------------------------------------------------------------------- algorithm 1


def test_generation_zero_is_the_initial_individual_and_its_mutants():
    spec = GenomeSpec(num_layers=12, num_points=3)
    _, _, recorder = run_search(spec, SMALL)
    first = [r for r in recorder.records if r["generation"] == 0]
    assert len(first) == SMALL.population
    assert first[0]["origin"] == "initial"
    assert first[0]["genome"] == [[0.0, 1.5], [6.0, 1.5], [11.0, 1.5]]
    assert {r["origin"] for r in first[1:]} == {"mutant"}


def test_a_ramp_start_is_a_straight_line_and_generation_zero_grows_around_it():
    spec = GenomeSpec(num_layers=30, num_points=4, y_min=0.25, y_max=2.5, y_step=0.05)
    ramp = ramp_genome(spec, 0.6, 1.4)
    assert spec.is_valid(ramp) and [x for x, _ in ramp] == [x for x, _ in initial_genome(spec)]
    line = [0.6 + 0.8 * layer / 29 for layer in range(30)]
    assert max(abs(s - t) for s, t in zip(spec.scales(ramp), line)) < spec.y_step  # the line, up to the grid
    assert ramp_genome(spec, 0.8, 0.8) == initial_genome(spec.starting_at(0.8))
    search = GeneticSearch(spec, synthetic_fitness, SearchConfig(population=6, parents=2, mutants=3, crossovers=1,
                                                                 generations=0, seed=1), [recorder := Recorder()],
                           start=ramp)
    search.run()
    assert recorder.records[0]["origin"] == "initial" and recorder.records[0]["genome"] == [list(p) for p in ramp]
    assert {r["origin"] for r in recorder.records[1:]} == {"mutant"}


def test_a_random_generation_zero_is_the_start_and_valid_random_genomes_and_a_resume_knows_it():
    spec = GenomeSpec(num_layers=12, num_points=3)
    config = SearchConfig(**{**SMALL.to_dict(), "initial": "random"})
    search, _, recorder = run_search(spec, config)
    first = [r for r in recorder.records if r["generation"] == 0]
    assert first[0]["origin"] == "initial" and {r["origin"] for r in first[1:]} == {"random"}
    assert all(spec.is_valid(r["genome"]) for r in first)
    # Far from the start: a mutant moves each point's y by at most My (0.2); random draws go anywhere.
    spread = max(abs(y - 1.5) for r in first[1:] for _, y in r["genome"])
    assert spread > SMALL.my
    assert "initial" in config.to_dict() and "initial" not in SMALL.to_dict()  # older states still compare equal
    paper = GeneticSearch(spec, synthetic_fitness, SMALL)
    with pytest.raises(ValueError, match="initial: saved 'random', now"):
        paper.load_state_dict(search.state_dict())
    with pytest.raises(ValueError, match="initial must be one of mutants, random"):
        SearchConfig(initial="sobol")


def test_a_start_off_the_grid_is_refused():
    spec = GenomeSpec(num_layers=12, num_points=3)
    with pytest.raises(ValueError, match="start genome is not valid.*off the grid"):
        GeneticSearch(spec, synthetic_fitness, SMALL, start=[(0, 1.5), (6, 1.55), (11, 1.5)])
    with pytest.raises(ValueError, match="scaling both"):
        ramp_genome(GenomeSpec(num_layers=12, num_points=3, brute_force=True, x_step=1), 1.0, 1.2)


def test_each_generation_is_the_top_parents_plus_crossover_children_plus_mutants():
    spec = GenomeSpec(num_layers=12, num_points=3)
    _, _, recorder = run_search(spec, SMALL)
    assert len(recorder.populations) == SMALL.generations + 1
    for previous, current in zip(recorder.populations, recorder.populations[1:]):
        assert len(current) == SMALL.population
        top = sorted(previous, key=lambda item: item[1], reverse=True)[: SMALL.parents]
        assert current[: SMALL.parents] == top
    for g in range(1, SMALL.generations + 1):
        origins = [r["origin"] for r in recorder.records if r["generation"] == g]
        assert origins.count("mutant") == SMALL.mutants
        # Each crossover evaluates one or two children (or one fallback mutant).
        crossover = [o for o in origins if o.startswith("crossover")]
        assert SMALL.crossovers <= len(crossover) <= 2 * SMALL.crossovers


def test_best_fitness_never_drops_and_the_search_improves_on_the_start():
    spec = GenomeSpec(num_layers=12, num_points=3)
    search, result, recorder = run_search(spec, SearchConfig(population=10, parents=4, mutants=4,
                                                             crossovers=2, generations=12, seed=0))
    best = [s["best_fitness"] for s in recorder.stats]
    assert all(b >= a for a, b in zip(best, best[1:]))
    start = recorder.records[0]["fitness"]
    assert result["best"]["fitness"] > start
    assert result["best"]["fitness"] == max(r["fitness"] for r in recorder.records)
    assert search.spec.scales(result["best"]["genome"]) == result["best"]["scales"]


def test_brute_force_search_tracks_smoothness_per_generation():
    spec = GenomeSpec(num_layers=10, brute_force=True)
    _, _, recorder = run_search(spec, SMALL)
    assert {r["origin"] for r in recorder.records if r["generation"] == 0} == {"random"}
    for stats in recorder.stats:
        assert stats["best_smoothness"] > 0 and stats["mean_smoothness"] > 0
        s = np.array(stats["best_scales"])
        assert stats["best_smoothness"] == pytest.approx(np.mean(np.abs(s[2:] - 2 * s[1:-1] + s[:-2])))


def test_planned_individuals_bounds_the_run():
    spec = GenomeSpec(num_layers=12, num_points=3)
    _, result, _ = run_search(spec, SMALL)
    assert SMALL.planned_individuals() == 10 + 5 * (2 * 2 + 4)
    assert SMALL.population + SMALL.generations * (SMALL.crossovers + SMALL.mutants) <= result["processed"]
    assert result["processed"] <= SMALL.planned_individuals()


# ---------------------------------------------------------------------- the cache


def test_a_duplicate_genome_is_never_evaluated_twice():
    # A tiny gene space (2 points, 3 y values) makes duplicates common.
    spec = GenomeSpec(num_layers=6, num_points=2, y_min=1.0, y_max=1.2)
    calls = {}

    def counting(scales):
        key = cache_key(scales)
        calls[key] = calls.get(key, 0) + 1
        return synthetic_fitness(scales)

    search, result, recorder = run_search(spec, SMALL, counting)
    assert max(calls.values()) == 1
    assert result["evaluations"] == len(calls) == len(search.cache)
    cached = [r for r in recorder.records if r["cached"]]
    assert cached, "the test needs duplicates to mean anything"
    assert len(recorder.records) == result["processed"] == len(calls) + len(cached)
    for record in cached:  # a cache hit reports the stored result
        fitness, info = search.cache[cache_key(record["scales"])]
        assert record["fitness"] == fitness and record["info"] == info


def test_cache_key_rounds_the_scales():
    assert cache_key([1.0000001, 1.5]) == cache_key([1.0, 1.5])
    assert cache_key([1.00001, 1.5]) != cache_key([1.0, 1.5])


# ------------------------------------------------------------------- determinism


def test_same_seed_same_search_whatever_the_global_random_state():
    spec = GenomeSpec(num_layers=12, num_points=4)
    random.seed(1)
    np.random.seed(1)
    _, first, rec1 = run_search(spec, SMALL)
    random.seed(99)
    np.random.seed(99)
    random.random()
    _, second, rec2 = run_search(spec, SMALL)
    assert without_timing(rec1.records) == without_timing(rec2.records)
    assert first["best"] == second["best"]


def test_another_seed_gives_another_search():
    spec = GenomeSpec(num_layers=12, num_points=4)
    _, _, rec1 = run_search(spec, SMALL)
    _, _, rec2 = run_search(spec, SearchConfig(**{**SMALL.to_dict(), "seed": 2}))
    assert [r["genome"] for r in rec1.records] != [r["genome"] for r in rec2.records]


# ------------------------------------------------------------- state and resume


class Crash(Exception):
    pass


class SaveState(Callback):
    """What a checkpoint callback does, in memory: the JSON state after every individual."""

    def __init__(self):
        self.saved = None

    def on_individual(self, search, record):
        self.saved = json.dumps(search.state_dict())

    def on_generation_end(self, search, stats):
        self.saved = json.dumps(search.state_dict())


@pytest.mark.parametrize("crash_at", [1, 7, 10, 11, 23, 40])
def test_resume_after_a_crash_evaluates_nothing_twice_and_ends_like_an_uninterrupted_run(crash_at):
    spec = GenomeSpec(num_layers=12, num_points=4)
    _, reference, reference_recorder = run_search(spec, SMALL)

    evaluated = []

    def crashing(scales):
        if len(evaluated) + 1 == crash_at:
            raise Crash
        evaluated.append(cache_key(scales))
        return synthetic_fitness(scales)

    saver, before = SaveState(), Recorder()
    with pytest.raises(Crash):
        GeneticSearch(spec, crashing, SMALL, [before, saver]).run()
    finished_before = list(evaluated)

    crash_at = -1  # the resumed run does not crash
    after = Recorder()
    resumed = GeneticSearch(spec, crashing, SMALL, [after])
    resumed.load_state_dict(json.loads(saver.saved) if saver.saved else GeneticSearch(spec, crashing, SMALL).state_dict())
    result = resumed.run()

    finished_after = evaluated[len(finished_before):]
    assert not set(finished_before) & set(finished_after)  # nothing finished is evaluated again
    assert len(finished_before) + len(finished_after) == reference["evaluations"]
    assert result["best"] == reference["best"]
    # Callbacks see each individual once over the two runs, as in the uninterrupted run.
    assert without_timing(before.records + after.records) == without_timing(reference_recorder.records)
    assert after.stats[-1] == reference_recorder.stats[-1]


def test_state_dict_is_json_and_round_trips():
    spec = GenomeSpec(num_layers=12, num_points=3)
    search, _, _ = run_search(spec, SMALL)
    state = json.loads(json.dumps(search.state_dict()))
    restored = GeneticSearch(spec, synthetic_fitness, SMALL)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.completed_generation == SMALL.generations
    assert restored.run()["evaluations"] == 0  # finished: nothing left to do


def test_a_finished_run_can_be_extended_with_more_generations():
    spec = GenomeSpec(num_layers=12, num_points=3)
    longer = SearchConfig(**{**SMALL.to_dict(), "generations": SMALL.generations + 2})
    _, reference, _ = run_search(spec, longer)
    short, _, _ = run_search(spec, SMALL)
    extended = GeneticSearch(spec, synthetic_fitness, longer)
    extended.load_state_dict(short.state_dict())
    assert extended.run()["best"] == reference["best"]


def test_loading_a_state_from_other_settings_names_the_difference():
    spec = GenomeSpec(num_layers=12, num_points=3)
    search, _, _ = run_search(spec, SMALL)
    other = GeneticSearch(spec, synthetic_fitness, SearchConfig(**{**SMALL.to_dict(), "seed": 5}))
    with pytest.raises(ValueError, match="seed: saved 1, now 5"):
        other.load_state_dict(search.state_dict())
    other_spec = GeneticSearch(GenomeSpec(num_layers=12, num_points=3, y_max=1.8), synthetic_fitness, SMALL)
    with pytest.raises(ValueError, match="y_max: saved 2.0, now 1.8"):
        other_spec.load_state_dict(search.state_dict())


def test_a_state_saved_under_the_former_setting_names_still_loads():
    from lpes_harness.search.config import FORMER_NAMES

    spec = GenomeSpec(num_layers=12, num_points=3)
    search, reference, _ = run_search(spec, SMALL)
    state = json.loads(json.dumps(search.state_dict()))
    today = {new: old for old, new in FORMER_NAMES.items()}
    state["config"] = {today.get(name, name): value for name, value in state["config"].items()}
    assert "population_size" in state["config"] and "population" not in state["config"]
    resumed = GeneticSearch(spec, synthetic_fitness, SMALL)
    resumed.load_state_dict(state)
    assert resumed.run()["best"] == reference["best"]
    other = GeneticSearch(spec, synthetic_fitness, SearchConfig(**{**SMALL.to_dict(), "mx": 3.0}))
    with pytest.raises(ValueError, match="mx: saved 2.0, now 3.0"):
        other.load_state_dict(state)


# -------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(population=32, parents=12, mutants=16, crossovers=5), r"must equal .*12 \+ 5 \+ 16 = 33"),
        (dict(population=5, parents=1, mutants=3, crossovers=1), "at least 2 parents"),
        (dict(generations=-1), "generations must be >= 0"),
        (dict(seed=1.5), "seed must be an integer"),
        (dict(my=-0.1), "mutation steps"),
    ],
)
def test_bad_search_configs_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SearchConfig(**kwargs)


def test_paper_defaults():
    config = SearchConfig()
    assert (config.population, config.parents, config.mutants, config.crossovers) == (32, 12, 16, 4)
    assert (config.generations, config.mx, config.my) == (20, 2.0, 0.2)


@pytest.mark.parametrize("returned", [0.5, (None, {}), ("abc", {})])
def test_evaluate_must_return_fitness_and_info(returned):
    spec = GenomeSpec(num_layers=12, num_points=3)
    with pytest.raises(TypeError, match="evaluate must return"):
        GeneticSearch(spec, lambda ind: returned, SMALL).run()


def test_non_finite_fitness_is_rejected():
    spec = GenomeSpec(num_layers=12, num_points=3)
    with pytest.raises(ValueError, match="non-finite"):
        GeneticSearch(spec, lambda ind: (float("nan"), {}), SMALL).run()


# ------------------------------------------------------------------ stopping early


class StopAfter(Callback):
    """Sets ``should_stop`` once ``count`` individuals were reported, as a time limit would."""

    def __init__(self, count):
        self.count, self.seen = count, 0

    def on_individual(self, search, record):
        self.seen += 1
        if self.seen >= self.count:
            search.should_stop = True


@pytest.mark.parametrize("initial", ["mutants", "random"])
def test_a_stop_ends_generation_zero_with_the_individuals_processed_and_runs_no_further_generation(initial):
    spec = GenomeSpec(num_layers=12, num_points=3)
    config = SearchConfig(**{**SMALL.to_dict(), "initial": initial})
    recorder = Recorder()
    search = GeneticSearch(spec, synthetic_fitness, config, [recorder, StopAfter(4)])
    result = search.run()
    assert len(recorder.records) == result["processed"] == 4 and result["stopped_early"]
    assert result["completed_generation"] == 0 and len(recorder.stats) == 1 and len(search.population) == 4
    assert recorder.ended == 1  # it ends like a finished search: the callbacks write their files
    # A stop in a later generation keeps its parents and the children made before it (a crossover
    # evaluates its two children, and keeps the fitter).
    recorder = Recorder()
    late = GeneticSearch(spec, synthetic_fitness, config, [recorder, StopAfter(config.population + 2)]).run()
    assert late["processed"] == config.population + 2 and late["completed_generation"] == 1
    assert len(recorder.populations[-1]) == config.parents + 1


def test_without_a_stop_the_result_says_so():
    _, result, _ = run_search(GenomeSpec(num_layers=12, num_points=3), SMALL)
    assert result["stopped_early"] is False and result["completed_generation"] == SMALL.generations


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """The time limit's clock, moved only by `timed` evaluations."""
    from lpes_harness.search import callbacks

    fake = FakeClock()
    monkeypatch.setattr(callbacks.time, "perf_counter", fake)
    return fake


TIMED_SPEC = GenomeSpec(num_layers=12, num_points=3)


def random_search(draws):
    """A random search of the start and `draws` draws, each raced against the best so far."""
    return SearchConfig(**{**SMALL.to_dict(), "population": draws + 1, "parents": 1, "mutants": draws,
                           "crossovers": 0, "generations": 0, "initial": "random"})


def timed(clock, seconds_each, evaluate=synthetic_fitness):
    def evaluate_timed(scales):
        clock.now += seconds_each
        return evaluate(scales)
    return evaluate_timed


def test_a_time_limit_stops_the_search_before_an_individual_would_run_past_it(clock):
    from lpes_harness.search import callbacks

    spec = TIMED_SPEC
    config = random_search(39)
    limit = callbacks.TimeLimitCallback(100.0)
    result = GeneticSearch(spec, timed(clock, 7.0), config, [limit]).run()
    # 7 s each: 14 individuals make 98 s, and a 15th would end at 105 s.
    assert result["processed"] == 14 and result["stopped_early"] and clock.now == 98.0
    assert limit.state_dict()["spent_seconds"] == 98.0 and limit.state_dict()["individuals"] == 14
    with pytest.raises(ValueError, match="no limit"):
        GeneticSearch(spec, synthetic_fitness, config, [callbacks.TimeLimitCallback(None)]).run()


def test_a_time_limit_keeps_room_for_the_longest_individual_not_the_mean(clock):
    """A raced draw costs one chunk, one that keeps up with the best its whole fitness: on an AVX-512 CPU
    without AVX512-BF16 the demo's draws took 8 s, a whole one 72 s, and one started on the mean's rule ended
    the search 55 s past its deadline."""
    from lpes_harness.search import callbacks

    costs = iter([40.0, 7.0, 7.0, 7.0, 7.0, 7.0, 40.0] + [7.0] * 40)  # the start runs whole, then raced draws

    def evaluate(scales):
        clock.now += next(costs)
        return synthetic_fitness(scales)

    limit = callbacks.TimeLimitCallback(100.0)
    result = GeneticSearch(TIMED_SPEC, evaluate, random_search(39), [limit]).run()
    # After the start and 3 draws (61 s) 39 s are left, less than the 40 s of the longest: stop. The mean's
    # rule (15.25 s) would have gone on to 5 draws (75 s) and started the 40-s one, ending at 115 s.
    assert result["processed"] == 4 and clock.now == 61.0 and result["stopped_early"]
    assert limit.state_dict()["longest_seconds"] == 40.0
    restored = callbacks.TimeLimitCallback(None)
    restored.load_state_dict(limit.state_dict())
    assert restored.longest == 40.0


def test_a_time_limit_sets_the_heldout_table_aside_at_the_search_s_own_seconds_a_forward(clock):
    from lpes_harness.search import callbacks

    spec = TIMED_SPEC
    config = random_search(59)

    def ten_forwards(scales):
        fitness, info = synthetic_fitness(scales)
        return fitness, {**info, "samples": {"begin": 4, "middle": 3, "end": 3}}

    def processed(after_forwards, seconds_per_forward):
        limit = callbacks.TimeLimitCallback(200.0, after_forwards=after_forwards, seconds_per_forward=seconds_per_forward)
        return GeneticSearch(spec, timed(clock, 7.0, ten_forwards), config, [limit]).run()["processed"]

    # A table of 50 forwards, timed at start-up at 2 s each (100 s set aside); from the 4th individual on
    # (40 forwards) the search's own 0.7 s a forward (35 s): it stops once less than 7 s is left,
    # 200 - 7 k - 35 < 7, after 23 individuals.
    assert processed(50, 2.0) == 23
    assert processed(0, 2.0) == 28  # nothing after it: the whole 200 s, 28 x 7 = 196
    assert callbacks.TimeLimitCallback.RATE_AFTER_FORWARDS == 40


def test_a_time_limit_leaves_uniform_tuning_as_many_forwards_as_the_search_used(clock):
    from lpes_harness.search import callbacks

    def ten_forwards(scales):
        fitness, info = synthetic_fitness(scales)
        return fitness, {**info, "samples": {"begin": 4, "middle": 3, "end": 3}}

    limit = callbacks.TimeLimitCallback(200.0, seconds_per_forward=0.7, matched=1.0)
    result = GeneticSearch(TIMED_SPEC, timed(clock, 7.0, ten_forwards), random_search(59), [limit]).run()
    # 7 s and 10 forwards an individual, each matched by 7 s of tuning: after k, 200 - 14 k is left, and the
    # next needs 14 s; 14 individuals (98 s) leave the tuning its 98 s, where alone 28 would run.
    assert result["processed"] == 14 and clock.now == 98.0
    restored = callbacks.TimeLimitCallback(None)
    restored.load_state_dict(limit.state_dict())
    assert restored.matched == 1.0 and restored.seconds_left() == limit.seconds_left()


def test_a_time_limit_counts_on_after_a_resume_and_a_spent_one_evaluates_nothing_new(clock):
    from lpes_harness.search import callbacks

    spec = TIMED_SPEC
    config = random_search(39)
    evaluated = []

    def crashing(scales):
        if len(evaluated) == 6:
            raise Crash
        evaluated.append(cache_key(scales))
        return synthetic_fitness(scales)

    saver = SaveState()
    with pytest.raises(Crash):
        GeneticSearch(spec, timed(clock, 7.0, crashing), config, [callbacks.TimeLimitCallback(100.0), saver]).run()
    state = json.loads(saver.saved)
    assert state["callbacks"]["TimeLimitCallback"]["spent_seconds"] == 42.0  # 6 individuals at 7 s
    # The resumed run replays the 6 from the cache, then evaluates until the limit: 14 in all, as uninterrupted.
    evaluated_before = len(evaluated)
    clock.now = 1000.0  # whatever the clock reads now: the limit counts the search's own seconds
    resumed = GeneticSearch(spec, timed(clock, 7.0), config,
                            [limit := callbacks.TimeLimitCallback(None)])
    resumed.load_state_dict(state)
    result = resumed.run()
    assert result["processed"] == 14 and resumed.evaluations == 8 and evaluated_before == 6
    # Resumed again once spent: the finished generation is kept and nothing is evaluated.
    again = GeneticSearch(spec, timed(clock, 7.0), config, [callbacks.TimeLimitCallback(None)])
    again.load_state_dict({**resumed.state_dict(), "callbacks": {"TimeLimitCallback": limit.state_dict()}})
    assert again.run()["processed"] == 14 and again.evaluations == 0
