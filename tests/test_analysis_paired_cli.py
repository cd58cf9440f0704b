"""`python -m lpes_harness.commands.paired`: several searches on one sample set, resumable, on a tiny checkpoint."""

import json
import os
import subprocess
import sys

import pytest
from tiny_models import save_tiny_checkpoint

from lpes_harness.evaluation.paired import several_lpes_methods
from lpes_harness.evaluation.score_cache import ScoreCache
from lpes_harness.commands import paired as paired_command
from lpes_harness.methods.setup import MethodSetup


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_paired"), "llama")


def factors(rows):
    """Each row's factors by name: every row of these tables is a set-up of the loaded lpes_hf."""
    assert all(isinstance(setup, MethodSetup) and setup.is_scaled for setup in rows.values())
    return {name: list(setup.scales) for name, setup in rows.items()}


VANILLA = {"vanilla": MethodSetup.of_scales([1.0] * 4)}  # the tiny checkpoint's plain model


def paired(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    command = [sys.executable, "-m", "lpes_harness.commands.paired", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def common(checkpoint, output):
    return ["--pretrained", checkpoint, "--task", "kv_retrieval", "--metadata", '{"num_pairs": 3}',
            "--num-samples", "2", "--threads", "1", "--output", str(output)]  # fmt: skip


def test_several_curves_get_their_own_rows_after_vanilla():
    methods = factors(several_lpes_methods({"a": [1.0, 2.0], "b": [0.5, 0.7]}))
    assert list(methods) == ["vanilla", "PI a", "LPES a", "PI b", "LPES b"]
    assert methods["PI a"] == [1.5, 1.5] and methods["vanilla"] == [1.0, 1.0]
    assert list(several_lpes_methods({"a": [1.0, 2.0], "b": [0.5, 0.7]}, with_pi=False)) == ["vanilla", "LPES a", "LPES b"]
    assert list(several_lpes_methods({"only": [1.0, 2.0]})) == ["vanilla", "PI", "LPES"]  # one curve: the usual rows
    with pytest.raises(ValueError, match="different numbers of layers"):
        several_lpes_methods({"a": [1.0, 2.0], "b": [1.0]})


def test_a_uniform_curve_is_named_pi_not_lpes():
    """A search whose best was its uniform start is PI: every table names that row for what it holds."""
    assert list(several_lpes_methods({"demo": [0.8] * 4, "reference": [1.0, 2.0, 1.5, 1.0]}, with_pi=False)) == [
        "vanilla", "uniform 0.8 (PI) demo", "LPES reference"]
    assert list(several_lpes_methods({"LPES": [0.8] * 4})) == ["vanilla", "uniform 0.8 (PI)"]
    assert list(several_lpes_methods({"b": [0.8] * 4 + [2.0] * 4}, scaling="both")) == ["vanilla", "uniform 0.8:2 (PI) b"]
    assert "LPES held" in several_lpes_methods({"held": [1.0, 0.8, 0.8, 1.2]}, with_pi=False)  # not uniform


def test_cache_refuses_scores_of_other_samples(tmp_path):
    docs = [{"prompt": f"sample {i}"} for i in range(3)]
    cache = ScoreCache(tmp_path / "c.json", {"task": "t", "num_samples": 2})
    cache.put([1.0, 1.0], 50, docs[:2], [1.0, 0.0])
    again = ScoreCache(tmp_path / "c.json", {"task": "t", "num_samples": 3})  # more samples: the same cache
    assert again.get([1.0, 1.0000000001], 50, docs) == [1.0, 0.0] and again.get([1.0, 1.0], 0, docs) == []
    assert again.get([1.0, 1.0], 50, docs[:1]) == [1.0]
    with pytest.raises(ValueError, match="sample 1 at 50 % is not the sample"):
        again.get([1.0, 1.0], 50, [docs[0], {"prompt": "changed"}])
    with pytest.raises(ValueError, match="other samples"):
        ScoreCache(tmp_path / "c.json", {"task": "another task"})


def test_a_larger_run_scores_only_the_new_samples(checkpoint, tmp_path):
    scales = tmp_path / "s.json"
    scales.write_text(json.dumps([1.0, 1.5, 2.0, 2.0]))
    output = tmp_path / "out"
    done = paired("--scales", str(scales), "--no-pi", *common(checkpoint, output))
    assert done.returncode == 0, done.stderr[-3000:]
    cache = json.loads((output / "scores.cache.json").read_text())
    key = ScoreCache.key([1.0] * 4, 0)
    cache["blocks"][key] = [1.0, 1.0]  # planted (the random model scores 0): kept, not re-scored
    (output / "scores.cache.json").write_text(json.dumps(cache))

    larger = [a if a != "2" else "3" for a in common(checkpoint, output)]
    done = paired("--scales", str(scales), "--no-pi", *larger)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((output / "heldout.json").read_text())
    assert saved["scored"]["scores"]["vanilla"]["0"] == [1.0, 1.0, 0.0]
    assert saved["table"]["rows"]["vanilla"]["0"]["n"] == 3
    cache = json.loads((output / "scores.cache.json").read_text())
    assert all(len(block) == 3 for block in cache["blocks"].values())
    assert all(len(prints) == 3 for prints in cache["fingerprints"].values())


def test_a_second_run_reuses_scored_blocks_and_adds_methods(checkpoint, tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps([1.0, 1.5, 2.0, 2.0]))
    second.write_text(json.dumps([0.5, 0.5, 1.0, 1.0]))
    output = tmp_path / "out"
    done = paired("--scales", f"first={first}", "--no-pi", *common(checkpoint, output))
    assert done.returncode == 0, done.stderr[-3000:]
    cache = json.loads((output / "scores.cache.json").read_text())
    assert len(cache["blocks"]) == 2 * 6  # vanilla and one curve, at kv_retrieval's 6 positions
    # Plant a vanilla block no model would produce here (the random model scores 0): a rerun must read it.
    key = ScoreCache.key([1.0] * 4, 0)
    cache["blocks"][key] = [1.0, 1.0]
    (output / "scores.cache.json").write_text(json.dumps(cache))

    done = paired("--scales", f"first={first}", "--scales", f"second={second}", "--no-pi", *common(checkpoint, output))
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((output / "heldout.json").read_text())
    assert list(saved["table"]["rows"]) == ["vanilla", "LPES first", "LPES second"]
    assert saved["scored"]["scores"]["vanilla"]["0"] == [1.0, 1.0]
    assert len(json.loads((output / "scores.cache.json").read_text())["blocks"]) == 3 * 6


def test_merge_takes_longer_blocks_of_the_same_samples_and_refuses_others(tmp_path):
    docs = [{"prompt": f"sample {i}"} for i in range(3)]
    theirs = ScoreCache(tmp_path / "theirs" / "scores.cache.json", {"task": "t"})
    theirs.put([1.0, 1.0], 50, docs, [1.0, 0.0, 1.0])
    theirs.put([0.5, 0.5], 50, docs[:1], [0.0])
    mine = ScoreCache(tmp_path / "mine" / "scores.cache.json", {"task": "t", "num_samples": 3})
    mine.put([0.5, 0.5], 50, docs[:2], [1.0, 1.0])  # longer than theirs: kept
    assert mine.merge(tmp_path / "theirs") == 1  # a directory names its scores.cache.json
    again = ScoreCache(tmp_path / "mine" / "scores.cache.json", {"task": "t"})  # the merge was saved
    assert again.get([1.0, 1.0], 50, docs) == [1.0, 0.0, 1.0] and again.get([0.5, 0.5], 50, docs) == [1.0, 1.0]

    other = ScoreCache(tmp_path / "other.json", {"task": "t"})
    other.put([2.0, 2.0], 50, [docs[0], {"prompt": "changed"}], [1.0, 1.0])
    before = (tmp_path / "mine" / "scores.cache.json").read_bytes()
    with pytest.raises(ValueError, match="sample 1 at 50 % is not the sample"):
        again.merge(tmp_path / "other.json")
    ScoreCache(tmp_path / "another.json", {"task": "another"}).put([1.0, 1.0], 0, None, [0.0])
    with pytest.raises(ValueError, match="other samples or another model"):
        again.merge(tmp_path / "another.json")
    assert (tmp_path / "mine" / "scores.cache.json").read_bytes() == before
    assert again.get([2.0, 2.0], 50) == []


def test_a_cache_of_another_scaling_gives_only_the_plain_model_and_baselines(tmp_path):
    """A base run reuses a position cache's vanilla and baselines (the same models under any scaling),
    never its curves (position factors, another model than the same numbers as base factors)."""
    docs = [{"prompt": f"sample {i}"} for i in range(2)]
    position = ScoreCache(tmp_path / "position.json", {"task": "t"})
    position.put([1.0, 1.0], 0, docs, [1.0, 0.0])
    position.put([0.8, 0.8], 0, docs, [1.0, 1.0])
    position.put("mspoe_hf:min_ratio=1.2", 0, docs, [0.0, 1.0])
    base = ScoreCache(tmp_path / "base" / "scores.cache.json", {"task": "t", "scaling": "base"})
    assert base.merge(tmp_path / "position.json") == 2
    assert base.get([1.0, 1.0], 0, docs) == [1.0, 0.0] and base.get("mspoe_hf:min_ratio=1.2", 0, docs) == [0.0, 1.0]
    assert base.get([0.8, 0.8], 0) == []
    ScoreCache(tmp_path / "other.json", {"task": "other", "scaling": "base"}).put([1.0, 1.0], 0, None, [0.0])
    with pytest.raises(ValueError, match="other samples or another model"):
        base.merge(tmp_path / "other.json")


def test_reuse_scores_takes_another_runs_blocks_instead_of_scoring(checkpoint, tmp_path):
    scales = tmp_path / "s.json"
    scales.write_text(json.dumps([1.0, 1.5, 2.0, 2.0]))
    done = paired("--scales", str(scales), "--no-pi", *common(checkpoint, tmp_path / "first"))
    assert done.returncode == 0, done.stderr[-3000:]
    cache = json.loads((tmp_path / "first" / "scores.cache.json").read_text())
    cache["blocks"][ScoreCache.key([1.0] * 4, 0)] = [1.0, 1.0]  # planted: the random model scores 0 here
    (tmp_path / "first" / "scores.cache.json").write_text(json.dumps(cache))

    done = paired("--scales", str(scales), "--no-pi", "--reuse-scores", str(tmp_path / "first"),
                  *common(checkpoint, tmp_path / "second"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reused 12 scored blocks" in done.stdout
    saved = json.loads((tmp_path / "second" / "heldout.json").read_text())
    assert saved["scored"]["scores"]["vanilla"]["0"] == [1.0, 1.0]

    refused = paired("--scales", str(scales), "--reuse-scores", str(tmp_path / "first"),
                     "--dtype", "float16", *common(checkpoint, tmp_path / "third"))
    assert refused.returncode == 2 and "other samples or another model" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "third").exists()


def test_other_samples_in_the_output_are_refused_before_the_model_loads(checkpoint, tmp_path):
    scales = tmp_path / "s.json"
    scales.write_text(json.dumps([1.0, 1.5, 2.0, 2.0]))
    output = tmp_path / "out"
    ScoreCache(output / "scores.cache.json", {"task": "something else"}).put([1.0] * 4, 0, None, [0.0])
    done = paired("--scales", str(scales), *common(checkpoint, output))
    assert done.returncode == 2 and "other samples" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in output.iterdir()) == ["scores.cache.json"]


def test_unknown_task_is_named(tmp_path):
    scales = tmp_path / "s.json"
    scales.write_text(json.dumps([1.0, 1.5]))
    done = paired("--scales", str(scales), "--task", "no_such_task", "--output", str(tmp_path / "out"))
    assert done.returncode == 2 and "unknown position task 'no_such_task'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_baseline_model_is_scored_on_the_same_prompts_as_vanilla(checkpoint):
    """lm-eval's own ``hf`` model is vanilla: through the baseline path (lm-eval loglikelihood) it must
    give vanilla's per-sample scores, read through lpes_hf's shared-prefix scorer. Log-probabilities,
    not 0/1, so that a random model's all-zero accuracy cannot make the comparison pass."""
    from lpes_harness.evaluation.baseline_rows import load_baseline_lm
    from lpes_harness.evaluation.paired import score_methods
    from lpes_harness.lmeval.lpes_lm import LPESLM

    lm = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32")
    loaded = []

    def load(baseline):
        loaded.append(baseline.spec)
        return load_baseline_lm(baseline, checkpoint, "float32")

    reported = []
    scored = score_methods(lm, "kv_retrieval", {**VANILLA, "hf again": MethodSetup("hf", "device=cpu")}, num_samples=2,
                           metadata={"num_pairs": 3}, mode="logprob", load_baseline=load,
                           progress=lambda name, percent, count: reported.append((name, percent, count)))
    assert loaded == ["hf:device=cpu"] and list(scored["scores"]) == ["vanilla", "hf again"]
    # The bar counts samples: none cached at any position, then both at every position (scored together,
    # as a sample's prompts at the six positions share their text), baselines included.
    positions = [0, 20, 40, 60, 80, 100]
    assert reported == [(name, p, count) for name in ("vanilla", "hf again") for count in (0, 2) for p in positions]
    assert scored["methods"]["hf again"] == "hf:device=cpu"
    vanilla, again = scored["scores"]["vanilla"], scored["scores"]["hf again"]
    values = [v for p in vanilla for v in vanilla[p]]
    assert len(set(values)) > 1 and all(v > -1e9 for v in values)
    for percent in vanilla:
        assert again[percent] == pytest.approx(vanilla[percent], abs=1e-4)


def test_baselines_get_rows_and_cached_blocks(checkpoint, tmp_path):
    scales = tmp_path / "s.json"
    scales.write_text(json.dumps([1.0, 1.5, 2.0, 2.0]))
    output = tmp_path / "out"
    done = paired("--scales", str(scales), "--no-pi", "--baseline", "Ms-PoE rank=mspoe_hf:head_mapping=rank",
                  *common(checkpoint, output))
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((output / "heldout.json").read_text())
    assert list(saved["table"]["rows"]) == ["vanilla", "LPES", "Ms-PoE rank"]
    assert saved["scored"]["methods"]["Ms-PoE rank"] == "mspoe_hf:head_mapping=rank"
    cache = json.loads((output / "scores.cache.json").read_text())
    key = ScoreCache.key("mspoe_hf:head_mapping=rank", 0)
    assert key in cache["blocks"] and len(cache["blocks"]) == 3 * 6
    # A complete cached baseline is read, not re-scored: a planted block shows up in the table.
    for percent in (0, 20, 40, 60, 80, 100):
        cache["blocks"][ScoreCache.key("mspoe_hf:head_mapping=rank", percent)] = [1.0, 1.0]
    (output / "scores.cache.json").write_text(json.dumps(cache))
    done = paired("--scales", str(scales), "--no-pi", "--baseline", "Ms-PoE rank=mspoe_hf:head_mapping=rank",
                  *common(checkpoint, output))
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((output / "heldout.json").read_text())
    assert saved["table"]["rows"]["Ms-PoE rank"]["average"]["accuracy"] == 1.0


@pytest.mark.parametrize("baseline, message", [
    ("x=no_such_model", "'no_such_model' is not a registered lm-eval model"),
    ("lpes_hf:scales=1.2", "give lpes_hf scales with --scales"),
])
def test_a_bad_baseline_is_named_before_anything_loads(tmp_path, baseline, message):
    scales = tmp_path / "s.json"
    scales.write_text(json.dumps([1.0, 1.5]))
    done = paired("--scales", str(scales), "--baseline", baseline, "--output", str(tmp_path / "out"))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_killed_run_keeps_every_finished_chunk(checkpoint, tmp_path, monkeypatch):
    """Scores reach the cache every CHUNK samples (the same samples at every position), not once per
    position: a killed run resumes from its last chunk, and scores nothing twice."""
    from lpes_harness.evaluation import paired as module
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.lmeval.position_scorer import PositionScorer

    monkeypatch.setattr(module, "CHUNK", 12)  # 6 positions: 2 samples of each a chunk
    asked = []
    real_scores = PositionScorer.scores_at

    def scores_at(self, requests):
        if len(asked) == 2:
            raise KeyboardInterrupt  # the third chunk: the user stops the run
        asked.append({p: list(indices) for p, indices in requests.items()})
        return real_scores(self, requests)

    monkeypatch.setattr(PositionScorer, "scores_at", scores_at)
    lm = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32")
    cache = ScoreCache(tmp_path / "c.json", {"task": "kv_retrieval"})
    run = dict(num_samples=5, metadata={"num_pairs": 3}, mode="logprob", cache=cache)
    with pytest.raises(KeyboardInterrupt):
        module.score_methods(lm, "kv_retrieval", VANILLA, **run)
    positions = [0, 20, 40, 60, 80, 100]
    assert asked == [{p: [0, 1] for p in positions}, {p: [2, 3] for p in positions}]
    kept = {p: ScoreCache(tmp_path / "c.json", {"task": "kv_retrieval"}).get([1.0] * 4, p) for p in positions}
    assert all(len(scores) == 4 for scores in kept.values())

    asked.clear()
    monkeypatch.setattr(PositionScorer, "scores_at", lambda self, requests: asked.append(dict(requests))
                        or real_scores(self, requests))
    again = ScoreCache(tmp_path / "c.json", {"task": "kv_retrieval"})
    scored = module.score_methods(lm, "kv_retrieval", VANILLA, **{**run, "cache": again})
    assert asked == [{p: [4] for p in positions}]  # only the fifth sample, at every position
    for p in positions:
        assert scored["scores"]["vanilla"][p][:4] == kept[p] and len(scored["scores"]["vanilla"][p]) == 5


def test_auto_dtype_is_resolved_before_it_keys_the_score_cache(monkeypatch):
    import lpes_harness.core.models as models
    from lpes_harness.evaluation.paired import run_dtype

    monkeypatch.setattr(models, "default_device", lambda: "cpu")
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda cpuinfo=None: True)
    monkeypatch.setattr(models, "cpu_bf16_speedup", lambda: 2.0)
    assert run_dtype("auto", {}) == "bfloat16"
    assert run_dtype(None, {"dtype": "auto"}) == "bfloat16"
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda cpuinfo=None: False)
    assert run_dtype("auto", {}) == "float32"
    assert run_dtype(None, {"dtype": "float16"}) == "float16" and run_dtype(None, [1.0]) == "float32"
    with pytest.raises(ValueError, match="not one of"):
        run_dtype("fp8", {})


