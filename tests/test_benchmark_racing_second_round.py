"""benchmarks/racing_second_round.py's candidates: the first race's finalists in its order (the most samples, then
more right, then the lower loss), then local draws around them inside the run's bounds, the same from the same run."""

import json

from conftest import load_benchmark


def write_run(folder):
    candidates = [[[1.0, 1.0], [1.0, 1.0]], [[0.6, 1.5], [0.5, 0.6]], [[0.55, 1.9], [1.9, 1.95]], [[1.2, 0.8], [1.0, 1.0]]]
    (folder / "racing.json").write_text(json.dumps({"settings": {"seed": 4, "racing_samples": 4, "racing_first": 2},
                                                    "candidates": candidates}))
    (folder / "config.json").write_text(json.dumps({"settings": {"y_min": 0.5, "y_max": 2.0, "base_y_min": 0.5,
                                                                 "base_y_max": 2.0}}))
    rows = [(0, s, s < 3, 0.5) for s in range(4)] + [(1, s, s < 3, 0.2) for s in range(4)]  # 3 of 4 each; 1's loss lower
    rows += [(2, s, True, 0.9) for s in range(2)] + [(3, s, False, 2.0) for s in range(2)]
    (folder / "racing.jsonl").write_text("".join(json.dumps({"candidate": c, "sample": s, "right": r, "loss": l}) + "\n"
                                                 for c, s, r, l in rows))


def test_the_second_round_starts_from_the_finalists_and_draws_inside_the_bounds(tmp_path):
    bench = load_benchmark("racing_second_round")
    write_run(tmp_path)
    first, bounds, best, candidates, reached = bench.second_round(tmp_path, 2, 6, 0.5)
    assert best == [1, 0]  # both reached 4 samples with 3 right; 1 has the lower loss; 2 reached only 2
    assert candidates[:2] == [[(0.6, 1.5), (0.5, 0.6)], [(1.0, 1.0), (1.0, 1.0)]]
    assert len(candidates) == 8 and bounds == [(0.5, 2.0), (0.5, 2.0)]
    assert all(0.5 <= v <= 2.0 for ends in candidates[2:] for end in ends for v in end)
    assert candidates[2] != candidates[0] and len({json.dumps(c) for c in candidates}) == 8
    assert bench.second_round(tmp_path, 2, 6, 0.5)[3] == candidates  # drawn from the run's seed
    assert set(reached) == {0, 1, 2, 3} and len(reached[0]) == 4
