"""``lpes-compare``: every method tuned on the same forwards (the race plan), the race itself, a setting
installed on a loaded model equal to that setting loaded fresh, and the command end to end on a tiny model:
its files, equal budgets, a killed run resumed to the same board, --estimate, and one-line refusals."""

import json
import os
import subprocess
import sys

import pytest
from tiny_models import save_tiny_checkpoint

from lpes_harness.search.method_racing import RacePlan, halving, plan_race, run_race, rung_forwards

# ----------------------------------------------------------------------------- the plan and the race


@pytest.mark.parametrize("count,budget,blocks", [(9, 300, 10), (54, 300, 10), (3, 300, 10), (15, 1000, 5),
                                                  (1, 50, 5), (2, 40, 10), (7, 123, 3)])
def test_a_race_spends_its_budget_to_within_one_sample_a_block_per_finalist(count, budget, blocks):
    plan = plan_race(count, budget, blocks, seed=1)
    alive, _ = plan.rungs[-1]
    assert plan.forwards <= budget and budget - plan.forwards < alive * blocks
    assert plan.forwards == rung_forwards(plan.rungs, blocks)
    for (a, n), (b, m) in zip(plan.rungs, plan.rungs[1:]):  # halved (rounded up), samples grow
        assert b == (a + 1) // 2 and m > n
    assert alive <= 2 and len(set(plan.kept)) == len(plan.kept) and list(plan.kept) == sorted(plan.kept)


def test_a_grid_too_large_for_the_budget_is_thinned_to_what_one_sample_a_block_allows():
    plan = plan_race(54, 300, 10, seed=3)
    assert len(plan.kept) < 54 and rung_forwards(halving(len(plan.kept), 1), 10) <= 300
    assert rung_forwards(halving(len(plan.kept) + 1, 1), 10) > 300  # not one more would fit
    assert plan_race(54, 300, 10, seed=3).kept == plan.kept  # the seed decides which
    with pytest.raises(ValueError, match="cannot score one candidate"):
        plan_race(5, 9, 10)


def test_the_race_keeps_the_better_half_and_ends_at_the_best():
    truth = {0: 0.2, 1: 0.9, 2: 0.5, 3: 0.7, 4: 0.1}  # candidate -> share of samples right
    calls = []

    def score(index, n):
        calls.append((index, n))
        # A constant score per candidate: its accuracy is its truth on any number of samples.
        return {block: [truth[index]] * n for block in range(2)}

    plan = plan_race(5, 60, 2)
    winner, entries = run_race(plan, score)
    assert winner.index == 1
    first_rung = {i for i, n in calls if n == plan.rungs[0][1]}
    assert first_rung == set(plan.kept)
    later = {i for i, n in calls if n > plan.rungs[0][1]}
    assert 0 not in later and 4 not in later  # the worst were cut first
    again, _ = run_race(RacePlan.from_dict(plan.to_dict()), score)  # a replay (a resume) ends the same
    assert again.index == winner.index


# ----------------------------------------------------------------------------- a setting installed in place


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("compare") / "model")


@pytest.mark.parametrize("model,first,second", [
    ("mspoe_hf", "min_ratio=1.0,max_ratio=1.4", "min_ratio=1.3,max_ratio=2.5"),
    ("pcd_hf", "base_ratio=0.1,weight=0.5", "base_ratio=0.3,weight=1.0"),
    ("string_hf", "shifted_offset=128,local_window=32", "shifted_offset=64,local_window=16"),
    ("buckets_hf", "bases=1.0;1.5;2.0", "bases=0.5;1.0"),
    ("fitm_hf", "temperature=5e-05,strength=0.5", "temperature=0.001,strength=1.0"),
])
def test_another_setting_installed_on_a_loaded_model_equals_that_setting_loaded(checkpoint, model, first, second):
    import torch
    from lm_eval.utils import simple_parse_args_string

    from lpes_harness.evaluation.baseline_rows import load_baseline_lm
    from lpes_harness.methods.setup import MethodSetup

    ids = torch.arange(5, 200).remainder(90).add(3)[None, :]
    reused = load_baseline_lm(MethodSetup(model, first), checkpoint, "float32")
    before = reused._model_call(ids)
    reused.reconfigure(**simple_parse_args_string(second))
    fresh = load_baseline_lm(MethodSetup(model, second), checkpoint, "float32")
    assert torch.equal(reused._model_call(ids), fresh._model_call(ids))
    assert not torch.equal(before, fresh._model_call(ids))  # the two settings differ on this input