def test_the_sample_bar_still_reports_into_a_log_file(capsys):
    """tqdm's default goes silent when stderr is not a terminal; a run sent to a log file (nohup,
    setsid) would then print nothing for an hour. The bar reports there, and --no-progress silences it."""
    from lpes_harness.evaluation.paired import sample_bar

    with sample_bar(3) as progress:
        progress("LPES", 50, 3)
    assert "3/3" in capsys.readouterr().err
    with sample_bar(3, disable=True) as progress:
        progress("LPES", 50, 3)
    assert capsys.readouterr().err == ""


def test_curves_of_different_scalings_share_one_run_and_one_cache(checkpoint, tmp_path):
    """A position curve and a both curve: scored on one both model, the position curve as itself with base
    factors 1 (bit for bit its own scaling), keyed as itself, so a position-only run's scores are reused."""
    from lpes_harness.core.scales_file import write_scales_file

    position, both = tmp_path / "position.json", tmp_path / "both.json"
    write_scales_file(position, [1.0, 1.5, 2.0, 2.0])
    write_scales_file(both, [1.0, 1.0, 1.5, 1.5, 2.0, 2.0, 1.0, 1.0], scaling="both")
    output = tmp_path / "out"
    alone = paired("--scales", f"p={position}", "--no-pi", *common(checkpoint, output))
    assert alone.returncode == 0, alone.stderr[-3000:]
    first = json.loads((output / "heldout.json").read_text())["scored"]["scores"]
    together = paired("--scales", f"p={position}", "--scales", f"b={both}", "--no-pi", *common(checkpoint, output))
    assert together.returncode == 0, together.stderr[-3000:]
    scored = json.loads((output / "heldout.json").read_text())["scored"]
    assert scored["scaling"] == "both" and scored["scores"]["LPES p"] == first["LPES p"]
    assert scored["scores"]["vanilla"] == first["vanilla"]
    cache = json.loads((output / "scores.cache.json").read_text())
    assert "scaling" not in cache["identity"]  # the position run's cache, extended
    assert any(json.loads(key.rpartition("@")[0]) == [1.0, 1.0, 1.5, 1.5, 2.0, 2.0, 1.0, 1.0] for key in cache["blocks"])
    assert not any(len(json.loads(key.rpartition("@")[0])) == 8 and json.loads(key.rpartition("@")[0])[4:] == [1.0] * 4
                   for key in cache["blocks"])  # a both curve with base factors 1 is keyed as its position curve


