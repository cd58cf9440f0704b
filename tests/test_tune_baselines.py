"""`python -m lpes_harness.commands.tune`: a baseline's grid scored on the search split with the
search's weighted fitness, on a tiny random checkpoint; winners decided by planted scores."""

import json

import pytest
from tiny_models import save_tiny_checkpoint

from lpes_harness.evaluation.score_cache import ScoreCache
from lpes_harness.commands import tune as tune_command
from lpes_harness.search.baseline_tuning import check_argument_names, evaluate, expand_grid, parse_fixed, parse_grid, ranked

KV_ROLES = {"begin": (0,), "middle": (40,), "end": (100,)}  # kv_retrieval's declared roles
POSITIONS = (0, 20, 40, 60, 80, 100)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_tune"), "llama")


def tune(*args):
    return tune_command.main([str(a) for a in args])


def common(checkpoint, output):
    return ["--pretrained", checkpoint, "--task", "kv_retrieval", "--metadata", '{"num_pairs": 3}',
            "--num-samples", "2", "--dtype", "float32", "--threads", "1", "--output", output]  # fmt: skip


def test_the_grid_is_the_cartesian_product_after_the_fixed_arguments():
    grid = parse_grid('{"min_ratio": [1.0, 1.05, 1.0], "max_ratio": [1.2, 2], "bases": [[1.0, 1.5]], "x": true}')
    assert grid == {"min_ratio": ["1.0", "1.05"], "max_ratio": ["1.2", "2"], "bases": ["1.0;1.5"], "x": ["true"]}
    fixed = parse_fixed("head_mapping=rank, layers=2:")
    assert fixed == {"head_mapping": "rank", "layers": "2:"}
    candidates = expand_grid({"min_ratio": ["1.0", "1.05"], "max_ratio": ["1.2", "2"]}, fixed)
    assert candidates == [
        "head_mapping=rank,layers=2:,min_ratio=1.0,max_ratio=1.2", "head_mapping=rank,layers=2:,min_ratio=1.0,max_ratio=2",
        "head_mapping=rank,layers=2:,min_ratio=1.05,max_ratio=1.2", "head_mapping=rank,layers=2:,min_ratio=1.05,max_ratio=2",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="both in --fixed"):
        expand_grid({"head_mapping": ["rank"]}, fixed)
    with pytest.raises(ValueError, match="cannot be empty or hold ','"):
        parse_grid('{"bases": ["1,2"]}')
    with pytest.raises(ValueError, match="k=v pairs"):
        parse_fixed("head_mapping")


def test_fitness_weights_the_roles_not_the_positions():
    """A candidate right at begin and middle (mean over roles .67) loses to one right at the end
    (.5): 0.2 + 0.3 = .5 < 0.3 * .5 + 0.5 = .65. Positions outside the roles do not count."""
    zeros = [0.0, 0.0]
    early = {0: [1.0, 1.0], 20: [1.0, 1.0], 40: [1.0, 1.0], 60: zeros, 80: zeros, 100: zeros}
    late = {0: zeros, 20: zeros, 40: [1.0, 0.0], 60: zeros, 80: zeros, 100: [1.0, 1.0]}
    a, b = evaluate(early, KV_ROLES), evaluate(late, KV_ROLES)
    assert a["fitness"] == pytest.approx(0.5) and b["fitness"] == pytest.approx(0.65)
    assert a["roles"] == {"begin": 1.0, "middle": 1.0, "end": 0.0} and a["forwards"] == 12
    assert a["accuracy"]["20"] == 1.0
    pooled = evaluate({0: [1.0], 25: [1.0], 50: [0.0], 75: [0.0], 100: [1.0]},
                      {"begin": (0,), "middle": (25, 50, 75), "end": (100,)})
    assert pooled["roles"]["middle"] == pytest.approx(1 / 3)  # multi_needle's middle: samples pooled
    order = ranked([{"index": 0, **a}, {"index": 1, **b}, {"index": 2, "refused": "no"}])
    assert [c["index"] for c in order] == [1, 0]


