"""--status's "left" line for a validation past its plan. The plan counts every candidate on N samples
per position and two of them doubled twice; a tie among more contenders draws more, and the line must
count what is left of the round under way from the cache, not the plan less the cache (seed 3 of the
robust SmolLM2 search printed "validation 0" with 310 forwards left)."""

import json
from types import SimpleNamespace

from lpes_harness.search.selection import validation_forwards
from lpes_harness.search.status import _validation_blocks, _validation_left

PERCENTS = {"a": [0, 50, 100], "b": [0, 100]}  # two conditions: 5 gold positions in all


def _folder(tmp_path, lengths: dict[str, dict[str, int]]):
    """A run folder whose validation cache holds, for each candidate, that many scores per condition
    (the same at each of its gold positions)."""
    for condition, percents in PERCENTS.items():
        blocks = {f"{json.dumps(scales)}@{p}": [1.0] * lengths[json.dumps(scales)][condition]
                  for scales in map(json.loads, lengths) for p in percents if lengths[json.dumps(scales)][condition]}
        folder = tmp_path / "validation" / condition
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "scores.cache.json").write_text(json.dumps({"identity": {}, "blocks": blocks}))
    return tmp_path


def _candidates(count: int) -> list[str]:
    return [json.dumps([1.0 + i / 10] * 3) for i in range(count)]


def _left(folder):
    args = SimpleNamespace(select_top=3, validation_samples=6)  # 6 candidates at most: 3 + start, sweep, uniform
    blocks = _validation_blocks(folder)
    return _validation_left(blocks, args, 5, sum(map(sum, blocks.values()))), validation_forwards(args, 5)


def test_in_the_first_round_what_is_left_is_the_plan_less_the_cache(tmp_path):
    names = _candidates(6)
    folder = _folder(tmp_path, {n: {"a": 6, "b": 6 if i < 4 else 0} for i, n in enumerate(names)})
    left, planned = _left(folder)
    assert planned == (6 + 6) * 6 * 5 and left == planned - (6 * 6 * 3 + 4 * 6 * 2)


def test_a_round_with_more_contenders_than_planned_is_finished_from_the_cache(tmp_path):
    names = _candidates(6)
    # Seed 3's shape: all six tied at 6 and at 12; three went on to 24, one of them has the first condition at 24,
    # one only part of it, one none yet (its first-round blocks at 12).
    lengths = {n: {"a": 12, "b": 12} for n in names}
    lengths[names[0]] = {"a": 24, "b": 24}
    lengths[names[1]] = {"a": 24, "b": 12}
    lengths[names[2]] = {"a": 12, "b": 12}
    folder = _folder(tmp_path, lengths)
    left, planned = _left(folder)
    assert sum(map(sum, _validation_blocks(folder).values())) > planned  # the plan's count is passed: it would say 0
    # names[1]: condition b's 2 positions from 12 to 24; names[0] done; names[2] is not in round 3 as far as the
    # cache can tell (no block at 24), so it is not counted: the line under- rather than over-states.
    assert left == 2 * 12
    # Once names[2] has one block at 24 it is a contender: the rest of its 5 positions are counted too.
    lengths[names[2]] = {"a": 24, "b": 12}
    left, _ = _left(_folder(tmp_path, lengths))
    assert left == 2 * 12 + 2 * 12


def test_a_second_round_counts_the_third_at_two_candidates(tmp_path):
    names = _candidates(6)
    lengths = {n: {"a": 6, "b": 6} for n in names}
    lengths[names[0]] = {"a": 12, "b": 12}
    lengths[names[1]] = {"a": 12, "b": 6}  # its condition b not reached yet in round 2
    left, _ = _left(_folder(tmp_path, lengths))
    # Round 2's rest: names[1]'s 2 positions of b from 6 to 12; then round 3 at two candidates, 12 more on 5 positions.
    assert left == 2 * 6 + 2 * 12 * 5
