"""Intervals and paired tests against hand-computed cases."""

import math

import numpy as np
import pytest

from lpes_harness.evaluation.paired_table import format_plain, format_table, paired_table
from lpes_harness.evaluation.stats import (
    compare_paired,
    compare_paired_resampled,
    geometric_mean_score,
    mcnemar_exact,
    mean_score,
    smallest_significant_gain,
    wilson_interval,
)


def test_wilson_interval_matches_hand_computation():
    # 8/10: p=.8, z=1.96: centre (0.8 + 1.9208/10) / 1.38415 = 0.71674; half 0.2245...
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(0, 20)[1] == pytest.approx(0.1611, abs=1e-4)
    assert wilson_interval(20, 20)[1] == 1.0


def test_exact_mcnemar_is_the_two_sided_binomial_tail():
    # 10 gained, 2 lost: 2 * P(X <= 2 | n=12, 1/2) = 2 * (1 + 12 + 66) / 4096
    assert mcnemar_exact(10, 2) == pytest.approx(2 * 79 / 4096)
    assert mcnemar_exact(2, 10) == mcnemar_exact(10, 2)
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(30, 0) == pytest.approx(2 / 2**30)


def test_the_smallest_significant_gain_is_six_gained_none_lost():
    # 2 / 2^5 = 0.0625 is not below 0.05, 2 / 2^6 = 0.03125 is: 6 gained of 25 paired is the least that can show
    assert smallest_significant_gain(25) == pytest.approx(6 / 25)
    assert smallest_significant_gain(300) == pytest.approx(6 / 300)
    assert smallest_significant_gain(5) is None
    assert smallest_significant_gain(100, alpha=1e-4) == pytest.approx(15 / 100)  # 2 / 2^15 = 6.1e-5; 2 / 2^14 = 1.2e-4


def test_compare_paired_counts_only_discordant_samples():
    method = [1, 1, 1, 0, 1, 0]
    base = [1, 0, 0, 0, 1, 1]
    result = compare_paired(method, base)
    assert (result["gained"], result["lost"]) == (2, 1)
    assert result["difference"] == pytest.approx(1 / 6)
    assert result["p"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="0/1"):
        compare_paired([0.5], [1])
    with pytest.raises(ValueError, match="equal"):
        compare_paired([1, 0], [1])


def test_paired_difference_interval_matches_hand_computation():
    from lpes_harness.evaluation.stats import paired_difference_interval

    # 30 gained, 20 lost of 1000: d = 0.01, var = (0.05 - 0.0001) / 1000, half = 1.96 * 0.0070640
    low, high = paired_difference_interval(30, 20, 1000)
    assert (low + high) / 2 == pytest.approx(0.01)
    assert high - low == pytest.approx(2 * 1.959964 * math.sqrt(0.0499 / 1000), rel=1e-5)
    assert compare_paired([1, 1, 1, 0, 1, 0], [1, 0, 0, 0, 1, 1])["difference_interval"] == pytest.approx(
        paired_difference_interval(2, 1, 6))
    assert paired_difference_interval(0, 0, 50) == (0.0, 0.0)
    # 8 gained of 10: Wald gives 0.8 +- 0.248, cut at 1 (no difference of accuracies is above it)
    assert paired_difference_interval(8, 0, 10) == (pytest.approx(0.8 - 1.959964 * math.sqrt(0.16 / 10), rel=1e-5), 1.0)
    assert paired_difference_interval(0, 8, 10)[0] == -1.0
    with pytest.raises(ValueError):
        paired_difference_interval(0, 0, 0)


def test_paired_table_marks_only_significant_differences():
    n = 40
    scored = {
        "task": "t", "split": "heldout", "num_samples": n,
        "scores": {
            "vanilla": {0: [1] * n, 50: [0] * n},
            "better": {0: [1] * n, 50: [1] * 20 + [0] * 20},   # +20 at 50 %: p = 2 / 2^20
            "same": {0: [1] * n, 50: [1] * 2 + [0] * 38},      # +2: not significant
        },
    }  # fmt: skip
    table = paired_table(scored)
    better, same = table["rows"]["better"], table["rows"]["same"]
    assert better["50"]["significant"] and better["50"]["p"] == pytest.approx(2 / 2**20)
    assert not same["50"]["significant"]
    assert better["average"]["accuracy"] == pytest.approx(60 / 80)
    assert better["worst"] == {"position": 50, "accuracy": 0.5}
    assert "**" in format_table(table).split("\n")[3]  # the 'better' row
    assert "**" not in format_table(table).split("\n")[4]
    assert "p=" in format_plain(table) and not math.isnan(better["average"]["p"])


def test_each_curve_is_paired_with_its_own_pi_over_all_positions():
    """'LPES above PI' is part of the bar: the table tests it on the same samples, pooled."""
    n = 10
    scored = {"scores": {
        "vanilla": {0: [0] * n, 50: [0] * n},
        "PI a": {0: [1] * 2 + [0] * 8, 50: [0] * n},
        "LPES a": {0: [1] * n, 50: [1] * 5 + [0] * 5},      # vs PI a: 13 gained, 0 lost
        "LPES b": {0: [1] * n, 50: [1] * n},                # no PI row: no test
        "PI": {0: [1] * n, 50: [1] * n},
        "LPES": {0: [0] * n, 50: [1] * n},                  # vs PI: 0 gained, 10 lost
    }}  # fmt: skip
    versus = paired_table(scored)["versus_pi"]
    assert set(versus) == {"LPES a", "LPES"}
    assert (versus["LPES a"]["gained"], versus["LPES a"]["lost"]) == (13, 0)
    assert versus["LPES a"]["difference"] == pytest.approx(13 / 20)
    assert versus["LPES a"]["p"] == pytest.approx(2 / 2**13)
    assert (versus["LPES"]["gained"], versus["LPES"]["lost"], versus["LPES"]["difference"]) == (0, 10, -0.5)
    assert "LPES a vs PI a (its mean, uniform), all positions: +65.0 pts, +13/−0" in format_table(paired_table(scored))