def test_batched_rows_score_as_one_prompt_a_forward_and_cache_whole_batches(checkpoint, tmp_path, monkeypatch):
    """--batch-size: in float32 a padded batch gives each sample the score it gets alone; a chunk between
    two cache writes is the larger of CHUNK and the batch, so a batch is never cut in two."""
    import lpes_harness.evaluation.paired as module
    from lpes_harness.evaluation.score_cache import ScoreCache
    from lpes_harness.lmeval.lpes_lm import LPESLM

    lm = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32")
    run = dict(num_samples=3, metadata={"num_pairs": 3}, mode="logprob")
    alone = module.score_methods(lm, "kv_retrieval", VANILLA, **run)["scores"]["vanilla"]
    batched = module.score_methods(lm, "kv_retrieval", VANILLA, batch_size=3, **run)["scores"]["vanilla"]
    assert len({v for p in alone for v in alone[p]}) > 1
    for percent in alone:
        assert batched[percent] == pytest.approx(alone[percent], abs=1e-4)

    from lpes_harness.lmeval.position_scorer import PositionScorer

    chunks, real = [], module._fill
    monkeypatch.setattr(module, "_fill", lambda *a: chunks.append(a[5]) or real(*a))  # (scorer, method, percents, cache, report, chunk, count)
    calls, scores_at = [], PositionScorer.scores_at
    monkeypatch.setattr(PositionScorer, "scores_at",
                        lambda self, requests: calls.append(sum(map(len, requests.values()))) or scores_at(self, requests))
    cache = ScoreCache(tmp_path / "c.json", {"x": 1})
    module.score_methods(lm, "kv_retrieval", VANILLA, batch_size=2 * module.CHUNK, cache=cache, **run)
    module.score_methods(lm, "kv_retrieval", {"other": MethodSetup.of_scales([1.5] * 4)}, batch_size="auto", cache=cache,
                         **run)
    assert chunks == [2 * module.CHUNK, module.CHUNK]
    # 6 positions x 3 samples: one call of all 18 at batch 20; at CHUNK 10, 2 samples a position (12), then the last 6.
    assert calls == [18, 12, 6]


