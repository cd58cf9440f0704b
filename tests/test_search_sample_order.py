"""Racing's sample order: ``hardest`` scores first the samples earlier individuals got wrong. The
bound is exact in any order, so the parents, the best and every complete fitness stay those of
``roles``; only the forwards spent on individuals racing stops change."""

import math

import pytest

from lpes_harness.search import GeneticSearch, GenomeSpec, SearchConfig
from lpes_harness.search.loop import Callback
from lpes_harness.search.fitness import DEFAULT_WEIGHTS, FitnessConfig, raced_fitness, raced_groups, roles_order
from lpes_harness.search.sample_order import HardestFirst

from test_search_fitness import SIZES, ParentsRecorder, sample_correct

DROP = {role: DEFAULT_WEIGHTS[role] / SIZES[role] for role in SIZES}


def hardest_for_sizes() -> HardestFirst:
    return HardestFirst(SIZES, DROP, roles_order(SIZES, DEFAULT_WEIGHTS))


class OrderedFitness:
    """The synthetic model of test_search_fitness, raced in ``roles`` or ``hardest`` order."""

    def __init__(self, sample_order: str):
        self.hardest = hardest_for_sizes() if sample_order == "hardest" else None
        self.samples_scored = 0

    def __call__(self, scales, threshold=-math.inf):
        scales = list(scales)

        def score_chunk(role, indices):
            self.samples_scored += len(indices)
            scores = [sample_correct(scales, role, i) for i in indices]
            if self.hardest:
                self.hardest.record(role, indices, scores)
            return scores

        return raced_fitness(score_chunk, SIZES, DEFAULT_WEIGHTS, chunk_size=5, threshold=threshold,
                             sample_order=self.hardest.order() if self.hardest else None)


def run_search(sample_order: str, seed: int):
    fitness = OrderedFitness(sample_order)
    recorder = ParentsRecorder()
    spec = GenomeSpec(num_layers=12, y_min=1.0, y_max=2.0)
    config = SearchConfig(population=12, parents=4, mutants=6, crossovers=2, generations=6, seed=seed)
    result = GeneticSearch(spec, fitness, config, [recorder]).run()
    return result, recorder.parents, fitness.samples_scored


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_hardest_first_order_selects_the_same_parents_and_best(seed):
    roles_result, roles_parents, roles_work = run_search("roles", seed)
    hardest_result, hardest_parents, hardest_work = run_search("hardest", seed)
    assert hardest_parents == roles_parents
    assert hardest_result["best"]["genome"] == roles_result["best"]["genome"]
    assert hardest_result["best"]["fitness"] == roles_result["best"]["fitness"]
    # Not asserted: fewer forwards. The synthetic model's failures are hash noise, so no sample is
    # harder than another and the order cannot help here; benchmarks/sample_order.py measures it.
    assert hardest_work > 0 and roles_work > 0


def test_a_complete_fitness_and_the_raced_flag_do_not_depend_on_the_order():
    scales = [1.4] * 12
    score = lambda role, indices: [sample_correct(scales, role, i) for i in indices]  # noqa: E731
    exact, _ = raced_fitness(score, SIZES, DEFAULT_WEIGHTS, chunk_size=5)
    reversed_order = [(role, i) for role in SIZES for i in reversed(range(SIZES[role]))][::-1]
    for threshold in (-math.inf, exact - 1e-9, exact + 1e-9):
        for order in (None, reversed_order):
            value, info = raced_fitness(score, SIZES, DEFAULT_WEIGHTS, chunk_size=3, threshold=threshold,
                                        sample_order=order)
            assert info["raced"] == (exact < threshold)
            if not info["raced"]:
                assert value == exact and info["samples"] == SIZES
            else:
                assert exact <= value < threshold


def test_before_anything_is_scored_the_order_is_the_roles_order():
    expected = [(role, i) for role in roles_order(SIZES, DEFAULT_WEIGHTS) for i in range(SIZES[role])]
    assert hardest_for_sizes().order() == expected


def test_samples_that_earlier_individuals_got_wrong_come_first_and_weight_counts():
    order = hardest_for_sizes()
    for _ in range(3):  # three earlier individuals, each right everywhere but at middle 7 and begin 3
        for role in SIZES:
            indices = list(range(SIZES[role]))
            order.record(role, indices, [0.0 if (role, i) in {("middle", 7), ("begin", 3)} else 1.0 for i in indices])
    # The expected fall of the bound: the role's weight per sample (end .025, middle .015, begin .01)
    # x the sample's mean shortfall. Wrong every time outranks any role's weight; among the samples
    # right every time, the heavier role comes first, as in the roles order.
    ranked = order.order()
    assert ranked[:2] == [("middle", 7), ("begin", 3)]
    rest = [(role, i) for role in roles_order(SIZES, DEFAULT_WEIGHTS) for i in range(SIZES[role])]
    assert ranked[2:] == [s for s in rest if s not in {("middle", 7), ("begin", 3)}]


