"""benchmarks/prefix_generation.py: L-Eval questions of one text generated whole and sharing the text, side by side."""

import json

import pytest
from conftest import SHARED_DATA
from conftest import load_benchmark as load

needs_data = pytest.mark.skipif(not (SHARED_DATA / "leval").is_dir(), reason="shared data not present")


def test_refuses_no_documents(capsys):
    with pytest.raises(SystemExit):
        load("prefix_generation").parse_args(["--documents", "0"])
    assert "--documents and --questions and --repeats must be at least 1" in capsys.readouterr().err


@needs_data
def test_refuses_a_task_that_does_not_generate(monkeypatch):
    monkeypatch.setenv("LPES_DATA", str(SHARED_DATA))
    with pytest.raises(SystemExit, match="its requests are multiple_choice, not generate_until"):
        load("prefix_generation").main(["--task", "mmlu_continuation_local_high_school_physics"])


@needs_data
def test_keeps_the_first_questions_of_the_first_texts(monkeypatch):
    monkeypatch.setenv("LPES_DATA", str(SHARED_DATA))
    requests = load("prefix_generation").task_requests("leval_tpo", 2, 3)
    assert sorted((r.doc["doc_index"], r.doc["question_index"]) for r in requests) == [
        (d, q) for d in range(2) for q in range(3)]


@needs_data
def test_both_paths_agree_and_sharing_runs_fewer_tokens(monkeypatch, tmp_path, capsys, tiny_model_with_the_bundled_tokenizer):
    # The real TOEFL prompts, tokenized as SmolLM2 does (~3,600 tokens each), on a tiny model: what is
    # checked is the command, not the bundled model's forwards (4 prefills: minutes on a slow CPU).
    monkeypatch.setenv("LPES_DATA", str(SHARED_DATA))
    out = tmp_path / "bench.json"
    assert load("prefix_generation").main(["--pretrained", tiny_model_with_the_bundled_tokenizer, "--documents", "1",
                                           "--questions", "2", "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert (found["documents"], found["questions"], found["requests"]) == (1, 2, 2)
    assert found["agreement"] == {"identical": 2, "continuations": 2}
    # --count-only's count is what the decoder ran, bar the generated tokens, which both paths run alike
    measured, counted = found["methods"], found["counted"]
    assert counted["each whole"] == found["prompt_tokens"] > counted["shared prefixes"]
    assert (measured["each whole"]["tokens"] - counted["each whole"]
            == measured["shared prefixes"]["tokens"] - counted["shared prefixes"] > 0)
    # the second prompt runs only what follows the text it shares with the first
    assert found["methods"]["shared prefixes"]["tokens"] < 0.7 * found["methods"]["each whole"]["tokens"]
    assert "shared prefixes / each whole" in capsys.readouterr().out


@needs_data
def test_count_only_refuses_an_unknown_task_before_the_model_loads(monkeypatch):
    monkeypatch.setenv("LPES_DATA", str(SHARED_DATA))
    with pytest.raises(SystemExit, match="--task 'no_such_task': no such task"):
        load("prefix_generation").main(["--count-only", "--task", "no_such_task"])
    with pytest.raises(SystemExit, match="--task names no task"):
        load("prefix_generation").main(["--count-only", "--task", " , "])


@needs_data
def test_count_only_counts_every_question_of_every_text_without_generating(monkeypatch, tmp_path, capsys,
                                                                            tiny_model_with_the_bundled_tokenizer):
    monkeypatch.setenv("LPES_DATA", str(SHARED_DATA))
    bench = load("prefix_generation")
    out = tmp_path / "count.json"
    assert bench.main(["--count-only", "--task", "leval_sci_fi", "--pretrained", tiny_model_with_the_bundled_tokenizer,
                       "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    row = found["tasks"]["leval_sci_fi"]
    assert row["requests"] == len(bench.task_requests("leval_sci_fi", None, None)) == found["all"]["requests"]
    # SFiction asks each question with its text and without: the ones with it share the text
    assert 0 < row["shared_run"] < 0.5 * row["prompt_tokens"] and row["not_shared"] is None
    assert "leval_sci_fi" in capsys.readouterr().out
