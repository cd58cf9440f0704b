"""``lpes-search --search-method gradient`` end to end on a tiny model: the gradient stage's files, the later
stages fed by its history (uniform.json on its share of the forwards, the validation's candidates), a resume,
--estimate, and the flags' one-line refusals."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import save_tiny_checkpoint

GA = str(Path(__file__).resolve().parents[1] / "searches" / "ga.py")
STEPS, SAMPLES = 3, 2
FORWARDS = STEPS * SAMPLES * 3  # a backward counts as two forwards


def run(command):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def gradient_args(checkpoint, output, *extra):
    return ["--pretrained", checkpoint, "--device", "cpu", "--dtype", "float32", "--fitness", "logprob",
            "--task", "needle", "--condition", 'six={"num_sentences": 6}', "--condition", 'ten={"num_sentences": 10}',
            "--scaling", "both", "--sweep", "none", "--initial-y", "1", "--num-samples", "2", "--chunk-size", "2",
            "--search-method", "gradient", "--family", "lines", "--loss", "gold_logprob", "--lr", "0.3",
            "--gradient-samples", str(SAMPLES), "--gradient-forwards", str(FORWARDS), "--draw-sentences", "6:10",
            "--validation-samples", "1", "--select-top", "2", "--uniform-tuning", "--uniform-share", "0.5",
            "--heldout-samples", "0", "--no-progress", "--output", str(output), *extra]  # fmt: skip


@pytest.fixture(scope="module")
def gradient_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gradient")
    checkpoint = save_tiny_checkpoint(folder / "model")
    output = folder / "run"
    done = run([sys.executable, GA, *gradient_args(checkpoint, output)])
    assert done.returncode == 0, done.stderr[-3000:]
    return checkpoint, output, done.stdout


def steps_of(output):
    return [json.loads(line) for line in (output / "gradient.jsonl").read_text().splitlines()]


def test_the_gradient_stage_writes_its_steps_state_and_plot(gradient_run):
    _, output, stdout = gradient_run
    steps = steps_of(output)
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert [s["forwards"] for s in steps] == [SAMPLES * 3 * (k + 1) for k in range(STEPS)]
    assert steps[0]["factors"] == [1.0] * 8  # the start: every line flat at --initial-y 1, the plain model
    assert steps[1]["factors"] != steps[0]["factors"]
    for step in steps:  # two straight lines over the tiny model's 4 layers, inside the default ranges
        for line, (low, high) in ((step["factors"][:4], (0.25, 4.0)), (step["factors"][4:], (0.5, 4.0))):
            gaps = [b - a for a, b in zip(line, line[1:])]
            assert max(gaps) - min(gaps) < 1e-5 and all(low - 1e-6 <= f <= high + 1e-6 for f in line)
    state = json.loads((output / "gradient_state.json").read_text())
    assert len(state["history"]) == STEPS and state["settings"]["family"] == "lines"
    assert (output / "gradient.png").is_file()
    assert "cost estimate (gradient search" in stdout and "lowest loss" in stdout


def test_the_later_stages_read_the_gradient_history(gradient_run):
    _, output, stdout = gradient_run
    result = json.loads((output / "result.json").read_text())
    assert result["forwards"]["search"] == FORWARDS
    uniform = json.loads((output / "uniform.json").read_text())
    assert uniform["tuning"]["budget"] == math.ceil(0.5 * FORWARDS) and uniform["tuning"]["share"] == 0.5
    assert "0.5 of the search's" in stdout
    selection = json.loads((output / "selection.json").read_text())
    labels = [c["label"] for c in selection["candidates"]]
    assert any(label.startswith("uniform") for label in labels)  # step 0, the start, is the plain model
    assert any(label.startswith("LPES #") for label in labels)  # and the lowest-loss steps
    lowest = min(steps_of(output), key=lambda s: s["loss"])
    if lowest["step"]:
        assert f"LPES #{lowest['step']}" in labels
    scales = json.loads((output / "scales.json").read_text())
    assert scales["chosen_by"] == "validation split" and scales["label"] == selection["chosen"]


def test_a_resume_of_a_finished_gradient_run_keeps_its_steps(gradient_run):
    checkpoint, output, _ = gradient_run
    before = steps_of(output)
    again = run([sys.executable, GA, "--resume", "--output", str(output), "--no-progress"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert steps_of(output) == before


def test_estimate_times_the_gradient_steps_and_writes_nothing(gradient_run, tmp_path):
    checkpoint, _, _ = gradient_run
    output = tmp_path / "estimate"
    done = run([sys.executable, GA, *gradient_args(checkpoint, output, "--estimate")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{STEPS} steps of {SAMPLES} samples" in done.stdout and "uniform.json" in done.stdout
    assert not output.exists()


@pytest.mark.parametrize("flags, message", [
    (["--draw-sentences", "300:60"], "need 1 <= LOW <= HIGH"),
    (["--draw-sentences", "sixty"], "give LOW:HIGH"),
    (["--draw-needles", "2:4", "--draw-sentences", "none"], "give both"),
    (["--lr", "0"], "need lr > 0"),
    (["--uniform-share", "2"], "0 < share <= 1"),
    (["--task", "kv_retrieval"], "no num_sentences option"),
])
def test_bad_gradient_flags_are_one_line_before_anything_loads(flags, message, tmp_path, capsys):
    from lpes_harness.commands.search_cli import parse_args

    with pytest.raises(SystemExit) as stop:
        parse_args(["--search-method", "gradient", "--profile", "cpu", "--task", "multi_needle",
                    "--output", str(tmp_path / "x"), *flags])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0], error


def test_status_reads_the_gradient_stage(gradient_run, tmp_path):
    import shutil

    _, output, _ = gradient_run
    done = run([sys.executable, GA, "--status", "--output", str(output)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"gradient search: done, step {STEPS} of {STEPS}, {FORWARDS} forwards" in done.stdout
    assert "finished: lm_eval --model lpes_hf" in done.stdout, done.stdout
    # A run stopped after its first step: under way, and --resume is what continues it.
    stopped = tmp_path / "stopped"
    shutil.copytree(output, stopped)
    for name in ("result.json", "selection.json", "uniform.json", "uniform_tuning.jsonl"):
        (stopped / name).unlink(missing_ok=True)
    journal = stopped / "gradient.jsonl"
    journal.write_text(journal.read_text().splitlines(keepends=True)[0])
    partial = run([sys.executable, GA, "--status", "--output", str(stopped)])
    assert partial.returncode == 0, partial.stderr[-3000:]
    assert f"gradient search: under way, step 1 of {STEPS}" in partial.stdout
    assert "lpes-search --resume --output" in partial.stdout
