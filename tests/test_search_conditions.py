"""A search over several conditions: every individual on the same samples of each, combined by
mean or worst, racing exact; honest selection on a disjoint validation split; the uniform tuner."""

import math

import pytest
from tiny_models import save_tiny_checkpoint

from lpes_harness.evaluation.conditions import Condition, search_conditions
from lpes_harness.core.scaling import SCALINGS
from lpes_harness.search.condition_fitness import ConditionsFitness, combine_conditions, condition_configs
from lpes_harness.search.fitness import FitnessConfig, raced_groups
from lpes_harness.search.selection import (NO_CURVE_WON, Candidate, ValidationCondition, is_close,
                                           paired_gap, select, top_individuals)
from lpes_harness.search.uniform_tuning import coarse_to_fine, interleave, tune_uniform

# ----------------------------------------------------------------------------- conditions


def test_a_condition_states_what_differs_from_the_run():
    (short, many) = search_conditions(['short={"num_sentences": 20}', 'many needles={"num_needles": 4, "chat_template": "off"}'],
                                      "multi_needle", {"num_sentences": 30}, "auto")
    assert short == Condition("short", "multi_needle", {"num_sentences": 20}, "auto")
    assert many.metadata == {"num_sentences": 30, "num_needles": 4} and many.chat_template == "off"


@pytest.mark.parametrize("texts, message", [
    (['a={"num_sentences": 20}', 'A={"num_sentences": 30}'], "share a name"),
    (['a={"num_samples": 3}'], "set by the search itself"),
    (['a={"num_needels": 3}'], "did you mean 'num_needles'"),
    (['a={"task": "nope"}'], "unknown position task"),
])
def test_bad_conditions_are_one_line_naming_the_condition(texts, message):
    with pytest.raises(ValueError, match=message):
        search_conditions(texts, "multi_needle", {}, "auto")


def test_mean_and_worst():
    assert combine_conditions({"a": 0.5, "b": 0.9}, "mean") == pytest.approx(0.7)
    assert combine_conditions({"a": 0.5, "b": 0.9}, "worst") == 0.5
    with pytest.raises(ValueError, match="mean, worst"):
        combine_conditions({"a": 1.0}, "best")


def synthetic_score(scales, group, index):
    name, role = group
    target = {"short": 0.8, "long": 1.2}[name]
    return 1.0 if (index * 7 + {"begin": 1, "middle": 2, "end": 3}[role]) % 10 < 10 * math.exp(-4 * (scales[0] - target) ** 2) else 0.0


@pytest.mark.parametrize("objective", ["mean", "worst"])
def test_racing_over_conditions_never_stops_an_individual_that_could_reach_the_threshold(objective):
    sizes = {(c, r): 10 for c in ("short", "long") for r in ("begin", "middle", "end")}
    weights = {"begin": 0.2, "middle": 0.3, "end": 0.5}

    def value(means):
        per = {c: sum(weights[r] * means[(c, r)] for r in weights) for c in ("short", "long")}
        return combine_conditions(per, objective)

    order = sorted(sizes, key=lambda g: -weights[g[1]])
    for scale in (0.6, 0.8, 1.0, 1.2, 1.4):
        chunk = lambda group, idx, s=scale: [synthetic_score([s], group, i) for i in idx]  # noqa: E731
        exact, *_ = raced_groups(chunk, sizes, value, order, chunk_size=3)
        for threshold in (0.2, 0.5, 0.8):
            raced_value, _, done, raced = raced_groups(chunk, sizes, value, order, chunk_size=3, threshold=threshold)
            if raced:
                assert exact < threshold and raced_value >= exact  # a bound above the truth, below the bar
            else:
                assert raced_value == exact and sum(done.values()) == 60


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from lpes_harness.lmeval.lpes_lm import LPESLM

    return LPESLM(pretrained=save_tiny_checkpoint(tmp_path_factory.mktemp("tiny")), device="cpu")


def tiny_conditions(objective="mean"):
    base = FitnessConfig(task="needle", num_samples=2, chunk_size=2, metadata={"num_sentences": 6}, racing=False)
    conditions = search_conditions(['six={"num_sentences": 6}', 'ten={"num_sentences": 10}'], "needle", {}, "off")
    return conditions, condition_configs(conditions, base)


