"""`--resume --output DIR` takes the run's own settings from DIR/config.json (no model loaded here).

The subprocess side (a search killed at several points and resumed from its folder alone) is
tests/test_search_kill.py.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from lpes_harness.core.files import KILL_ENV
from lpes_harness.commands.search_cli import NOT_SAVED, parse_args
from lpes_harness.search.run_record import settings_record
from lpes_harness.search.run_record import RUN_RESULTS, RUN_STATE, clear_run_state
from lpes_harness.search.sweep import run_sweep

# The custom run (#48): every flag differs from the cpu profile's default.
CUSTOM = ["--task", "multi_needle", "--num-samples", "2", "--population", "6", "--parents", "2", "--mutants", "3",
          "--crossovers", "1", "--generations", "3", "--seed", "7", "--sweep", "1,0.8", "--no-racing",
          "--dtype", "float32", "--heldout-samples", "0", "--device", "cpu"]  # fmt: skip


def saved_run(folder, argv):
    """A run folder as the search leaves it before anything is scored: config.json with its settings."""
    folder.mkdir(parents=True, exist_ok=True)
    args = parse_args([*argv, "--output", str(folder)])
    (folder / "config.json").write_text(json.dumps({"command": "lpes-search ...", "settings": settings_record(args)}))
    return args


def test_a_resume_takes_every_setting_of_the_run_from_its_folder(tmp_path):
    first = saved_run(tmp_path / "R", CUSTOM)
    resumed = parse_args(["--resume", "--output", str(tmp_path / "R")])
    assert settings_record(resumed) == settings_record(first)
    assert (resumed.population, resumed.seed, resumed.sweep, resumed.racing) == (6, 7, "1,0.8", False)
    assert resumed.sweep_values == first.sweep_values and resumed.metadata == first.metadata
    assert resumed.profile == first.profile and resumed.heldout_samples == 0
    assert resumed.resume and resumed.output == str(tmp_path / "R")


def test_the_command_line_wins_over_the_saved_settings(tmp_path):
    saved_run(tmp_path / "R", CUSTOM)
    resumed = parse_args(["--resume", "--output", str(tmp_path / "R"), "--generations", "5", "--seed", "7"])
    assert resumed.generations == 5 and resumed.seed == 7 and resumed.population == 6
    # The same holds for a --config file given again (config file > saved run > profile).
    config = tmp_path / "more.json"
    config.write_text(json.dumps({"generations": 4}))
    assert parse_args(["--resume", "--output", str(tmp_path / "R"), "--config", str(config)]).generations == 4


def test_saved_settings_are_every_flag_and_a_flag_unknown_now_is_left_out(tmp_path):
    args = saved_run(tmp_path / "R", CUSTOM)
    record = settings_record(args)
    from lpes_harness.commands.search_cli import build_parser

    flags = {a.dest for a in build_parser()._actions if a.dest != "help"}
    assert set(record) == flags - NOT_SAVED  # generic: a new flag is saved with no edit here
    saved = json.loads((tmp_path / "R" / "config.json").read_text())
    saved["settings"]["a_flag_since_removed"] = 3
    del saved["settings"]["scorer"]  # a flag added after the run was made: its default
    (tmp_path / "R" / "config.json").write_text(json.dumps(saved))
    resumed = parse_args(["--resume", "--output", str(tmp_path / "R")])
    assert not hasattr(resumed, "a_flag_since_removed") and resumed.scorer == "answer-logits"


def test_a_folder_without_saved_settings_resumes_with_the_flags_given(tmp_path):
    """Run folders made before settings were saved: the flags must be given again, as before."""
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"command": "lpes-search --seed 7"}))
    assert parse_args(["--resume", "--output", str(folder), "--device", "cpu"]).seed == 0
    assert parse_args(["--resume", "--output", str(folder), "--device", "cpu", "--seed", "7"]).seed == 7


def test_resume_of_a_folder_without_a_run_is_one_line_with_status_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--resume", "--output", str(tmp_path / "nothing")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run in" in err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{")
    with pytest.raises(SystemExit) as stop:
        parse_args(["--resume", "--output", str(tmp_path / "bad")])
    assert stop.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_a_sweep_resumed_with_journalled_points_scores_only_the_rest_and_ends_alike():
    calls = []

    def evaluate(scales, threshold):
        calls.append(scales[0])
        return -abs(scales[0] - 0.9), {"raced": False, "threshold": threshold}

    journal = []
    whole = run_sweep(evaluate, [1.0, 0.8, 1.2], lambda v: [v] * 4, on_point=journal.append)
    assert calls == [1.0, 0.8, 1.2] and [p["scale"] for p in journal] == calls
    calls.clear()
    known = {p["scale"]: (p["fitness"], p["info"]) for p in journal[:2]}  # killed after two points
    resumed = run_sweep(evaluate, [1.0, 0.8, 1.2], lambda v: [v] * 4, known=known, on_point=journal.append)
    assert calls == [1.2] and resumed == whole  # the third is raced against the same threshold


def test_the_kill_hook_kills_at_the_nth_pass_of_its_point_only():
    script = ("from lpes_harness.core.files import kill_point\n"
              "for i in range(3):\n    kill_point('other'); kill_point('sweep'); print(i, flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, KILL_ENV: "sweep:2"})
    assert done.returncode == -signal.SIGKILL and done.stdout.split() == ["0"]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != KILL_ENV})
    assert done.returncode == 0 and done.stdout.split() == ["0", "1", "2"]


def test_a_resume_that_grows_generations_records_it_for_the_next_resume(tmp_path):
    from lpes_harness.search.run_record import write_config

    folder = tmp_path / "R"
    folder.mkdir()
    first = parse_args([*CUSTOM, "--output", str(folder)])
    write_config(folder / "config.json", False, {"command": "lpes-search ...", "settings": settings_record(first),
                                                  "fingerprint": {"format": "x"}, "search": {"generations": 3}})
    grown = parse_args(["--resume", "--output", str(folder), "--generations", "5"])
    write_config(folder / "config.json", True, {"command": "lpes-search --resume ...", "settings": settings_record(grown),
                                                 "fingerprint": {"format": "y"}})
    record = json.loads((folder / "config.json").read_text())
    assert record["search"] == {"generations": 3} and record["command"] == "lpes-search ..."  # the first run's record
    assert record["settings"]["generations"] == 5 and record["fingerprint"] == {"format": "y"}  # the next resume's
    assert record["resumes"][0]["changed"] == {"generations": {"saved": 3, "now": 5}}
    assert parse_args(["--resume", "--output", str(folder)]).generations == 5


def test_a_fresh_start_removes_the_old_runs_state_and_results_and_keeps_the_score_cache(tmp_path):
    """--overwrite: no old journal is read as this run's, and no old held-out table, history or plot
    sits beside new scales; every score cache stays."""
    old = [*RUN_STATE, *RUN_RESULTS, "scores.cache.json", "config.json"]
    for name in old:
        (tmp_path / name).write_text("{}")
    caches = ["heldout/60_sentences/scores.cache.json", "validation/60_sentences/scores.cache.json"]
    tables = ["heldout/summary.md", "heldout/summary.png", "heldout/60_sentences/heldout.json",
              "heldout/60_sentences/heldout.md"]
    for name in caches + tables:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    assert "uniform_tuning.jsonl" in RUN_STATE and {"scales.json", "heldout.json", "uniform.json", "history.jsonl",
                                                    "curve.png"} <= set(RUN_RESULTS)
    clear_run_state(tmp_path)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(["config.json", "scores.cache.json", *caches])


def test_a_resume_on_another_machine_says_so_in_its_entry(tmp_path):
    """A run's timings compare only within one CPU kind: a resume elsewhere is written beside the first machine."""
    from lpes_harness.search.run_record import write_config

    path = tmp_path / "config.json"
    settings = settings_record(parse_args([*CUSTOM, "--output", str(tmp_path)]))
    first = {"command": "lpes-search ...", "settings": settings, "fingerprint": {}, "model": {"machine": "Xeon, AMX"}}
    write_config(path, False, first)
    write_config(path, True, {**first, "command": "lpes-search --resume"})  # the same machine: nothing to say
    write_config(path, True, {**first, "command": "lpes-search --resume", "model": {"machine": "EPYC, AVX2 only"}})
    record = json.loads(path.read_text())
    assert record["model"]["machine"] == "Xeon, AMX"
    assert ["machine" in entry for entry in record["resumes"]] == [False, True]
    assert record["resumes"][1]["machine"] == "EPYC, AVX2 only"
