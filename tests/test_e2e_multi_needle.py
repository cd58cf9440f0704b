"""`lm_eval --model lpes_hf` on multi_needle, on the real SmolLM2 (slow: loads the model).

The search scores the prompts lm_eval builds: the logged context of every position equals
what the search's PositionScorer gives the model (chat template and answer prefix included).
"""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import REPO_ROOT, converted_bundled_model

from lpes_harness.tasks.multi_needle import MULTI_NEEDLE

pytestmark = pytest.mark.slow


def test_lm_eval_lpes_hf_on_multi_needle_sees_the_searchs_prompts(tmp_path):
    scales = tmp_path / "scales.json"
    scales.write_text(json.dumps({"scales": [0.9] * 15 + [1.3] * 15}))
    command = [
        sys.executable, "-m", "lm_eval", "run", "--model", "lpes_hf", "--model_args", f"scales={scales}",
        "--tasks", "multi_needle", "--apply_chat_template",
        "--metadata", json.dumps({"num_samples": 1, "num_sentences": 12, "num_needles": 4}),
        "--log_samples", "--output_path", str(tmp_path / "out"),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert str(scales) in json.dumps(results["config"]["model_args"])  # the run used our scales
    for percent in MULTI_NEEDLE.positions:
        assert results["results"][MULTI_NEEDLE.subtask_name(percent)]["acc,none"] in (0.0, 1.0)

    from transformers import AutoTokenizer

    from lpes_harness.lmeval.position_scorer import PositionScorer

    # the converted folder's tokenizer, the GGUF's (tests/test_gguf_cache.py), without parsing the GGUF again
    tokenizer = AutoTokenizer.from_pretrained(converted_bundled_model())

    def apply_chat_template(history, add_generation_prompt=True):  # what HFLM.apply_chat_template does
        return tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             continue_final_message=not add_generation_prompt)

    stand_in = SimpleNamespace(tokenizer=tokenizer, apply_chat_template=apply_chat_template)
    scorer = PositionScorer(stand_in, "multi_needle", MULTI_NEEDLE.positions, split="heldout", num_samples=1,
                            metadata={"num_sentences": 12, "num_needles": 4})
    assert scorer.chat_template
    for percent in MULTI_NEEDLE.positions:
        logged = json.loads(next((tmp_path / "out").rglob(f"samples_multi_needle_pos{percent}_*.jsonl")).read_text().splitlines()[0])
        expected = scorer.prompt(scorer.tasks[percent], scorer.docs[percent][0])
        assert logged["arguments"]["gen_args_0"]["arg_0"] == expected
        assert expected.endswith(f"The special magic number for {logged['doc']['city']} is")
