"""`searches/ga.py` end to end on a tiny local checkpoint: outputs, resume after SIGKILL, accelerate."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import save_tiny_checkpoint

from lpes_harness.core.files import KILL_ENV
from lpes_harness.lmeval.lpes_lm import LPESLM

REPO = Path(__file__).resolve().parents[1]
GA = str(REPO / "searches" / "ga.py")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_ga"), "llama")


def ga_args(checkpoint, output, generations=2):
    # logprob fitness: a random tiny model never answers right, but its log-probs differ per genome.
    return [
        "--pretrained", checkpoint, "--device", "cpu", "--fitness", "logprob",
        "--task", "kv_retrieval", "--sweep", "none", "--heldout-samples", "0",
        "--metadata", '{"num_pairs": 3}', "--num-samples", "6", "--chunk-size", "2",
        "--population", "4", "--parents", "2", "--mutants", "1", "--crossovers", "1",
        "--generations", str(generations), "--no-progress", "--output", str(output),
    ]  # fmt: skip


def run(command, kill=None, **kwargs):
    """Run ``command`` offline; ``kill="POINT:N"``: it kills itself at that point (lpes_harness.core.files.kill_point)."""
    env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **({KILL_ENV: kill} if kill else {}))
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, **kwargs)


def history(output):
    return [json.loads(line) for line in (Path(output) / "history.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def single_run(checkpoint, tmp_path_factory):
    output = tmp_path_factory.mktemp("single") / "run"
    done = run([sys.executable, GA, *ga_args(checkpoint, output)])
    assert done.returncode == 0, done.stderr[-3000:]
    return output, done.stdout


def test_a_search_writes_every_output_and_lpes_hf_reads_its_scales(single_run, checkpoint):
    output, stdout = single_run
    for name in ("scales.json", "config.json", "history.jsonl", "generations.jsonl", "curve.png", "fitness.png",
                 "checkpoint.json", "result.json"):
        assert (output / name).is_file(), name
    assert "cost estimate:" in stdout
    records = history(output)
    result = json.loads((output / "result.json").read_text())
    assert len(records) == result["processed"]
    assert {"genome", "scales", "fitness", "info", "seconds"} <= set(records[0])
    assert set(records[0]["info"]["scores"]) == {"begin", "middle", "end"}
    saved = json.loads((output / "scales.json").read_text())
    assert saved["fitness"] == max(r["fitness"] for r in records)
    assert saved["control_points"] == result["best"]["genome"]
    lm = LPESLM(pretrained=checkpoint, scales=str(output / "scales.json"), device="cpu")
    assert lm.scales == pytest.approx(result["best"]["scales"])
    config = json.loads((output / "config.json").read_text())
    assert config["search"]["population"] == 4 and "searches/ga.py" in config["command"]
    # The precision is recorded where the scales go (auto is float32 on a CPU without native bfloat16 ...
    assert config["model"]["dtype"] == saved["dtype"] and config["model"]["dtype_requested"] == "auto"
    assert saved["dtype"] in ("float32", "bfloat16")  # ... and bfloat16 where it is native)
    from lpes_harness.core.models import machine_description

    assert config["model"]["machine"] == machine_description("cpu")  # what the run's timings come from


def test_an_existing_run_is_not_overwritten_by_accident(single_run, checkpoint):
    output, _ = single_run
    done = run([sys.executable, GA, *ga_args(checkpoint, output)])
    assert done.returncode != 0 and "pass --resume" in done.stderr


def test_resume_after_sigkill_reaches_the_same_result(single_run, checkpoint, tmp_path):
    output = tmp_path / "killed"
    # SIGKILL once the 4th individual is journalled, from inside (the test hook of lpes_harness.core.files):
    # a kill from outside raced the run, which could end first on a fast machine.
    killed = run([sys.executable, GA, *ga_args(checkpoint, output)], kill="individual:4")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (output / "result.json").exists()
    finished = len(history(output))
    assert finished == 4  # the checkpoint journals last: history.jsonl holds the four it journalled
    done = run([sys.executable, GA, *ga_args(checkpoint, output), "--resume"])
    assert done.returncode == 0, done.stderr[-3000:]
    uninterrupted = history(single_run[0])
    resumed = history(output)
    assert [r["fitness"] for r in resumed] == [r["fitness"] for r in uninterrupted]
    assert [r["genome"] for r in resumed] == [r["genome"] for r in uninterrupted]
    # Individuals finished before the kill come from the checkpoint's cache, not a new evaluation.
    evaluated_after_resume = json.loads((output / "result.json").read_text())["fitness_evaluations"]
    evaluated_in_total = sum(not r["cached"] for r in uninterrupted)
    assert evaluated_after_resume <= evaluated_in_total - (finished - 1)


def two_processes(args):
    """``searches/ga.py ARGS`` as two ranks under ``accelerate launch``, offline.

    Two CPU ranks on gloo, also on a machine with a GPU: with a GPU visible, accelerate would
    start two NCCL ranks on it, which NCCL refuses on a single device ("invalid usage")."""
    launch = [str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([*launch, GA, *args], capture_output=True, text=True, env=env, timeout=600)


def test_two_accelerate_processes_give_the_single_process_result(single_run, checkpoint, tmp_path):
    output = tmp_path / "two_procs"
    done = two_processes(ga_args(checkpoint, output))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((output / "config.json").read_text())["processes"] == 2
    assert [r["fitness"] for r in history(output)] == [r["fitness"] for r in history(single_run[0])]


def test_two_processes_tune_the_uniform_factor_after_the_search_alone(checkpoint, tmp_path):
    # After the GA the other rank has left; rank 0 scores the uniform factors on every sample by itself
    output = tmp_path / "two_procs_uniform"
    done = two_processes([*ga_args(checkpoint, output, generations=1), "--uniform-tuning"])
    assert done.returncode == 0, done.stderr[-3000:]
    tuning = [json.loads(line) for line in (output / "uniform_tuning.jsonl").read_text().splitlines()]
    assert tuning and (output / "uniform.json").is_file()


def test_resume_with_other_settings_fails_and_changes_no_file(single_run, checkpoint, tmp_path):
    import shutil

    output = tmp_path / "copy"
    shutil.copytree(single_run[0], output)
    before = {p.name: p.read_bytes() for p in output.iterdir()}
    args = ga_args(checkpoint, output)
    args[args.index("--mutants") + 1] = "2"  # a different GA than the checkpoint's
    args[args.index("--population") + 1] = "5"
    done = run([sys.executable, GA, *args, "--resume"])
    assert done.returncode != 0 and "different settings" in done.stderr and "Traceback" not in done.stderr
    assert {p.name: p.read_bytes() for p in output.iterdir()} == before


@pytest.mark.parametrize("flag, value, field", [
    ("--task", "needle", "fitness.task"),
    ("--num-samples", "4", "fitness.num_samples"),
    ("--dtype", "float16", "model.dtype"),  # neither float32 nor bfloat16: auto picks one of them, by CPU
    ("--initial", "random", "search.initial"),
])  # fmt: skip
def test_resume_with_another_experiment_is_refused_naming_the_field(single_run, checkpoint, tmp_path, flag, value, field):
    import shutil

    output = tmp_path / "copy"
    shutil.copytree(single_run[0], output)
    before = {p.name: p.read_bytes() for p in output.iterdir()}
    args = ga_args(checkpoint, output)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    done = run([sys.executable, GA, *args, "--resume"])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"different settings: {field}: saved" in done.stderr
    assert {p.name: p.read_bytes() for p in output.iterdir()} == before


def test_a_resume_with_dtype_auto_keeps_the_dtype_the_run_was_made_in():
    from lpes_harness.core.models import auto_dtype
    from lpes_harness.search.run_start import run_dtype

    other = "bfloat16" if auto_dtype("cpu")[0] == "float32" else "float32"  # what this CPU's auto would not pick
    assert run_dtype("auto", "cpu", {"model": {"dtype": other}})[0] == other
    assert run_dtype("auto", "cpu", None)[0] == auto_dtype("cpu")[0]  # a new run: auto decides by CPU kind
    assert run_dtype("float32", "cpu", {"model": {"dtype": "bfloat16"}})[0] == "float32"  # asked by name: as asked


def test_a_run_made_in_another_dtype_resumes_under_auto_on_this_cpu(single_run, checkpoint, tmp_path):
    # A run made where auto picked the other dtype (another CPU kind, a GPU): a resume here with the run's
    # own --dtype auto continues it in that dtype instead of refusing it ("model.dtype: saved ...").
    import shutil

    from lpes_harness.core.models import auto_dtype

    other = "bfloat16" if auto_dtype("cpu")[0] == "float32" else "float32"
    output = tmp_path / "moved"
    shutil.copytree(single_run[0], output)
    for name, path in (("config.json", ("model",)), ("config.json", ("fingerprint", "model")),
                       ("checkpoint.json", ("fingerprint", "model"))):
        record = json.loads((output / name).read_text())
        section = record
        for key in path:
            section = section[key]
        section["dtype"] = other
        (output / name).write_text(json.dumps(record))
    done = run([sys.executable, GA, "--resume", "--output", str(output), "--no-progress"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"model dtype {other} (--dtype auto: the dtype the resumed run was made in)" in done.stdout
    assert json.loads((output / "config.json").read_text())["model"]["dtype"] == other


def test_a_random_search_is_the_start_and_random_draws_each_raced_against_the_best(checkpoint, tmp_path):
    output = tmp_path / "random"
    args = ga_args(checkpoint, output, generations=0)
    for flag, value in (("--population", "5"), ("--parents", "1"), ("--mutants", "4"), ("--crossovers", "0")):
        args[args.index(flag) + 1] = value
    done = run([sys.executable, GA, *args, "--initial", "random"])
    assert done.returncode == 0, done.stderr[-3000:]
    records = history(output)
    assert [r["origin"] for r in records] == ["initial"] + ["random"] * 4
    assert json.loads((output / "config.json").read_text())["search"]["initial"] == "random"


def test_sweep_starts_the_search_and_the_best_curve_is_compared_on_heldout_samples(checkpoint, tmp_path):
    output = tmp_path / "swept"
    args = ga_args(checkpoint, output, generations=1)
    args[args.index("--sweep") + 1] = "1,0.5"
    args[args.index("--heldout-samples") + 1] = "3"
    done = run([sys.executable, GA, *args])
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = json.loads((output / "sweep.json").read_text())
    assert sorted(p["scale"] for p in sweep["points"]) == [0.5, 1.0]
    first = history(output)[0]
    assert {y for _, y in first["genome"]} == {sweep["best"]}  # the start is the best uniform scale
    table = json.loads((output / "heldout.json").read_text())["table"]
    assert {"vanilla", "PI", "LPES"} <= set(table["rows"])
    assert table["rows"]["LPES"]["average"]["n"] == 3 * 6  # 3 samples at each of kv_retrieval's 6 positions
    assert "p" in table["rows"]["PI"]["average"] and (output / "heldout.png").is_file()
    assert "vs vanilla" in done.stdout
    # The held-out scores are cached as the paired command caches them: it reuses them, scoring nothing.
    cache = json.loads((output / "scores.cache.json").read_text())
    assert len(cache["blocks"]) == len(table["rows"]) * 6 and all(len(b) == 3 for b in cache["blocks"].values())
    lpes_at_0 = json.dumps([round(s, 6) for s in json.loads((output / "heldout.json").read_text())["scored"]["methods"]["LPES"]]) + "@0"
    cache["blocks"][lpes_at_0] = [1.0, 1.0, 1.0]  # planted (the random model scores 0): read back, not re-scored
    (output / "scores.cache.json").write_text(json.dumps(cache))
    again = run([sys.executable, "-m", "lpes_harness.commands.paired", "--scales", str(output / "scales.json"),
                 "--pretrained", checkpoint, "--task", "kv_retrieval", "--metadata", '{"num_pairs": 3}',
                 "--num-samples", "3", "--output", str(output)])
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((output / "scores.cache.json").read_text())["blocks"] == cache["blocks"]
    assert json.loads((output / "heldout.json").read_text())["table"]["rows"]["LPES"]["0"]["accuracy"] == 1.0
    # --resume of a finished search redoes only the held-out stage, from the same cache.
    (output / "heldout.json").unlink()
    resumed = run([sys.executable, GA, *args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((output / "heldout.json").read_text())["table"]["rows"]["LPES"]["0"]["accuracy"] == 1.0


def test_a_run_that_chose_the_plain_model_scores_no_table_of_vanilla_against_itself(checkpoint, tmp_path):
    # Greedy answers of a random tiny model are all wrong: every individual ties with the start, uniform 1.
    output = tmp_path / "plain"
    args = ga_args(checkpoint, output, generations=1)
    args[args.index("--fitness") + 1] = "greedy"
    args[args.index("--sweep") + 1] = "1"
    args[args.index("--heldout-samples") + 1] = "2"
    done = run([sys.executable, GA, *args])
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((output / "scales.json").read_text())["scales"] == [1.0] * 4
    assert "no held-out table: the run's choice is uniform 1" in done.stdout and "held-out: vanilla" not in done.stdout
    assert "heldout" not in json.loads((output / "result.json").read_text()) and not (output / "heldout.json").exists()


def test_held_out_scores_of_another_model_stop_the_search_before_it_starts(checkpoint, tmp_path):
    """Not an hour later at the held-out table: before anything loads or is written."""
    output = tmp_path / "stale"
    output.mkdir()
    stale = {"identity": {"task": "kv_retrieval", "split": "heldout", "dtype": "float16"}, "blocks": {}, "fingerprints": {}}
    (output / "scores.cache.json").write_text(json.dumps(stale))
    args = ga_args(checkpoint, output, generations=1)
    args[args.index("--heldout-samples") + 1] = "2"
    done = run([sys.executable, GA, *args])
    assert done.returncode != 0 and "scores.cache.json holds scores of other samples or another model" in done.stderr
    assert "Traceback" not in done.stderr and sorted(p.name for p in output.iterdir()) == ["scores.cache.json"]
    # --overwrite starts afresh: the old scores go, and the new run's table is made and cached.
    done = run([sys.executable, GA, *args, "--overwrite"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((output / "scores.cache.json").read_text())["identity"]["task"] == "kv_retrieval"
    assert json.loads((output / "scores.cache.json").read_text())["identity"].get("dtype") != "float16"
    assert (output / "heldout.json").is_file()