@pytest.mark.parametrize("text", ["0", "-2", "many", "1.5"])
def test_a_bad_batch_size_is_one_line(text, capsys):
    from lpes_harness.evaluation import paired

    with pytest.raises(SystemExit) as stop:
        paired_command.main(["--scales", "s.json", "--output", "out", "--batch-size", text])
    assert stop.value.code == 2 and "a positive integer or 'auto'" in capsys.readouterr().err


def test_a_uniform_row_of_base_scaling_says_so_in_its_name():
    """A table holds position and base rows side by side (the SmolLM2 leaderboard): "uniform 0.75" alone
    would not say which factor it is."""
    from lpes_harness.evaluation.paired import lpes_methods, uniform_name

    assert uniform_name(0.75) == "uniform 0.75" and uniform_name(0.75, "base") == "uniform base 0.75"
    assert uniform_name((1.2, 2.0), "both") == "uniform 1.2:2"
    assert factors(lpes_methods([0.5, 1.5], [0.75], scaling="base"))["uniform base 0.75"] == [0.75, 0.75]


@pytest.mark.parametrize("key", ["split", "num_samples"])
def test_metadata_that_would_choose_other_samples_is_refused_not_dropped(key, capsys, tmp_path):
    """The command scores the held-out split, --num-samples of it: a 'split' in --metadata was dropped without a
    word (a table asked for the validation samples scored held-out ones)."""
    scales = tmp_path / "s.json"
    scales.write_text(json.dumps([1.0, 1.5]))
    with pytest.raises(SystemExit) as stop:
        paired_command.main(["--scales", str(scales), "--metadata", json.dumps({key: "validation"}),
                             "--output", str(tmp_path / "out")])
    assert stop.value.code == 2 and f"{key!r} is set by this command" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
