"""One end-to-end lm_eval CLI run of a local-data suite task on the real bundled SmolLM2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SHARED_DATA


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "mmlu").is_dir(), reason="shared data not present")
def test_lm_eval_cli_scores_mmlu_local_subject_with_lpes_hf(tmp_path):
    lm_eval = Path(sys.executable).with_name("lm_eval")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", LPES_DATA=str(SHARED_DATA))
    command = [
        str(lm_eval), "--model", "lpes_hf", "--model_args", "scales=1.2,dtype=float32",
        "--tasks", "mmlu_local_astronomy", "--limit", "2", "--output_path", str(tmp_path),
    ]
    run = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (results_file,) = tmp_path.rglob("results*.json")
    results = json.loads(results_file.read_text())
    assert 0.0 <= results["results"]["mmlu_local_astronomy"]["acc,none"] <= 1.0
    assert results["n-shot"]["mmlu_local_astronomy"] == 5
    assert results["config"]["lpes_scales"] == [1.2] * 30


def test_generation_suites_run_end_to_end_in_lm_eval_on_a_tiny_model(tmp_path):
    # The committed YAML, the loaders and process_results through lm-eval's own evaluator.
    import lm_eval
    from lm_eval.tasks import TaskManager
    from suite_fixtures import write_jsonl
    from tiny_models import save_tiny_checkpoint

    checkpoint = save_tiny_checkpoint(tmp_path / "tiny")
    story = "Mary bought apples. " * 40
    write_jsonl(
        tmp_path / "data" / "leval" / "sci_fi.jsonl",
        [{"input": story, "instructions": ["1.\tMary bought pears, True or False? Answer this question based on the world described in the document."], "outputs": ["False [fact: False]"]}],
    )
    write_jsonl(
        tmp_path / "data" / "zeroscrolls" / "gov_report.validation.jsonl",
        [{"id": "a", "input": f"Summarize the report.\n\nReport:\n{story}\n\nSummary:\n", "output": "Mary bought apples."}],
    )
    metadata = {"data_path": str(tmp_path / "data"), "max_context_tokens": 300}
    manager = TaskManager(include_path=str(REPO_ROOT / "tasks" / "suites"), include_defaults=False, metadata=metadata)
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={checkpoint},device=cpu",
        tasks=["leval_sci_fi", "zeroscrolls_gov_report"],
        task_manager=manager,
        gen_kwargs="max_gen_toks=4",
    )["results"]
    # one loyalty and one fact question, each scored 0 or 1
    assert {"exact_match,none", "loyalty,none", "fact,none"} <= set(results["leval_sci_fi"])
    assert all(results["leval_sci_fi"][k] in (0.0, 1.0) for k in ("loyalty,none", "fact,none"))
    assert all(0.0 <= results["zeroscrolls_gov_report"][f"{m},none"] <= 1.0 for m in ("rouge1", "rouge2", "rougeL"))
