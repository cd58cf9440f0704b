"""benchmarks/lpes_answer_logits.py times lm-eval's own MMLU requests through both lpes_hf paths."""

import json

import pytest
from conftest import load_benchmark as load


def test_refuses_no_questions(capsys):
    with pytest.raises(SystemExit):
        load("lpes_answer_logits").parse_args(["--questions", "0"])
    assert "--questions and --repeats must be at least 1" in capsys.readouterr().err


def test_requests_are_the_tasks_own_one_per_choice():
    requests = load("lpes_answer_logits").mmlu_requests("high_school_physics", 3)
    assert len(requests) == 12 and sorted({r.doc_id for r in requests}) == [0, 1, 2]
    assert all(r.request_type == "loglikelihood" and len(r.args) == 2 for r in requests)


def test_an_unknown_subject_is_refused_before_any_model_load(monkeypatch):
    module = load("lpes_answer_logits")
    monkeypatch.setattr("lpes_harness.lmeval.lpes_lm.LPESLM", None)  # loading a model would fail loudly here
    with pytest.raises(SystemExit, match="--subject 'nope': no task mmlu_continuation_local_nope"):
        module.main(["--subject", "nope"])


def test_both_paths_agree(tmp_path, capsys, tiny_model_with_the_bundled_tokenizer):
    # MMLU's requests tokenized as SmolLM2 does, scored by a tiny model with its ~49k-token vocabulary
    out = tmp_path / "bench.json"
    assert load("lpes_answer_logits").main(["--pretrained", tiny_model_with_the_bundled_tokenizer,
                                            "--questions", "2", "--repeats", "1", "--dtype", "float32",
                                            "--batch-size", "4", "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert set(found["median_s"]) == {"full logits", "answer logits"} and found["requests"] == 8
    assert found["agreement"]["same_choice"] == 2 and found["agreement"]["is_greedy_same"] == 8
    assert found["agreement"]["max_abs_dlogprob"] < 1e-3
    assert "answer logits / full logits" in capsys.readouterr().out