def test_a_sample_racing_never_reached_counts_as_an_average_one():
    order = hardest_for_sizes()
    order.record("end", [0, 1], [0.0, 1.0])  # mean shortfall 0.5; end 2.. never scored
    fall = {s: DROP[s[0]] * order.expected_shortfall(*s) for s in [("end", 0), ("end", 1), ("end", 2)]}
    assert fall[("end", 0)] > fall[("end", 2)] > fall[("end", 1)]
    assert order.order()[:3] == [("end", 0), ("end", 2), ("end", 3)]


def test_a_mixed_chunk_scores_each_groups_samples_together_and_checks_the_bound_once():
    calls = []

    def all_wrong(group, indices):
        calls.append((group, list(indices)))
        return [0.0] * len(indices)

    order = [("middle", 0), ("end", 0), ("middle", 1), ("end", 1), ("begin", 0)]
    value, totals, done, raced = raced_groups(all_wrong, {"begin": 1, "middle": 2, "end": 2},
                                              lambda means: sum(means.values()) / 3, ["end", "middle", "begin"],
                                              chunk_size=4, threshold=0.5, sample_order=order)
    assert calls == [("middle", [0, 1]), ("end", [0, 1])]
    assert raced and done == {"begin": 0, "middle": 2, "end": 2} and value == pytest.approx(1 / 3)


def test_an_unknown_sample_order_is_named():
    with pytest.raises(ValueError, match="sample order 'random' is not one of roles, hardest"):
        FitnessConfig(task="multi_needle", sample_order="random")


def test_the_cpu_profiles_race_hardest_first_and_a_run_recorded_before_the_flag_resumes_in_roles_order(tmp_path):
    import json

    from lpes_harness.commands.search_cli import parse_args
    from lpes_harness.search.run_record import settings_record

    argv = ["--profile", "cpu-bf16", "--dtype", "float32", "--device", "cpu", "--output", str(tmp_path / "R")]
    assert parse_args(argv).sample_order == "hardest"
    assert parse_args(["--profile", "gpu", *argv[2:]]).sample_order == "roles"
    assert parse_args(["--profile", "robust-smollm2-gpu", *argv[2:]]).sample_order == "roles"
    settings = settings_record(parse_args(argv))
    del settings["sample_order"]  # config.json of a run made before --sample-order
    (tmp_path / "R").mkdir()
    (tmp_path / "R" / "config.json").write_text(json.dumps({"command": "lpes-search ...", "settings": settings}))
    assert parse_args(["--resume", "--output", str(tmp_path / "R")]).sample_order == "roles"


def test_the_statistics_survive_a_json_round_trip_with_condition_groups():
    import json

    sizes = {("60 sentences", "end"): 2, ("60 sentences", "middle"): 3}
    drop = {g: 0.5 / n for g, n in sizes.items()}
    order = HardestFirst(sizes, drop, list(sizes))
    order.record(("60 sentences", "middle"), [2], [0.0])
    order.record(("60 sentences", "end"), [0, 1], [1.0, 0.0])
    copy = HardestFirst(sizes, drop, list(sizes))
    copy.load_state_dict(json.loads(json.dumps(order.state_dict())))
    assert copy.order() == order.order() and copy.seen == order.seen and copy.shortfall == order.shortfall


class Crash(Exception):
    pass


class ResumableFitness(OrderedFitness):
    """OrderedFitness in the hardest order (its ``hardest`` is what a checkpoint saves); ``crash_at``: fail on that call."""

    def __init__(self, crash_at=None):
        super().__init__("hardest")
        self.calls, self.crash_at = 0, crash_at

    def __call__(self, scales, threshold=-math.inf):
        self.calls += 1
        if self.calls == self.crash_at:
            raise Crash
        return super().__call__(scales, threshold)


class Records(Callback):
    def __init__(self):
        self.records = []

    def on_individual(self, search, record):
        self.records.append((record["index"], record["fitness"], record["info"]))


def test_a_search_resumed_mid_generation_races_as_the_uninterrupted_one(tmp_path):
    """The statistics travel with the checkpoint (SampleOrderCallback): after a crash mid-generation
    the resumed search scores the same samples, so even the raced bounds are the uninterrupted run's."""
    from lpes_harness.search.callbacks import CheckpointCallback, SampleOrderCallback, load_checkpoint

    spec = GenomeSpec(num_layers=12, y_min=1.0, y_max=2.0)
    config = SearchConfig(population=12, parents=4, mutants=6, crossovers=2, generations=4, seed=3)

    def search(fitness, path, records):
        callbacks = [records, SampleOrderCallback(fitness), CheckpointCallback(path)]
        return GeneticSearch(spec, fitness, config, callbacks)

    whole = Records()
    search(ResumableFitness(), tmp_path / "whole.json", whole).run()
    assert any(info["raced"] for _, _, info in whole.records)  # else the order could not matter

    first = Records()
    with pytest.raises(Crash):
        search(ResumableFitness(crash_at=23), tmp_path / "cut.json", first).run()  # generation 2, mid-way
    second = Records()
    resumed = search(ResumableFitness(), tmp_path / "cut.json", second)
    resumed.load_state_dict(load_checkpoint(tmp_path / "cut.json"))
    resumed.run()
    assert first.records + second.records == whole.records