def test_each_curve_is_paired_with_each_baseline_model_over_all_positions():
    """'Above every baseline' is part of the reference bar: tested on the same samples, pooled."""
    n = 10
    scored = {
        "scores": {
            "vanilla": {0: [0] * n, 50: [0] * n},
            "LPES a": {0: [1] * n, 50: [1] * 5 + [0] * 5},
            "uniform 0.8": {0: [1] * n, 50: [1] * n},  # scales, not a baseline model: not tested against
            "MoICE": {0: [1] * 3 + [0] * 7, 50: [0] * 4 + [1] * 6},
        },
        "methods": {"vanilla": [1.0], "LPES a": [1.2], "uniform 0.8": [0.8], "MoICE": "moice_hf:gates=g.pt"},
    }
    versus = paired_table(scored)["versus_baselines"]
    assert list(versus) == ["LPES a"] and list(versus["LPES a"]) == ["MoICE"]
    # at 0 %: LPES right on 10, MoICE on 3 -> 7 gained; at 50 %: LPES right on 0-4, MoICE on 4-9 -> 4 gained, 5 lost
    test = versus["LPES a"]["MoICE"]
    assert (test["gained"], test["lost"]) == (11, 5) and test["difference"] == pytest.approx(6 / 20)
    assert test["p"] == pytest.approx(mcnemar_exact(11, 5))
    assert "LPES a vs MoICE, all positions: +30.0 pts, +11/−5" in format_plain(paired_table(scored))
    # A stack (an LPES curve under a baseline model) is a baseline row, though its name starts like a curve's.
    scored["scores"]["LPES a + PCD"] = {0: [1] * n, 50: [0] * n}
    scored["methods"]["LPES a + PCD"] = "pcd_hf:lpes_scales=a.json"
    versus = paired_table(scored)["versus_baselines"]
    assert list(versus) == ["LPES a"] and list(versus["LPES a"]) == ["MoICE", "LPES a + PCD"]
    del scored["methods"]  # a table without method specs (older files): no baseline rows known, no lines
    assert paired_table(scored)["versus_baselines"] == {}


# -- compare_paired_resampled: scores that are not a mean of 0/1 -------------------------------

def _binary_pair(gained, lost, same_right, same_wrong):
    method = [1] * gained + [0] * lost + [1] * same_right + [0] * same_wrong
    baseline = [0] * gained + [1] * lost + [1] * same_right + [0] * same_wrong
    return np.array(method, float)[:, None], np.array(baseline, float)[:, None]


def test_resampled_on_0_1_samples_agrees_with_mcnemar_and_wald():
    # On 0/1 samples, the sign-flip permutation is McNemar's null and the bootstrap interval Wald's
    method, baseline = _binary_pair(gained=30, lost=14, same_right=100, same_wrong=56)
    test = compare_paired_resampled([(method, baseline, mean_score)], resamples=20_000)
    exact = compare_paired(method[:, 0], baseline[:, 0])
    assert test["difference"] == pytest.approx(exact["difference"]) == pytest.approx(16 / 200)
    assert test["p"] == pytest.approx(exact["p"], abs=0.006)  # Monte Carlo error at 20,000
    assert test["difference_interval"] == pytest.approx(exact["difference_interval"], abs=0.006)
    assert (test["better"], test["worse"], test["n"]) == (30, 14, 200)


def test_resampled_identical_rows_differ_by_nothing():
    rows = np.random.default_rng(1).random((40, 3))
    test = compare_paired_resampled([(rows, rows.copy(), geometric_mean_score)])
    assert test["difference"] == 0 and test["difference_interval"] == (0.0, 0.0) and test["p"] == 1.0
    assert (test["better"], test["worse"]) == (0, 0)


def test_a_summary_is_scored_by_the_geometric_mean_of_its_mean_rouges():
    # per-sample geometric means would give 0 here (each sample has one ROUGE at 0); the task's does not
    method = np.array([[0.4, 0.0, 0.3], [0.2, 0.2, 0.0]])
    baseline = np.zeros((2, 3))
    test = compare_paired_resampled([(method, baseline, geometric_mean_score)], resamples=200)
    assert test["value"] == pytest.approx((0.3 * 0.1 * 0.15) ** (1 / 3))
    assert (test["better"], test["worse"]) == (0, 0)  # no sample alone scores above 0


def test_several_tasks_average_their_scores_and_resampling_is_seeded():
    rng = np.random.default_rng(2)
    one = (rng.random((30, 1)), rng.random((30, 1)), mean_score)
    two = (rng.random((10, 3)), rng.random((10, 3)), geometric_mean_score)
    test = compare_paired_resampled([one, two], resamples=500)
    expected = (one[0].mean() - one[1].mean() + geometric_mean_score(two[0].mean(0)) - geometric_mean_score(two[1].mean(0))) / 2
    assert test["difference"] == pytest.approx(expected) and test["n"] == 40
    assert compare_paired_resampled([one, two], resamples=500) == test
    assert compare_paired_resampled([one, two], resamples=500, seed=1) != test


def test_resampled_refuses_unpaired_rows():
    with pytest.raises(ValueError, match="equal, non-empty"):
        compare_paired_resampled([(np.zeros((3, 1)), np.zeros((4, 1)), mean_score)])
    with pytest.raises(ValueError, match="no tasks"):
        compare_paired_resampled([])