def test_every_individual_is_scored_on_the_same_samples_of_every_condition(tiny_lm):
    conditions, configs = tiny_conditions()
    fitness = ConditionsFitness(tiny_lm, configs, "mean")
    single = {name: __import__("lpes_harness.search.fitness", fromlist=["LMEvalFitness"]).LMEvalFitness(tiny_lm, config)
              for name, config in configs.items()}
    for scales in ([1.0] * 4, [0.7, 0.9, 1.3, 1.6]):
        value, info = fitness(scales)
        alone = {name: f(scales)[0] for name, f in single.items()}
        assert info["scores"] == pytest.approx(alone)  # each condition as its own one-condition fitness
        assert value == pytest.approx(sum(alone.values()) / 2)
        assert set(info["conditions"]) == {"six", "ten"} and not info["raced"]
        assert info["samples"] == info["samples_total"] == 2 * 3 * 2  # 2 conditions x 3 positions x 2 samples
    worst = ConditionsFitness(tiny_lm, configs, "worst")([0.7, 0.9, 1.3, 1.6])
    assert worst[0] == pytest.approx(min(worst[1]["scores"].values()))


def test_the_validation_split_is_its_own_samples(tiny_lm):
    conditions, configs = tiny_conditions()
    search = ConditionsFitness(tiny_lm, configs, split="search")
    validation = ConditionsFitness(tiny_lm, configs, split="validation")
    for name in configs:
        for percent, docs in search.parts[name].scorer.docs.items():
            theirs = validation.parts[name].scorer.docs[percent]
            assert {d["sample_index"] for d in docs}.isdisjoint(d["sample_index"] for d in theirs)
            assert {d["prompt"] for d in docs}.isdisjoint(d["prompt"] for d in theirs)


# ----------------------------------------------------------------------------- selection

CONDITION = ValidationCondition("c", "needle", {}, False, {"begin": 0.2, "middle": 0.3, "end": 0.5},
                                {"begin": (0,), "middle": (50,), "end": (100,)})


def scripted(scores_by_label):
    """A validation scorer from fixed per-sample scores: label -> percent -> the sample scores."""
    calls = []

    def score(condition, methods, n):
        calls.append((sorted(methods), n))
        return {label: {p: scores_by_label[label][p][:n] for p in (0, 50, 100)} for label in methods}

    return score, calls


def test_a_clear_winner_is_chosen_on_the_first_samples():
    score, calls = scripted({"uniform 0.8": {p: [0] * 16 for p in (0, 50, 100)},
                             "LPES #3": {p: [1] * 16 for p in (0, 50, 100)}})
    result = select(score, [CONDITION], [Candidate("uniform 0.8", [0.8] * 4, "uniform"), Candidate("LPES #3", [1] * 4, "curve")],
                    initial=4, maximum=16)
    assert result["chosen"] == "LPES #3" and len(result["rounds"]) == 1 and calls == [(["LPES #3", "uniform 0.8"], 4)]


def test_a_tie_draws_more_samples_and_data_break_it():
    # Equal on the first 4 samples of every position; the curve is right on 6 more of the next 12.
    curve = {p: [1, 0, 1, 0] + [1] * 12 for p in (0, 50, 100)}
    start = {p: [1, 0, 1, 0] + [1, 0] * 6 for p in (0, 50, 100)}
    score, calls = scripted({"uniform 1": start, "LPES #5": curve})
    result = select(score, [CONDITION], [Candidate("uniform 1", [1] * 4, "uniform", 0.9), Candidate("LPES #5", [2] * 4, "curve", 0.95)],
                    initial=4, maximum=16)
    assert [n for _, n in calls] == [4, 8]  # 8 samples a position resolve it: +2 of 8 at each, 2.5 errors
    assert result["chosen"] == "LPES #5" and result["rounds"][0]["unresolved"] == ["LPES #5"]
    assert result["rounds"][1]["unresolved"] == []


def test_a_tie_left_at_the_maximum_goes_to_the_uniform_start_and_says_so():
    same = {p: [1, 0] * 8 for p in (0, 50, 100)}
    score, _ = scripted({"uniform 2": same, "LPES #1": same})
    result = select(score, [CONDITION], [Candidate("LPES #1", [3] * 4, "curve", 1.0), Candidate("uniform 2", [2] * 4, "uniform", 0.9)],
                    initial=4, maximum=16)
    assert result["chosen"] == "uniform 2" and result["message"] == NO_CURVE_WON
    assert [r["samples_per_position"] for r in result["rounds"]] == [4, 8, 16]