# ----------------------------------------------------------------------------- the command on a tiny model


def compare(checkpoint, output, *extra, env=None):
    command = [sys.executable, "-m", "lpes_harness.commands.compare", "--pretrained", checkpoint, "--task", "needle",
               "--condition", 'six={"num_sentences": 6}', "--condition", 'eight={"num_sentences": 8}',
               "--methods", "lpes,pi,pcd,string", "--budget", "20m", "--tuning-forwards", "60", "--heldout-samples", "2", "--lpes-draws", "4",
               "--dtype", "float32", "--threads", "1", "--stacks", "--authors-defaults", "pcd,string", "--output", str(output), *extra]
    environment = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **(env or {}))
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=900)


@pytest.fixture(scope="module")
def compared(checkpoint, tmp_path_factory):
    output = tmp_path_factory.mktemp("compared") / "run"
    done = compare(checkpoint, output)
    assert done.returncode == 0, done.stderr[-3000:]
    return output, done.stdout


def without_latency(board):
    return [{k: v for k, v in row.items() if not k.startswith("latency")} for row in board["rows"]]


def test_the_board_has_a_row_a_method_and_its_files(compared):
    output, stdout = compared
    board = json.loads((output / "leaderboard.json").read_text())
    names = {row["name"] for row in board["rows"]}
    assert names == {"vanilla", "LPES lines", "PI tuned", "PCD tuned", "STRING tuned", "LPES lines + PCD tuned",
                     "LPES lines + STRING tuned", "PCD authors' defaults", "STRING authors' defaults"}
    for name in ("leaderboard.md", "positions.png", "gains.png", "compare.json"):
        assert (output / name).is_file()
    assert all(row["n"] == 2 * 2 * 5 for row in board["rows"])  # 2 samples x 5 positions x 2 conditions
    assert all(row["latency"] > 0 for row in board["rows"])
    assert "lpes-compare --pretrained" in (output / "leaderboard.md").read_text()
    assert "- 20 paired samples a row: no difference from vanilla under 30 points" in (output / "leaderboard.md").read_text()
    assert "written:" in stdout


def test_every_method_is_tuned_on_the_same_forwards(compared):
    output, _ = compared
    journal = json.loads((output / "compare.json").read_text())
    forwards = [t["forwards"] for t in journal["tuned"].values()]
    assert len(forwards) == 4 and max(forwards) <= 1.1 * min(forwards)
    assert all(f <= journal["plan"]["tuning_forwards"] for f in forwards)
    # What each race counted is what its score cache holds for its candidates: every forward scored.
    blocks = journal["plan"]["blocks"]
    for method, race in journal["plan"]["races"].items():
        assert race["forwards"] == rung_forwards([tuple(r) for r in race["rungs"]], blocks)


def test_a_killed_compare_resumes_to_the_same_board(checkpoint, compared, tmp_path):
    output, _ = compared
    journal = json.loads((output / "compare.json").read_text())
    killed_at = tmp_path / "run"
    killed_at.mkdir()
    # The same plan (the timing differs run to run); a kill in the middle of the tuning.
    (killed_at / "compare.json").write_text(json.dumps({"settings": journal["settings"], "plan": journal["plan"],
                                                        "started": journal["started"]}))
    first = compare(checkpoint, killed_at, env={"LPES_TEST_KILL_AT": "score-cache:25"})
    assert first.returncode == -9, first.stderr[-2000:]
    assert not (killed_at / "leaderboard.json").exists()
    done = compare(checkpoint, killed_at)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = json.loads((killed_at / "leaderboard.json").read_text())
    whole = json.loads((output / "leaderboard.json").read_text())
    assert without_latency(resumed) == without_latency(whole)


def test_estimate_writes_nothing(checkpoint, tmp_path):
    done = compare(checkpoint, tmp_path / "est", "--estimate")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tuning:" in done.stdout and "forwards for each of 4 methods" in done.stdout
    # 2 samples x 5 positions x 2 conditions: 6 gained of 20 is the least an exact McNemar finds at p < 0.05
    assert "20 paired samples a row: no difference from vanilla under 30 points can reach p < 0.05" in done.stdout
    assert not (tmp_path / "est").exists()


