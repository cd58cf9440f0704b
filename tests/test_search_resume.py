"""A search killed with SIGKILL and resumed re-evaluates nothing it finished and ends like an uninterrupted one.

The test runs this file as a script (a small search with a cheap synthetic fitness, checkpointing
after every individual), kills it with SIGKILL, resumes it, and compares with an uninterrupted run.
Every fresh evaluation is appended to ``evaluations.log`` so the test sees what was evaluated.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------- the script


def _script_main(workdir: str, kill_at: int, sleep: float, hold_at: int = 0) -> None:
    from lpes_harness.search import GeneticSearch, GenomeSpec, SearchConfig, cache_key
    from lpes_harness.search.callbacks import CheckpointCallback, HistoryCallback, load_checkpoint

    workdir = Path(workdir)
    log = workdir / "evaluations.log"
    evaluated_here = 0

    def evaluate(scales):
        nonlocal evaluated_here
        evaluated_here += 1
        if evaluated_here == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # dies in the middle of an evaluation
        if evaluated_here == hold_at:  # waits here for a kill from outside: the run cannot end before it
            time.sleep(300)
            raise SystemExit("held for a kill that never came")
        time.sleep(sleep)
        error = sum((s - (1.3 + 0.4 * math.sin(3.0 * i / len(scales)))) ** 2 for i, s in enumerate(scales))
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, (json.dumps(cache_key(scales)) + "\n").encode())
        os.close(fd)
        return -error, {"error": error}

    spec = GenomeSpec(num_layers=12, num_points=4)
    config = SearchConfig(population=8, parents=3, mutants=4, crossovers=1, generations=6, seed=3)
    checkpoint = workdir / "checkpoint.json"
    search = GeneticSearch(
        spec, evaluate, config, [HistoryCallback(workdir / "history.jsonl", workdir / "generations.jsonl"),
                                 CheckpointCallback(checkpoint)]
    )
    if checkpoint.exists():
        search.load_state_dict(load_checkpoint(checkpoint))
    result = search.run()
    (workdir / "result.json").write_text(json.dumps(result))


def _run_script(workdir, kill_at=0, sleep=0.0, wait=True, hold_at=0):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, __file__, str(workdir), str(kill_at), str(sleep), str(hold_at)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if wait:
        out, err = process.communicate(timeout=120)
        process.stdout_text, process.stderr_text = out, err
    return process


def _evaluations(workdir):
    path = Path(workdir) / "evaluations.log"
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []


def _history(workdir):
    lines = (Path(workdir) / "history.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    process = _run_script(workdir)
    assert process.returncode == 0, process.stderr_text
    return workdir


def _assert_resumed_run_matches(reference, workdir, finished_before, allowed_repeats=0):
    finished_after = _evaluations(workdir)[len(finished_before):]
    repeated = set(finished_before) & set(finished_after)
    assert len(repeated) <= allowed_repeats, repeated
    assert len(finished_before) + len(finished_after) - len(repeated) == len(_evaluations(reference))
    result = json.loads((workdir / "result.json").read_text())
    expected = json.loads((reference / "result.json").read_text())
    assert result["best"] == expected["best"]
    assert _history(workdir) == _history(reference)
    assert (workdir / "generations.jsonl").read_text() == (reference / "generations.jsonl").read_text()


@pytest.mark.parametrize("kill_at", [3, 12, 20])
def test_sigkill_mid_evaluation_then_resume(reference, tmp_path, kill_at):
    killed = _run_script(tmp_path, kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL
    finished_before = _evaluations(tmp_path)
    assert len(finished_before) == kill_at - 1
    assert not (tmp_path / "result.json").exists()

    resumed = _run_script(tmp_path)
    assert resumed.returncode == 0, resumed.stderr_text
    # Every evaluation finished before the kill was checkpointed: none is repeated.
    _assert_resumed_run_matches(reference, tmp_path, finished_before)


def test_sigkill_from_outside_at_an_arbitrary_moment_then_resume(reference, tmp_path):
    # The kill lands wherever the run is once 15 evaluations are logged (between an evaluation and its checkpoint,
    # maybe); the run holds at evaluation 25, one it needs, so that it cannot end first however slow this test is.
    hold_at = 25
    assert len(_evaluations(reference)) > hold_at
    process = _run_script(tmp_path, sleep=0.01, wait=False, hold_at=hold_at)
    deadline = time.monotonic() + 60
    while len(_evaluations(tmp_path)) < 15 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL, "the run ended before the kill"
    assert len(_evaluations(tmp_path)) >= 15
    finished_before = _evaluations(tmp_path)
    json.loads((tmp_path / "checkpoint.json").read_text())  # the checkpoint is never half-written

    resumed = _run_script(tmp_path)
    assert resumed.returncode == 0, resumed.stderr_text
    # The kill may land between an evaluation and its checkpoint: that one individual may run again.
    _assert_resumed_run_matches(reference, tmp_path, finished_before, allowed_repeats=1)


if __name__ == "__main__":
    _script_main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
