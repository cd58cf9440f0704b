"""Statistics that can tell a gain from noise: intervals for accuracies, paired tests.

Position-bias tables compare methods on the *same* samples, so the right test is paired:
a sample that both methods get right (or both wrong) says nothing about which is better;
only the discordant ones do. Exact McNemar is the binomial test on those: under "no
difference" each discordant sample is a fair coin.

- :func:`wilson_interval`: 95 % interval of an accuracy k / n (good at 0 and 1, unlike k/n ± 1.96·se).
- :func:`mcnemar_exact`: two-sided exact p of b gains against c losses.
- :func:`compare_paired`: both, for two 0/1 vectors over the same samples, and
  :func:`paired_difference_interval`, the interval of their difference.
- :func:`compare_paired_resampled`: the same question for a score that is not a mean of 0/1
  (L-Eval's partial credit, ZeroSCROLLS' geometric mean of ROUGEs, an average over tasks): a
  paired bootstrap interval and a paired permutation p.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

Z_95 = 1.959963984540054


def wilson_interval(successes: int, total: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % by default)."""
    if total <= 0:
        raise ValueError(f"an interval needs at least one sample, got total={total}")
    if not 0 <= successes <= total:
        raise ValueError(f"successes must be in [0, {total}], got {successes}")
    p = successes / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    # Exactly 0 / 1 at the ends (rounding would leave a 1e-17 there).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == total else min(1.0, centre + half)
    return low, high


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: P(a fair coin is at least this lopsided over b + c tosses)."""
    if gained < 0 or lost < 0:
        raise ValueError(f"counts must be >= 0, got {gained}, {lost}")
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1))
    # Exact integers: 2·tail / 2^n, capped at 1 (the two tails overlap when b == c).
    return min(1.0, 2 * tail / 2**n)


def smallest_significant_gain(paired: int, alpha: float = 0.05) -> float | None:
    """The smallest difference (a share of ``paired`` samples) that :func:`mcnemar_exact` can find at p < ``alpha``:
    every changed sample gained, none lost. None when no difference on ``paired`` samples can (fewer than 6 at
    0.05). A table too small to show the gain a method could have says so before anyone reads a ranking from it."""
    for gained in range(1, paired + 1):
        if mcnemar_exact(gained, 0) < alpha:
            return gained / paired
    return None


def _as_binary(values: Sequence[float], name: str) -> list[int]:
    out = []
    for value in values:
        if value not in (0, 1):
            raise ValueError(f"{name} must hold 0/1 correctness per sample, got {value!r}")
        out.append(int(value))
    return out


def compare_paired(method: Sequence[float], baseline: Sequence[float]) -> dict:
    """A method against a baseline on the same samples (0/1 each), with exact McNemar.

    Returns accuracies with Wilson intervals, the difference, the discordant counts
    (``gained``: the method right where the baseline was wrong; ``lost``: the reverse) and p.
    """
    a, b = _as_binary(method, "method"), _as_binary(baseline, "baseline")
    if len(a) != len(b) or not a:
        raise ValueError(f"paired samples need equal, non-zero lengths, got {len(a)} and {len(b)}")
    gained = sum(1 for x, y in zip(a, b) if x and not y)
    lost = sum(1 for x, y in zip(a, b) if y and not x)
    n = len(a)
    return {
        "n": n,
        "accuracy": sum(a) / n,
        "interval": wilson_interval(sum(a), n),
        "baseline_accuracy": sum(b) / n,
        "difference": (sum(a) - sum(b)) / n,
        "difference_interval": paired_difference_interval(gained, lost, n),
        "gained": gained,
        "lost": lost,
        "p": mcnemar_exact(gained, lost),
    }


def paired_difference_interval(gained: int, lost: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """95 % interval of a paired difference of accuracies, ``(gained - lost) / n`` (Wald).

    "Within 1 point of vanilla" is a claim about this interval, not about p: a large p on few
    samples says nothing. Only the discordant samples carry variance, ``((g + l)/n - d²)/n``.
    Wald is adequate at the hundreds-to-thousands of samples it is used with here; with no
    discordant sample at all it has zero width (a Wald artefact: read it with n). On few samples
    it can reach past ±1, which no difference of accuracies can: it is cut there.
    """
    if n < 1:
        raise ValueError("no samples")
    difference = (gained - lost) / n
    half = z * math.sqrt(max((gained + lost) / n - difference**2, 0.0) / n)
    return max(difference - half, -1.0), min(difference + half, 1.0)


# One task of a paired comparison: the method's and the baseline's per-sample metrics, one row per
# sample in the same order (n, k), and the task's score from its k column means (any leading shape).
Stratum = tuple["np.ndarray", "np.ndarray", Callable[["np.ndarray"], "np.ndarray"]]
RESAMPLES = 10_000


def compare_paired_resampled(strata: Sequence[Stratum], resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """A method against a baseline on the same samples, for a score made from per-sample metrics.

    The score is the mean over ``strata`` (tasks) of each task's score, computed from its column
    means: the mean itself for exact match or F1, ZeroSCROLLS' geometric mean of the three mean
    ROUGEs for a summary. Neither a Wald interval nor McNemar fits such a score, so:

    - interval: paired bootstrap, the samples of each task drawn with replacement, the same draw
      for both rows (the 2.5 and 97.5 percentiles of the resampled differences);
    - p: paired permutation, each sample's two rows swapped with probability 1/2 (under "no
      difference" the labels are exchangeable), two-sided, ``(count + 1) / (resamples + 1)``.

    ``better``/``worse`` count the samples whose own score (the task's score of that one row) the
    method raises or lowers. Seeded: the same inputs give the same interval and p.
    """
    import numpy as np

    if not strata:
        raise ValueError("no tasks to compare")
    rng = np.random.default_rng(seed)
    observed, baseline_value, draws, flips = 0.0, 0.0, np.zeros(resamples), np.zeros(resamples)
    n = better = worse = 0
    for method, baseline, score in strata:
        method, baseline = np.asarray(method, dtype=float), np.asarray(baseline, dtype=float)
        if method.shape != baseline.shape or method.ndim != 2 or not len(method):
            raise ValueError(f"paired samples need equal, non-empty (n, k) arrays, got {method.shape} and {baseline.shape}")
        size = len(method)
        n += size
        mine, theirs = float(score(method.mean(axis=0))), float(score(baseline.mean(axis=0)))
        observed += (mine - theirs) / len(strata)
        baseline_value += theirs / len(strata)
        own = score(method[:, None, :]) - score(baseline[:, None, :])  # each sample alone, as a task of one
        better, worse = better + int((own > 0).sum()), worse + int((own < 0).sum())
        index = rng.integers(0, size, size=(resamples, size))
        draws += (score(method[index].mean(axis=1)) - score(baseline[index].mean(axis=1))) / len(strata)
        swap = rng.random((resamples, size))[..., None] < 0.5
        a, b = np.where(swap, baseline, method), np.where(swap, method, baseline)
        flips += (score(a.mean(axis=1)) - score(b.mean(axis=1))) / len(strata)
    low, high = np.percentile(draws, [2.5, 97.5])
    extreme = int((np.abs(flips) >= abs(observed) - 1e-12).sum())
    return {
        "n": n, "value": baseline_value + observed, "baseline_value": baseline_value, "difference": observed,
        "difference_interval": (float(low), float(high)), "better": better, "worse": worse,
        "p": (extreme + 1) / (resamples + 1), "resamples": resamples,
    }


def mean_score(means):
    """A task scored by its one metric's mean (exact match, F1, accuracy)."""
    return means[..., 0]


def geometric_mean_score(means):
    """ZeroSCROLLS' summary score: the geometric mean of the mean ROUGE-1, -2 and -L (negatives as 0)."""
    import numpy as np

    return np.cbrt(np.prod(np.clip(means, 0.0, None), axis=-1))


def accuracy_with_interval(values: Sequence[float]) -> dict:
    """Accuracy of 0/1 values with its 95 % Wilson interval."""
    v = _as_binary(values, "values")
    if not v:
        raise ValueError("no samples")
    return {"n": len(v), "accuracy": sum(v) / len(v), "interval": wilson_interval(sum(v), len(v))}


def median_spread(values: Sequence[float]) -> dict:
    """Median and the 10 % / 90 % quantiles (linear interpolation between order statistics)."""
    import statistics

    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")

    def quantile(q):
        position = q * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return {"median": statistics.median(ordered), "p10": quantile(0.1), "p90": quantile(0.9)}


def format_p(p: float) -> str:
    """A p-value for a table: 3 significant digits, scientific below 0.001."""
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.1e}"


# ---------------------------------------------------------------- as the tables print them

def points(value: float) -> str:
    """A difference of accuracies in points, signed, with a true minus sign as the other tables print it."""
    return f"{value * 100:+.1f}".replace("-", "−")


def share(value: float) -> str:
    return f"{value:.3f}".removeprefix("0")


def difference(test: Mapping) -> str:
    low, high = test["difference_interval"]
    return f"{points(test['difference'])} [{points(low)}, {points(high)}]"