@pytest.mark.parametrize("extra,message", [
    (["--methods", "lpes,nope"], "--methods 'lpes,nope': nope not among"),
    (["--budget", "soon"], "--budget 'soon': give a duration"),
    (["--condition", "bad"], "expected NAME={json options}"),
    (["--heldout-samples", "0"], "--heldout-samples 0: give a positive number or auto"),
    (["--heldout-samples", "many"], "--heldout-samples many: give a positive number or auto"),
    (["--moice-gates", "/no/such/gates.pt"], "--moice-gates /no/such/gates.pt: no such file"),
])
def test_bad_input_is_one_line_before_the_model_loads(checkpoint, tmp_path, extra, message):
    done = compare(checkpoint, tmp_path / "bad", *extra)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()


def test_a_folder_of_another_compare_is_refused(checkpoint, compared):
    output, _ = compared
    done = compare(checkpoint, output, "--lpes-draws", "5")
    assert done.returncode == 2 and "holds a compare of other settings (draws differ)" in done.stderr, done.stderr


def test_a_race_never_plans_more_samples_than_the_split_holds():
    plan = plan_race(4, 100_000, 10, most=200)
    assert plan.rungs[-1][1] == 200 and plan.forwards < 100_000


def test_equal_races_bring_every_method_within_ten_percent():
    from lpes_harness.search.compare_run import equal_races

    for budget in (30, 35, 47, 120, 1000):
        races = equal_races({"lpes": 15, "pi": 16, "mspoe": 54, "buckets": 3, "pcd": 9}, budget, 5, 0, 200)
        spent = [race["forwards"] for race in races.values()]
        assert max(spent) <= 1.1 * min(spent) and max(spent) <= budget, (budget, spent)


def test_a_grid_setting_the_method_refuses_is_no_candidate():
    from lpes_harness.methods import METHODS
    from lpes_harness.search.compare_methods import accepted, grid_settings

    settings = [s.setup.args for s in grid_settings("mspoe")]
    grid = METHODS["mspoe"].grid
    pairs = [(a, b) for a in grid["min_ratio"] for b in grid["max_ratio"]]
    assert len(settings) == sum(a <= b for a, b in pairs) < len(pairs)  # min_ratio above max_ratio is refused
    assert not accepted("mspoe_hf", "min_ratio=1.5,max_ratio=1.2") and accepted("mspoe_hf", "min_ratio=1.2,max_ratio=1.5")
    assert len(grid_settings("pcd")) == 9  # a grid the method takes whole stays whole


def test_lpes_races_the_lines_of_the_models_own_default_race():
    """Gemma-3-270M's default race moves the position line on its global layers only, in [1, 3], and the base line
    in [1, 8]: the compare's LPES candidates are that family, not SmolLM2's [0.5, 2] on every layer (which scales
    Gemma's sliding layers, where its default search never goes)."""
    from lpes_harness.search.compare_methods import LINE_BOUNDS, line_family, lpes_settings
    from lpes_harness.search.profiles import PROFILES

    gemma = line_family("gemma3-270m", "cpu", "bfloat16")
    race = PROFILES["racing-gemma3"]
    assert gemma.profile == "racing-gemma3" and gemma.position_layer_type == "full_attention"
    assert gemma.bounds == ((race["y_min"], race["y_max"]), (race["base_y_min"], race["base_y_max"]))
    types = (["sliding_attention"] * 5 + ["full_attention"]) * 3
    for setting in lpes_settings(18, 6, 0, gemma, types):
        position, base = setting.setup.scales[:18], setting.setup.scales[18:]
        assert all(v == 1.0 for v, kind in zip(position, types) if kind == "sliding_attention")
        assert all(1.0 <= v <= 3.0 for v, kind in zip(position, types) if kind == "full_attention")
        assert all(1.0 <= v <= 8.0 for v in base) and "(full_attention layers)" in setting.text
    # The bundled SmolLM2 on a CPU, and a model with no race of its own: racing-smollm2's lines on every layer.
    assert line_family(None, "cpu", "bfloat16").bounds == LINE_BOUNDS
    assert line_family("org/other", "cpu", "float32").bounds == LINE_BOUNDS
    for setting in lpes_settings(4, 3, 0):
        assert all(0.5 <= v <= 2.0 for v in setting.setup.scales) and "layers)" not in setting.text


