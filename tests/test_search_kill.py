"""A search killed with SIGKILL anywhere continues with `--resume --output DIR` alone as if nothing happened.

`lpes-search` runs as a subprocess on a tiny random model and kills itself (SIGKILL, through the
test hook :func:`lpes_harness.core.files.kill_point`, ``LPES_TEST_KILL_AT=POINT:N``) during the sweep,
between two generations, mid-generation and during the held-out table, one kill per process;
each time it is resumed with ``--resume --output DIR`` and no other flag. Its history, best
curve, sweep and held-out table must equal an uninterrupted run's with the same seed, and every
JSON file must parse after each kill. The same for ``commands.paired``'s score cache.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_models import save_tiny_checkpoint

from lpes_harness.core.files import KILL_ENV
from lpes_harness.search.run_record import STAMP

REPO = Path(__file__).resolve().parents[1]
GA = str(REPO / "searches" / "ga.py")
TIMINGS = ("seconds", "eval_seconds")  # wall times differ from run to run; nothing else may


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_kill"), "llama")


def search_flags(checkpoint):
    # logprob fitness: a random tiny model never answers right, but its log-probs differ per genome.
    # 4 + 2 x 3 individuals, a 2-point sweep, 2 held-out samples at each of kv_retrieval's 6 positions.
    return [
        "--pretrained", checkpoint, "--device", "cpu", "--dtype", "float32", "--threads", "1", "--fitness", "logprob",
        "--task", "kv_retrieval", "--metadata", '{"num_pairs": 3}', "--num-samples", "2", "--chunk-size", "2",
        "--population", "4", "--parents", "2", "--mutants", "1", "--crossovers", "1", "--generations", "2",
        "--seed", "5", "--sweep", "1,0.8", "--heldout-samples", "2", "--heldout-extra", "pi", "--no-progress",
    ]  # fmt: skip


def launch(command, kill=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **({KILL_ENV: kill} if kill else {}))
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, timeout=timeout)


def resume(output, *flags, kill=None):
    return launch([GA, "--resume", "--output", str(output), *flags], kill=kill)


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, STAMP))


def earlier(stamp: str, seconds: float) -> str:
    return time.strftime(STAMP, time.localtime(epoch(stamp) - seconds))


def lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()] if Path(path).exists() else []


def assert_every_file_parses(output):
    """After a kill: every JSON file whole, every JSON-lines journal whole line by line."""
    for path in Path(output).iterdir():
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            lines(path)
    assert not list(Path(output).glob(".*.tmp")), "a temporary file of an atomic write was left behind"


def outcome(output):
    """What a run must reproduce: every individual, every generation, the best curve, sweep, held-out table."""
    output = Path(output)
    return {
        "history": without_timings(lines(output / "history.jsonl")),
        "generations": lines(output / "generations.jsonl"),
        "scales": without_timings(json.loads((output / "scales.json").read_text())),
        "best": without_timings(json.loads((output / "result.json").read_text())["best"]),
        "sweep": without_timings(json.loads((output / "sweep.json").read_text())),
        "heldout": json.loads((output / "heldout.json").read_text()),
        "scores": json.loads((output / "scores.cache.json").read_text()),
    }


@pytest.fixture(scope="module")
def uninterrupted(checkpoint, tmp_path_factory):
    output = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = launch([GA, *search_flags(checkpoint), "--output", str(output)])
    assert done.returncode == 0, done.stderr[-3000:]
    return output


def test_a_search_killed_at_every_stage_resumes_from_its_folder_alone(checkpoint, uninterrupted, tmp_path):
    output = tmp_path / "run"
    # During the sweep: its first point is on disk, the folder holds config.json and the journal.
    killed = launch([GA, *search_flags(checkpoint), "--output", str(output)], kill="sweep:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert_every_file_parses(output)
    assert sorted(p.name for p in output.iterdir()) == ["config.json", "sweep.jsonl"]
    assert len(lines(output / "sweep.jsonl")) == 1 and "settings" in json.loads((output / "config.json").read_text())

    # Between generations 0 and 1 (the first generation end of this process).
    killed = resume(output, kill="generation:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "1 scored before the stop" in killed.stdout  # the sweep's first point was not scored again
    assert_every_file_parses(output)
    assert len(lines(output / "generations.jsonl")) == 1 and len(lines(output / "history.jsonl")) == 4
    assert not (output / "sweep.jsonl").exists() and json.loads((output / "checkpoint.json").read_text())[
        "completed_generation"] == 0

    # Mid-generation 1: two of its individuals journalled.
    killed = resume(output, kill="individual:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # A resumed search says what is left of it (--status's line), not the whole run's worst case again.
    assert "resumed; left: " in killed.stdout and "cost estimate" not in killed.stdout, killed.stdout[-3000:]
    assert_every_file_parses(output)
    assert len(lines(output / "generations.jsonl")) == 1 and len(lines(output / "checkpoint.jsonl")) == 2

    # During the held-out table: the search is done, two blocks of held-out scores are saved.
    killed = resume(output, kill="score-cache:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert_every_file_parses(output)
    assert (output / "result.json").exists() and not (output / "heldout.json").exists()
    assert len(json.loads((output / "scores.cache.json").read_text())["blocks"]) == 2

    # An hour between the kill and the resume, without waiting one: the run's past moved an hour back (its
    # stamps in config.json and its files' times), as a fake clock for the processes that ran.
    hour = 3600
    record = json.loads((output / "config.json").read_text())
    record["started"] = earlier(record["started"], hour)
    for entry in record["resumes"]:
        entry["at"] = earlier(entry["at"], hour)
    (output / "config.json").write_text(json.dumps(record))
    for path in (p for p in output.rglob("*") if p.is_file()):
        os.utime(path, (path.stat().st_atime - hour, path.stat().st_mtime - hour))
    done = resume(output)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_every_file_parses(output)
    resumed, expected = outcome(output), outcome(uninterrupted)
    indices = [record["index"] for record in resumed["history"]]
    assert indices == list(range(len(indices)))  # nobody journalled twice, nobody left out
    for key in expected:
        assert resumed[key] == expected[key], key
    record = json.loads((output / "config.json").read_text())
    assert [entry["command"].split()[1:] for entry in record["resumes"]] == [["--resume", "--output", str(output)]] * 4
    # Only the process that finished stamped its end (the next resume's gap would start there); the killed had no chance.
    assert ["ended" in entry for entry in [record, *record["resumes"]]] == [False] * 4 + [True]
    # The run's clock spans its five processes and leaves out the gaps between them: the hour too. Read from
    # the run's own stamps (whole seconds: 1 s of slack, and 0.05 for the record's rounding to 0.1 s).
    gaps = [entry["idle_before_seconds"] for entry in record["resumes"]]
    assert all(gap >= 0 for gap in gaps) and gaps[-1] >= hour, gaps
    result = json.loads((output / "result.json").read_text())
    since_start = epoch(record["resumes"][-1]["ended"]) - epoch(record["started"])
    assert since_start > hour > result["run_seconds_with_heldout"]
    assert (result["total_seconds_with_heldout"] - 1 <= result["run_seconds_with_heldout"]
            <= since_start - sum(gaps) + 1.05)


def test_resume_errors_are_one_line_with_status_2_and_change_no_file(checkpoint, uninterrupted, tmp_path, capsys,
                                                                    monkeypatch):
    from lpes_harness.commands.search import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # main() sets it otherwise, for the rest of this process

    def refused(argv):
        """In this process: every refusal comes before the model loads."""
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1, err
        return err

    output = tmp_path / "copy"
    shutil.copytree(uninterrupted, output)
    before = {p.name: p.read_bytes() for p in output.iterdir()}
    resume_here = ["--resume", "--output", str(output)]
    assert "different settings: search.seed: saved 5, now 6" in refused([*resume_here, "--seed", "6"])
    assert "search.generations: saved 2, now 1 (it may only grow)" in refused([*resume_here, "--generations", "1"])
    assert "different settings: fitness.num_samples: saved 2, now 3" in refused([*resume_here, "--num-samples", "3"])
    assert "no run in" in refused(["--resume", "--output", str(tmp_path / "nothing")])
    assert "already holds a run: pass --resume" in refused([*search_flags(checkpoint), "--output", str(output)])
    assert {p.name: p.read_bytes() for p in output.iterdir()} == before

    # A run folder made before runs recorded their settings: one line that says to give its flags again ...
    record = json.loads((output / "config.json").read_text())
    old = {k: v for k, v in record.items() if k not in ("settings", "fingerprint")}
    (output / "config.json").write_text(json.dumps(old))
    err = refused(resume_here)
    assert "made before runs recorded their settings" in err and old["command"] in err
    # ... and with them given again it continues, and records them for the next --resume (the
    # held-out table's size is no part of the search: it may change, here to none).
    done = launch([GA, *search_flags(checkpoint), "--output", str(output), "--resume", "--heldout-samples", "0"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((output / "config.json").read_text())["settings"] == {**record["settings"], "heldout_samples": 0}
    assert lines(output / "history.jsonl") == lines(uninterrupted / "history.jsonl")


def test_a_paired_comparison_killed_mid_run_resumes_from_its_score_cache(checkpoint, uninterrupted, tmp_path):
    """``commands.paired`` on the uninterrupted search's curve and samples: killed after 7 of its 18
    blocks (vanilla, PI, LPES at 6 positions) and run again, it ends with the very scores and table
    that the search's own (uninterrupted) held-out stage made from the same code, samples and model."""
    output = tmp_path / "paired"
    command = ["-m", "lpes_harness.commands.paired", "--scales", str(uninterrupted / "scales.json"),
               "--pretrained", checkpoint, "--task", "kv_retrieval", "--metadata", '{"num_pairs": 3}',
               "--num-samples", "2", "--threads", "1", "--output", str(output)]
    killed = launch(command, kill="score-cache:7")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert_every_file_parses(output)
    assert len(json.loads((output / "scores.cache.json").read_text())["blocks"]) == 7
    done = launch(command)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = json.loads((uninterrupted / "scores.cache.json").read_text())
    assert json.loads((output / "scores.cache.json").read_text()) == expected
    table = json.loads((output / "heldout.json").read_text())
    reference = json.loads((uninterrupted / "heldout.json").read_text())
    assert table["table"] == reference["table"] and table["scored"]["scores"] == reference["scored"]["scores"]


def test_ctrl_c_says_in_one_line_what_is_kept_and_how_to_resume_with_status_130(tmp_path, monkeypatch, capsys):
    from lpes_harness.commands import search as run_module

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "run", interrupted)
    folder = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        run_module.main(["--output", str(folder)])
    assert stopped.value.code == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"interrupted; nothing was written to {folder}" in err, err
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # a run that had started: its record is written before the sweep
    with pytest.raises(SystemExit) as stopped:
        run_module.main(["--output", str(folder)])
    assert stopped.value.code == 130
    assert f"lpes-search --resume --output {folder} continues it" in capsys.readouterr().err