def test_a_lead_within_two_errors_at_the_maximum_goes_to_the_uniform_and_says_by_how_much():
    # Gemma seed 2's case: at the maximum the curve leads by a fraction of a sample, within noise.
    curve = {p: [1, 0] * 8 for p in (0, 50, 100)}
    start = {p: [1, 0] * 7 + [0, 1] for p in (0, 50, 100)}
    curve[100] = [1, 1] + [1, 0] * 7  # one sample more than the uniform factor, at the end
    score, _ = scripted({"uniform 4.5": start, "LPES #15": curve})
    result = select(score, [CONDITION], [Candidate("LPES #15", [5] * 4, "curve", 0.9),
                                         Candidate("uniform 4.5", [4.5] * 4, "uniform", 0.88)], initial=4, maximum=16)
    last = result["rounds"][-1]
    assert last["leader"] == "LPES #15" and last["unresolved"] == ["uniform 4.5"] and last["samples_per_position"] == 16
    assert result["chosen"] == "uniform 4.5" and result["chosen_kind"] == "uniform"
    assert result["message"].startswith(NO_CURVE_WON) and "LPES #15 led uniform 4.5 by" in result["message"]


def test_a_lead_resolved_at_the_maximum_keeps_the_curve():
    curve = {p: [1] * 16 for p in (0, 50, 100)}
    start = {p: [1, 0] * 8 for p in (0, 50, 100)}
    score, _ = scripted({"uniform 1": start, "LPES #2": curve})
    result = select(score, [CONDITION], [Candidate("uniform 1", [1] * 4, "uniform"), Candidate("LPES #2", [2] * 4, "curve")],
                    initial=16, maximum=16)
    assert result["chosen"] == "LPES #2" and result["message"] == "a per-layer curve won on the validation samples"


def test_paired_gap_weighs_roles_as_the_fitness_does():
    leader = Candidate("a", [1], "curve", scores={"c": {0: [1, 1], 50: [1, 1], 100: [1, 1]}})
    other = Candidate("b", [1], "curve", scores={"c": {0: [0, 0], 50: [1, 1], 100: [1, 1]}})
    lead, error = paired_gap([CONDITION], leader, other, 2)
    assert lead == pytest.approx(0.2) and error == 0.0 and not is_close(lead, error)


def test_top_individuals_are_distinct_and_complete():
    records = [{"index": 0, "fitness": 0.9, "scales": [1, 1], "info": {}},
               {"index": 1, "fitness": 0.95, "scales": [1, 2], "info": {"raced": True}},
               {"index": 2, "fitness": 0.9, "scales": [1.0000001, 1], "info": {}},
               {"index": 3, "fitness": 0.8, "scales": [2, 2], "info": {}}]
    assert [r["index"] for r in top_individuals(records, 2)] == [0, 3]


def test_uniform_scales_are_told_apart_from_curves():
    assert SCALINGS["position"].uniform_factor([0.8, 0.8, 1.0], held_layers=[2]) == 0.8
    assert SCALINGS["position"].uniform_factor([0.8, 0.9, 1.0]) is None
    assert SCALINGS["both"].uniform_factor([0.8, 0.8, 2, 2]) == (0.8, 2.0)
    assert SCALINGS["both"].uniform_factor([0.8, 0.8, 2, 3]) is None


# ----------------------------------------------------------------------------- uniform tuner


def test_coarse_to_fine_covers_the_grid_evenly_at_any_cut():
    values = [0.5 + 0.25 * k for k in range(9)]
    order = coarse_to_fine(values)
    assert sorted(order) == values and order[:3] == [0.5, 2.5, 1.5]
    assert interleave([1, 2, 3], ["a"]) == [1, "a", 2, 3]


def test_the_uniform_tuner_spends_at_least_the_budget_and_resumes_from_its_journal(tmp_path):
    used = {"n": 0}

    def evaluate(scales, threshold):
        used["n"] += 10
        return 1 - abs(scales[0] - 1.25), {"raced": False}

    points = [{"label": f"position {v:g}", "kind": "position", "value": v, "scales": [v] * 3}
              for v in coarse_to_fine([0.5, 0.75, 1.0, 1.25, 1.5])]
    known = [{"label": "position 1", "kind": "position", "value": 1.0, "scales": [1.0] * 3, "fitness": 0.75,
              "info": {}, "forwards": 10}]
    result = tune_uniform(evaluate, points, budget=30, forwards=lambda: used["n"], known=known,
                          journal=tmp_path / "uniform.jsonl")
    assert result["forwards"] >= 30 and used["n"] == 20  # the sweep's forwards count toward the budget
    assert result["best"]["value"] == 1.5 or result["best"]["fitness"] >= 0.75
    again = tune_uniform(evaluate, points, budget=50, forwards=lambda: used["n"], known=known,
                         journal=tmp_path / "uniform.jsonl")
    assert used["n"] == 40 and again["best"]["value"] == 1.25  # the journal's points were not scored again
