"""One `lm_eval` command-line run on the real SmolLM2 over both position groups (slow: loads the model)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, converted_bundled_model

from lpes_harness.tasks.kv_retrieval import KV_RETRIEVAL
from lpes_harness.tasks.mdqa import MDQA
from lpes_harness.tasks.position import build_docs, resolve_options

pytestmark = pytest.mark.slow


def test_lm_eval_cli_runs_kv_retrieval_and_mdqa_by_position(tmp_path):
    model_args = f"pretrained={converted_bundled_model()},dtype=float32"
    command = [
        sys.executable, "-m", "lm_eval", "run",
        "--model", "hf", "--model_args", model_args, "--device", "cpu",
        "--include_path", "tasks", "--tasks", "kv_retrieval,mdqa", "--limit", "1",
        # Small contexts keep this CPU run short; they also show --metadata reaching the tasks.
        "--metadata", "num_pairs=10", "num_docs=3",
        "--log_samples", "--output_path", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]

    results = json.loads(next(Path(tmp_path).rglob("results_*.json")).read_text())["results"]
    for task in (KV_RETRIEVAL, MDQA):
        assert 0.0 <= results[task.name][f"{task.metric_name},none"] <= 1.0
        for percent in task.positions:
            assert 0.0 <= results[task.subtask_name(percent)][f"{task.metric_name},none"] <= 1.0

    # The model saw exactly the prompt our builder makes for the default held-out split.
    logged = json.loads(next(Path(tmp_path).rglob("samples_kv_retrieval_pos60_*.jsonl")).read_text().splitlines()[0])
    expected = build_docs(KV_RETRIEVAL, 60, resolve_options(KV_RETRIEVAL, {"num_pairs": 10})[0])[0]
    assert logged["arguments"]["gen_args_0"]["arg_0"] == expected["prompt"]
    assert logged["doc"]["gold_index"] == 5  # 60 % of the way through 10 pairs
    mdqa_doc = json.loads(next(Path(tmp_path).rglob("samples_mdqa_pos100_*.jsonl")).read_text().splitlines()[0])["doc"]
    assert (mdqa_doc["num_items"], mdqa_doc["gold_index"]) == (3, 2)
