"""End to end on the real bundled SmolLM2-135M (GGUF): the `lm_eval` command line -> `lpes_hf`.

Each run loads the model (about 25 s), so the runs here are few and share one fixture.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import converted_bundled_model

pytestmark = pytest.mark.slow

DOCS = [
    {"context": "The capital of France is", "choices": ["Paris", "Berlin", "Rome"], "label": 0},
    {"context": "Two plus two equals", "choices": ["four", "five", "seven"], "label": 0},
    {"context": "Water freezes at zero degrees", "choices": ["Celsius", "Kelvin", "Newton"], "label": 0},
    {"context": "The opposite of hot is", "choices": ["cold", "warm", "loud"], "label": 0},
]

TASK_YAML = """\
task: tiny_loglikelihood
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_ll_task")
    data = directory / "data.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (directory / "tiny_loglikelihood.yaml").write_text(TASK_YAML.format(data=data))
    return directory


def run_cli(command, model, model_args, task_dir, out_dir):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    args = [
        *command,
        "--model", model,
        "--model_args", model_args,
        "--include_path", str(task_dir),
        "--tasks", "tiny_loglikelihood",
        "--device", "cpu",
        "--log_samples",
        "--output_path", str(out_dir),
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (samples,) = Path(out_dir).rglob("samples_tiny_loglikelihood_*.jsonl")
    (results,) = Path(out_dir).rglob("results_*.json")
    per_sample = [json.loads(line) for line in samples.read_text().splitlines()]
    loglikelihoods = [[float(resp[0][0]) for resp in doc["resps"]] for doc in sorted(per_sample, key=lambda d: d["doc_id"])]
    return loglikelihoods, json.loads(results.read_text())


LM_EVAL = [sys.executable, "-m", "lm_eval"]


def test_lpes_hf_scale_one_equals_hf_and_scale_two_differs(task_dir, tmp_path):
    # Plain `hf` on the folder the GGUF cache converts the bundled GGUF into (its logits bit for bit:
    # tests/test_gguf_cache.py), where `hf` on the GGUF would dequantize it again (a minute on a slow CPU).
    hf_args = f"pretrained={converted_bundled_model()}"
    vanilla, _ = run_cli(LM_EVAL, "hf", hf_args, task_dir, tmp_path / "hf")
    identity, identity_results = run_cli(LM_EVAL, "lpes_hf", "scales=1.0", task_dir, tmp_path / "lpes1")
    assert identity == vanilla, "scales=1.0 must reproduce the plain model's log-likelihoods exactly"
    assert identity_results["config"]["lpes_scales"] == [1.0] * 30

    # The console script takes lm_eval's arguments unchanged.
    lpes_eval = [str(Path(sys.executable).with_name("lpes-eval"))]
    scaled, scaled_results = run_cli(lpes_eval, "lpes_hf", "scales=2.0", task_dir, tmp_path / "lpes2")
    assert scaled_results["config"]["lpes_scales"] == [2.0] * 30
    differences = [abs(a - b) for row_a, row_b in zip(scaled, vanilla) for a, b in zip(row_a, row_b)]
    assert max(differences) > 0.1, "scales=2.0 must change the log-likelihoods"
