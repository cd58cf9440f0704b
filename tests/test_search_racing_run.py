"""``lpes-search --search-method racing`` end to end on a tiny model: the race's files, the later stages fed by
its candidates (uniform.json on its share of the forwards, the validation's finalists and the plain model), a
killed race resumed to the same result, --estimate, --status, and the flags' one-line refusals."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import save_tiny_checkpoint

from lpes_harness.search.line_racing import RacingConfig

GA = str(Path(__file__).resolve().parents[1] / "searches" / "ga.py")
DRAWS, SAMPLES, FIRST = 5, 4, 1
FORWARDS = RacingConfig(DRAWS, SAMPLES, FIRST).forwards()  # 6 on 1, 3 on 2, 2 on 4 samples: 6 + 3 + 4


def run(command):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def racing_args(checkpoint, output, *extra):
    return ["--pretrained", checkpoint, "--device", "cpu", "--dtype", "float32", "--fitness", "logprob",
            "--task", "needle", "--condition", 'six={"num_sentences": 6}', "--condition", 'ten={"num_sentences": 10}',
            "--scaling", "both", "--sweep", "none", "--initial-y", "1", "--num-samples", "2", "--chunk-size", "2",
            "--search-method", "racing", "--loss", "gold_logprob", "--racing-draws", str(DRAWS),
            "--racing-samples", str(SAMPLES), "--racing-first", str(FIRST), "--draw-sentences", "6:10",
            "--y-min", "0.5", "--y-max", "2", "--base-y-min", "0.5", "--base-y-max", "2",
            "--validation-samples", "1", "--select-top", "2", "--uniform-tuning", "--uniform-share", "0.5",
            "--heldout-samples", "0", "--no-progress", "--output", str(output), *extra]  # fmt: skip


@pytest.fixture(scope="module")
def racing_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("racing")
    checkpoint = save_tiny_checkpoint(folder / "model")
    output = folder / "run"
    done = run([sys.executable, GA, *racing_args(checkpoint, output)])
    assert done.returncode == 0, done.stderr[-3000:]
    return checkpoint, output, done.stdout


def scores_of(output):
    return [json.loads(line) for line in (output / "racing.jsonl").read_text().splitlines()]


def test_the_race_writes_its_candidates_scores_and_plot(racing_run):
    _, output, stdout = racing_run
    race = json.loads((output / "racing.json").read_text())
    assert race["candidates"][0] == [[1.0, 1.0], [1.0, 1.0]]  # the plain model races first
    assert len(race["candidates"]) == DRAWS + 1
    for ends in race["candidates"][1:]:  # each axis's line ends inside its bounds (0.5 to 2 here)
        assert all(0.5 <= v <= 2.0 for end in ends for v in end)
    scores = scores_of(output)
    assert len(scores) == FORWARDS and len({(s["candidate"], s["sample"]) for s in scores}) == FORWARDS
    assert (output / "racing.png").is_file()
    assert "cost estimate (racing lines" in stdout and "race won by candidate" in stdout


def test_the_later_stages_read_the_race(racing_run):
    _, output, stdout = racing_run
    result = json.loads((output / "result.json").read_text())
    assert result["forwards"]["search"] == FORWARDS and result["racing"]["forwards"] == FORWARDS
    uniform = json.loads((output / "uniform.json").read_text())
    assert uniform["tuning"]["budget"] == -(-FORWARDS // 2) and uniform["tuning"]["share"] == 0.5
    selection = json.loads((output / "selection.json").read_text())
    labels = [c["label"] for c in selection["candidates"]]
    finalists = {s["candidate"] for s in scores_of(output) if s["sample"] == SAMPLES - 1}
    assert "uniform position 1" in labels  # the plain model, the race's first candidate
    assert {f"LPES #{c}" for c in finalists if c} <= set(labels)  # the finalists that are curves
    scales = json.loads((output / "scales.json").read_text())
    assert scales["chosen_by"] == "validation split" and scales["label"] == selection["chosen"]


def test_a_killed_race_resumes_to_the_same_result(racing_run, tmp_path):
    _, output, _ = racing_run
    stopped = tmp_path / "stopped"
    shutil.copytree(output, stopped)
    for name in ("result.json", "selection.json", "uniform.json", "uniform_tuning.jsonl", "scales.json"):
        (stopped / name).unlink(missing_ok=True)
    shutil.rmtree(stopped / "validation", ignore_errors=True)
    journal = stopped / "racing.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:7]) + lines[7][:10])  # killed while writing the 8th score
    partial = run([sys.executable, GA, "--status", "--output", str(stopped)])
    assert partial.returncode == 0, partial.stderr[-3000:]
    assert f"racing: under way, 7 of {FORWARDS} forwards" in partial.stdout
    assert "lpes-search --resume --output" in partial.stdout
    again = run([sys.executable, GA, "--resume", "--output", str(stopped), "--no-progress"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(map(json.dumps, scores_of(stopped))) == sorted(map(json.dumps, scores_of(output)))
    first, resumed = (json.loads((o / "result.json").read_text()) for o in (output, stopped))
    assert resumed["racing"] == first["racing"] and resumed["selection"] == first["selection"]


def test_a_race_on_every_item_scores_each_prompts_needles_from_one_forward(tmp_path):
    from test_search_gradient import TINY_CHAT_TEMPLATE
    from tiny_models import tiny_tokenizer

    checkpoint = save_tiny_checkpoint(tmp_path / "model")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.save_pretrained(checkpoint)
    args = racing_args(checkpoint, tmp_path / "run", "--every-item", "--metadata", '{"num_needles": 3}')
    args[args.index("needle")] = "multi_needle"
    done = run([sys.executable, GA, *args])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"on {SAMPLES} samples ({3 * SAMPLES} questions: each prompt asked about every item" in done.stdout
    scores = scores_of(tmp_path / "run")
    assert len(scores) == FORWARDS  # one forward a prompt, whatever its questions
    assert {round(3 * s["right"], 6) for s in scores} <= {0.0, 1.0, 2.0, 3.0}  # the share of its 3 questions
    assert json.loads((tmp_path / "run" / "racing.json").read_text())["settings"]["every_item"] is True


def test_status_reads_the_race(racing_run):
    _, output, _ = racing_run
    done = run([sys.executable, GA, "--status", "--output", str(output)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"racing: done, {FORWARDS} of {FORWARDS} forwards, {DRAWS + 1} candidates scored" in done.stdout
    winner = json.loads((output / "result.json").read_text())["racing"]["winner"]
    mean = sum(winner["right"]) / len(winner["right"])  # the standings lead with the race's winner
    assert f"on {SAMPLES} samples (mean share of questions right): {winner['index']} {mean:.3f}" in done.stdout
    assert "finished: lm_eval --model lpes_hf" in done.stdout, done.stdout


def test_estimate_times_the_race_and_writes_nothing(racing_run, tmp_path):
    checkpoint, _, _ = racing_run
    output = tmp_path / "estimate"
    done = run([sys.executable, GA, *racing_args(checkpoint, output, "--estimate")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{DRAWS} line pairs and the plain model (6 on 1 -> 3 on 2 -> 2 on 4 samples), {FORWARDS} forwards" \
        in done.stdout
    assert not output.exists()


@pytest.mark.parametrize("flags, message", [
    (["--racing-draws", "0"], "need draws >= 1"),
    (["--racing-first", "9", "--racing-samples", "8"], "1 <= first <= samples"),
    (["--family", "per-layer"], "racing draws lines"),
    (["--brute-force"], "--brute-force is the GA's genome"),
    (["--task", "kv_retrieval"], "no num_sentences option"),
])
def test_bad_racing_flags_are_one_line_before_anything_loads(flags, message, tmp_path, capsys):
    from lpes_harness.commands.search_cli import parse_args

    with pytest.raises(SystemExit) as stop:
        parse_args(["--search-method", "racing", "--profile", "cpu", "--task", "multi_needle",
                    "--output", str(tmp_path / "x"), *flags])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0], error