def test_a_setting_reads_back_from_the_journal_as_it_was():
    from lpes_harness.search.compare_methods import Setting, lpes_settings, pi_settings, settings_of

    for setting in [*lpes_settings(4, 3, 0), *pi_settings(4), *settings_of("pcd", 4, draws=3, seed=0)]:
        again = Setting.from_dict(json.loads(json.dumps(setting.to_dict())))
        assert again == setting


def test_a_stack_row_is_the_lpes_winner_under_the_methods_winner_and_counts_both_races(compared):
    output, _ = compared
    journal = json.loads((output / "compare.json").read_text())
    board = {row["name"]: row for row in json.loads((output / "leaderboard.json").read_text())["rows"]}
    tuned = journal["tuned"]
    for method, label in (("pcd", "PCD"), ("string", "STRING")):
        stack = board[f"LPES lines + {label} tuned"]
        assert (stack["method"], stack["label"]) == (f"lpes+{method}", f"LPES+{label}")
        assert stack["tuning_forwards"] == tuned["lpes"]["forwards"] + tuned[method]["forwards"]
        alone, curve = tuned[method]["setting"], tuned["lpes"]["setting"]
        assert stack["setting"] == f"{alone['text']} on the LPES lines ({curve['text']})"
    # The stack's held-out scores are its own: the cache holds them under a model spec with the curve in it.
    cached = (output / "heldout").rglob("scores.cache.json")
    assert any("lpes_scales=" in path.read_text() for path in cached)


def test_an_authors_defaults_row_is_the_method_with_no_parameter_set_and_is_not_tuned(compared):
    output, stdout = compared
    journal = json.loads((output / "compare.json").read_text())
    board = {row["name"]: row for row in json.loads((output / "leaderboard.json").read_text())["rows"]}
    assert journal["plan"]["authors_defaults"] == ["pcd", "string"]  # LPES and PI have no defaults
    assert "authors' defaults: pcd, string untuned beside their winners" in stdout
    for method, label in (("pcd", "PCD"), ("string", "STRING")):
        row = board[f"{label} authors' defaults"]
        assert (row["method"], row["label"], row["setting"]) == (method, label, "authors' defaults")
        assert (row["tuning_forwards"], row["candidates"]) == (0, 0)
    page = (output / "leaderboard.md").read_text()
    assert "| PCD authors' defaults | PCD | authors' defaults |" in page and "| not tuned |" in page
    # Scored as the bare model spec, apart from every tuned setting (which names its parameters).
    blocks = {key for path in (output / "heldout").rglob("scores.cache.json")
              for key in json.loads(path.read_text())["blocks"]}
    assert '"pcd_hf"@0' in blocks and '"string_hf"@0' in blocks


@pytest.mark.parametrize("value, message", [("lpes", "lpes is not a method of this run with defaults"),
                                            ("mspoe", "mspoe is not a method of this run with defaults"),
                                            (",", "no name is not")])
def test_authors_defaults_of_a_method_without_defaults_or_not_run_are_refused(checkpoint, tmp_path, value, message):
    command = [sys.executable, "-m", "lpes_harness.commands.compare", "--pretrained", str(checkpoint), "--task",
               "needle", "--methods", "lpes,pi,pcd", "--authors-defaults", value, "--output", str(tmp_path / "x")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and message in done.stderr and not (tmp_path / "x").exists()


def test_authors_defaults_alone_is_every_method_of_the_run_that_has_them():
    from lpes_harness.commands.compare import defaulted

    assert defaulted("all", ["lpes", "pi", "pcd", "fitm"]) == ("pcd", "fitm")
    assert defaulted("fitm,pcd,fitm", ["lpes", "pcd", "fitm"]) == ("fitm", "pcd") and defaulted(None, ["pcd"]) == ()


@pytest.mark.parametrize("methods", ["pi,pcd", "lpes,pi"])
def test_stacks_without_lpes_or_a_stacking_method_are_refused_before_the_model_loads(checkpoint, tmp_path, methods):
    command = [sys.executable, "-m", "lpes_harness.commands.compare", "--pretrained", str(checkpoint), "--task",
               "needle", "--methods", methods, "--stacks", "--output", str(tmp_path / "x")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--stacks" in done.stderr and not (tmp_path / "x").exists()