def test_a_tie_in_fitness_goes_to_the_better_mean_even_when_the_sums_round_apart():
    """Both .82 by the fitness (20 samples a position, SmolLM2's FitM tuning): 0.2 * 1 + 0.3 * .4 + 0.5 * 1
    and 0.2 * .95 + 0.3 * .5167 + 0.5 * .95 differ in the last bits as floats, one fitness once rounded
    where it is made; the second's mean accuracy (.69 against .64) must win, whatever order the grid gave them."""
    roles = {"begin": (0,), "middle": (25, 50, 75), "end": (100,)}

    def counts(*hits):
        return {p: [1.0] * h + [0.0] * (20 - h) for p, h in zip((0, 25, 50, 75, 100), hits)}

    sharp, even = evaluate(counts(20, 11, 5, 8, 20), roles), evaluate(counts(19, 15, 8, 8, 19), roles)
    assert sharp["fitness"] == even["fitness"] == 0.82
    for first, second in ((sharp, even), (even, sharp)):
        order = ranked([{"index": 0, **first}, {"index": 1, **second}])
        assert order[0]["accuracy"] == even["accuracy"]


def test_a_misspelt_argument_is_named_against_the_model_class():
    check_argument_names("mspoe_hf", ["min_ratio", "head_mapping", "batch_size"])
    with pytest.raises(ValueError, match=r"mspoe_hf takes no argument 'min_ratoi'; its own are .*min_ratio"):
        check_argument_names("mspoe_hf", ["min_ratoi"])


def test_without_a_grid_the_table_of_methods_gives_it_and_names_the_row():
    from lpes_harness.methods import METHODS

    parser = tune_command.build_parser()
    plan = tune_command.check_args(parser.parse_args(["--baseline", "mspoe_hf", "--output", "x"]))
    assert plan["name"] == "Ms-PoE" and plan["model"] == "mspoe_hf"
    grid = METHODS["mspoe"].grid
    assert len(plan["arg_strings"]) == len(grid["min_ratio"]) * len(grid["max_ratio"])
    buckets = tune_command.check_args(parser.parse_args(["--baseline", "B=buckets_hf", "--output", "x"]))
    assert buckets["name"] == "B" and buckets["arg_strings"][0] == "bases=1.0;1.3;1.6;1.9;2.2;2.5;2.8"
    pi = tune_command.check_args(parser.parse_args(["--uniform", "--output", "x"]))
    assert pi["name"] == "PI" and pi["values"] == list(METHODS["pi"].grid["scales"])
    with pytest.raises(ValueError, match="hf needs --grid .* the table of methods has a grid for mspoe_hf, buckets_hf"):
        tune_command.check_args(parser.parse_args(["--baseline", "hf", "--output", "x"]))


def _plant(cache_path, spec, by_percent):
    cache = json.loads(cache_path.read_text())
    for percent, values in by_percent.items():
        cache["blocks"][ScoreCache.key(spec, percent)] = values
    cache_path.write_text(json.dumps(cache))


