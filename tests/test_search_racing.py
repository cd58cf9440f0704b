"""Random lines raced by successive halving (lpes_harness.search.line_racing): the rungs' sizes and forwards, the
draws inside their bounds and spread, the cut by accuracy then loss, a resumed race equal to an uninterrupted
one, and a deadline that ends it between rungs."""

import math

import pytest

from lpes_harness.search.line_racing import RacingConfig, latin_ends, race


def test_rungs_halve_the_candidates_and_double_the_samples():
    config = RacingConfig(draws=23, samples=48, first=8)
    assert config.rungs() == [(24, 8), (12, 16), (6, 32), (3, 48)]
    assert config.forwards() == 24 * 8 + 12 * 8 + 6 * 16 + 3 * 16 == 432
    assert RacingConfig(draws=1, samples=4, first=4).rungs() == [(2, 4)]
    assert RacingConfig(draws=4, samples=100, first=1).rungs() == [(5, 1), (3, 2), (2, 4), (1, 8)]


@pytest.mark.parametrize("bad", [dict(draws=0), dict(first=0), dict(first=9, samples=8)])
def test_bad_racing_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        RacingConfig(**{"draws": 3, "samples": 8, "first": 2, **bad})


def test_latin_ends_fill_every_stratum_inside_the_bounds():
    bounds = [(0.5, 2.0), (0.25, 4.0)]
    draws = latin_ends(10, bounds, seed=3)
    assert len(draws) == 10 and all(len(d) == 2 for d in draws)
    for axis, (low, high) in enumerate(bounds):
        for end in (0, 1):
            values = [d[axis][end] for d in draws]
            assert all(low <= v <= high for v in values)
            # log-uniform, one draw in each tenth of the log range
            strata = sorted(int(10 * (math.log(v) - math.log(low)) / (math.log(high) - math.log(low))) for v in values)
            assert strata == list(range(10)) or len(set(strata)) >= 9  # rounding to 4 decimals may touch an edge
    assert latin_ends(10, bounds, seed=3) == draws and latin_ends(10, bounds, seed=4) != draws


def scripted(table):
    """A scorer from a table: candidate -> list of (right, loss) per sample; records every call."""
    calls = []

    def score(entry, sample):
        calls.append((entry.index, sample))
        return table[entry.index][sample]

    return score, calls


TABLE = {  # 5 candidates on 4 samples
    0: [(True, 0.1), (False, 1.0), (True, 0.2), (False, 1.0)],  # the plain model: 2 of 4
    1: [(False, 2.0), (False, 2.0), (False, 2.0), (False, 2.0)],
    2: [(True, 0.3), (True, 0.3), (True, 0.3), (False, 0.5)],  # 3 of 4: the best
    3: [(True, 0.5), (False, 0.9), (False, 1.0), (True, 0.1)],  # 1 of 2 first, as the plain model, worse loss
    4: [(True, 0.2), (True, 0.2), (False, 1.0), (False, 1.0)],  # 2 of 2 first, then 0 of 2
}
ENDS = [[(1.0, 1.0)]] + [[(0.5 + k / 10, 1.5)] for k in range(4)]


def test_the_race_keeps_the_better_half_by_accuracy_then_loss():
    score, calls = scripted(TABLE)
    found = race(score, ENDS, RacingConfig(draws=4, samples=4, first=2))
    # rung 0: all 5 on 2 samples; 2 and 4 have 2 right; 0 and 3 have 1, 0's loss is lower; 1 has none.
    # rung 1: the better half (3 of 5): 2, 4 and 0 on all 4 samples; 2 has 3 right
    assert [e.rung for e in found.entries] == [1, 0, 1, 0, 1]
    assert found.winner.index == 2 and found.forwards == 5 * 2 + 3 * 2 == len(calls)
    assert len(set(calls)) == len(calls)  # nothing scored twice
    assert found.entries[0].right == [True, False, True, False]


def test_every_survivor_of_a_rung_is_scored_on_the_same_samples():
    score, _ = scripted(TABLE)
    found = race(score, ENDS, RacingConfig(draws=4, samples=4, first=1))
    reached = {}
    for entry in found.entries:
        reached.setdefault(entry.rung, set()).add(len(entry.right))
    assert all(len(lengths) == 1 for lengths in reached.values())


def test_a_resumed_race_ends_as_the_uninterrupted_one():
    score, calls = scripted(TABLE)
    whole = race(score, ENDS, RacingConfig(draws=4, samples=4, first=2))
    journal = {}

    def killed(entry, sample):
        if len(journal) == 7:
            raise KeyboardInterrupt
        return TABLE[entry.index][sample]

    with pytest.raises(KeyboardInterrupt):
        race(killed, ENDS, RacingConfig(draws=4, samples=4, first=2),
             on_score=lambda e, s, r, l: journal.__setitem__((e.index, s), (r, l)))
    again, more = scripted(TABLE)
    resumed = race(again, ENDS, RacingConfig(draws=4, samples=4, first=2), known=journal)
    assert resumed.winner.index == whole.winner.index and resumed.forwards == whole.forwards
    assert [e.to_dict() for e in resumed.entries] == [e.to_dict() for e in whole.entries]
    assert len(more) == len(calls) - 7 and not set(more) & set(journal)


def test_a_deadline_ends_the_race_between_rungs_with_the_leader_so_far():
    score, calls = scripted(TABLE)
    found = race(score, ENDS, RacingConfig(draws=4, samples=4, first=2), stop_before_rung=lambda rung, *_: rung == 1)
    assert found.stopped and len(calls) == 10 and found.forwards == 10
    assert found.winner.index == 4  # of the two with 2 right on 2 samples, the lower loss (0.2 against 2's 0.3)