def test_a_baseline_grid_skips_refused_candidates_and_the_weighted_winner_is_written(checkpoint, tmp_path, capsys):
    output = tmp_path / "tune"
    grid = '{"min_ratio": [1.0, 1.1, 1.5], "max_ratio": [1.2]}'  # 1.5 > 1.2: Ms-PoE's own check refuses it
    args = ["--baseline", "Ms-PoE=mspoe_hf", "--grid", grid, "--fixed", "head_mapping=rank", *common(checkpoint, output)]
    tune(*args)
    printed = capsys.readouterr().out
    assert "skipped head_mapping=rank,min_ratio=1.5,max_ratio=1.2: min_ratio=1.5, max_ratio=1.2" in printed
    saved = json.loads((output / "tuning.json").read_text())
    assert [c["args"] for c in saved["candidates"]] == [
        "head_mapping=rank,min_ratio=1.0,max_ratio=1.2", "head_mapping=rank,min_ratio=1.1,max_ratio=1.2",
        "head_mapping=rank,min_ratio=1.5,max_ratio=1.2"]  # fmt: skip
    assert "refused" in saved["candidates"][2] and "fitness" not in saved["candidates"][2]
    assert saved["budget"] == {**saved["budget"], "candidates": 3, "candidates_scored": 2, "forwards": 2 * 6 * 2,
                               "reference_forwards": 12, "scored_now": 3 * 12}

    # Planted (a random model scores about 0 everywhere): the earlier candidate is right at
    # begin and middle, the later one at the end; weighted fitness must pick the later one.
    early, late = (f"mspoe_hf:{c['args']}" for c in saved["candidates"][:2])
    _plant(output / "scores.cache.json", early, {0: [1.0, 1.0], 40: [1.0, 1.0], 100: [0.0, 0.0]})
    _plant(output / "scores.cache.json", late, {0: [0.0, 0.0], 40: [1.0, 0.0], 100: [1.0, 1.0]})
    tune(*args)
    assert "0 scored now" in capsys.readouterr().out  # everything was cached: no model loaded, nothing scored
    saved = json.loads((output / "tuning.json").read_text())
    assert saved["winner"]["args"] == "head_mapping=rank,min_ratio=1.1,max_ratio=1.2"
    assert saved["winner"]["fitness"] == pytest.approx(0.65)
    best = (output / "best.txt").read_text().strip()
    assert best == "Ms-PoE tuned=mspoe_hf:head_mapping=rank,min_ratio=1.1,max_ratio=1.2"
    from lpes_harness.evaluation.baseline_rows import parse_baseline
    from lpes_harness.methods.setup import MethodSetup

    assert parse_baseline(best) == ("Ms-PoE tuned", MethodSetup("mspoe_hf", "head_mapping=rank,min_ratio=1.1,max_ratio=1.2"))
    table = (output / "tuning.md").read_text()
    assert table.index("min_ratio=1.1") < table.index("min_ratio=1.0") and "0.6500" in table

    # A run killed during the first candidate: only its missing block is scored again.
    cache = json.loads((output / "scores.cache.json").read_text())
    del cache["blocks"][ScoreCache.key(early, 20)]
    (output / "scores.cache.json").write_text(json.dumps(cache))
    tune(*args)
    assert "2 scored now" in capsys.readouterr().out
    assert json.loads((output / "tuning.json").read_text())["winner"]["args"].endswith("min_ratio=1.1,max_ratio=1.2")


def test_uniform_scales_tune_pi_through_the_loaded_model(checkpoint, tmp_path, capsys):
    output = tmp_path / "pi"
    args = ["--uniform", "0.5,2", *common(checkpoint, output)]
    tune(*args)
    capsys.readouterr()
    _plant(output / "scores.cache.json", [2.0] * 4, {100: [1.0, 1.0]})
    tune(*args)
    assert "0 scored now" in capsys.readouterr().out
    saved = json.loads((output / "tuning.json").read_text())
    assert saved["mode"] == "uniform" and [c["args"] for c in saved["candidates"]] == ["0.5", "2"]
    assert saved["winner"]["args"] == "2" and saved["winner"]["fitness"] == pytest.approx(0.5)
    assert (output / "best.txt").read_text().strip() == "2" and '--uniform "2"' in saved["use"]


@pytest.mark.parametrize("change, message", [
    (["--grid", '{"min_ratio": [1.0,'], "--grid is not valid JSON"),
    (["--grid", '{"min_ratoi": [1.0]}'], "mspoe_hf takes no argument 'min_ratoi'"),
    (["--grid", "{}"], "--grid must be a non-empty JSON object"),
    (["--grid", '{"min_ratio": []}'], "--grid 'min_ratio' has no values"),
    (["--num-samples", "0"], "--num-samples must be >= 1"),
    (["--task", "no_such_task"], "no_such_task"),
])  # fmt: skip
def test_bad_settings_are_one_line_and_write_nothing(tmp_path, capsys, change, message):
    args = {"--baseline": "Ms-PoE=mspoe_hf", "--grid": '{"min_ratio": [1.0]}', "--task": "kv_retrieval",
            "--num-samples": "2", "--output": str(tmp_path / "out")}
    args.update(dict(zip(change[::2], change[1::2])))
    with pytest.raises(SystemExit) as stopped:
        tune(*[item for pair in args.items() for item in pair])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_model_that_is_not_there_is_one_line_and_writes_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        tune("--uniform", "0.9", "--task", "kv_retrieval", "--num-samples", "1",
             "--pretrained", str(tmp_path / "no_such_model"), "--output", str(tmp_path / "out"))
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "--pretrained" in err and "no_such_model" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()
