"""ZeroSCROLLS: query-preserving truncation, ROUGE-1/2/L, single-reference F1, QuALITY accuracy."""

import json

import pytest
from conftest import SHARED_DATA
from suite_fixtures import write_jsonl
from tiny_models import tiny_tokenizer

from lpes_harness.tasks.suites import zeroscrolls as zs
from lpes_harness.tasks.suites.common import count_tokens

INSTRUCTION = "You are given a story and a question. Answer the question as concisely as you can."
STORY = "Mary walked to the market and bought apples. " * 30
QUERY = "Question:\nWhat did Mary buy?\n\nAnswer:\n"
INPUT = f"{INSTRUCTION}\n\nStory:\n{STORY}\n\n{QUERY}"


def test_input_splits_into_head_document_query_and_noun():
    head, document, query, noun = zs.split_input(INPUT, "row")
    assert head == f"{INSTRUCTION}\n\nStory:\n" and query == QUERY and noun == "story"
    assert head + document + query == INPUT


def test_short_input_is_kept_verbatim_and_long_one_keeps_query_after_separator():
    tokenizer = tiny_tokenizer()
    record = {"id": "x", "input": INPUT, "output": "apples"}
    (kept,) = zs.build_docs("narrative_qa", [record], tokenizer, 10_000, "f")
    assert kept["prompt"] == INPUT and not kept["truncated"]
    (cut,) = zs.build_docs("narrative_qa", [record], tokenizer, 600, "f")
    assert cut["truncated"] and count_tokens(tokenizer, cut["prompt"]) <= 600
    assert cut["prompt"].startswith(f"{INSTRUCTION}\n\nStory:\nMary walked")
    assert cut["prompt"].endswith("... [The rest of the story is omitted]\n\n" + QUERY)


def test_rouge_scores_identical_and_disjoint_texts():
    assert zs.rouge("the cat sat on the mat", "the cat sat on the mat") == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    assert zs.rouge("dogs bark loudly", "the cat sat") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    doc = {"zeroscrolls_task": "gov_report", "target": "the cat sat on the mat"}
    scores = zs.process_results(doc, ["the cat sat"])
    assert set(scores) == {"rouge1", "rouge2", "rougeL"} and 0 < scores["rouge2"] < scores["rouge1"] < 1


def test_token_f1_uses_squad_normalisation():
    assert zs.token_f1("The Apples!", "apples") == 1.0
    # prediction "red apples and pears" vs "apples": precision 1/4, recall 1 -> F1 0.4
    assert zs.token_f1("red apples and pears", "apples") == pytest.approx(0.4)
    assert zs.process_results({"zeroscrolls_task": "qasper", "target": "yes"}, [" no"]) == {"f1": 0.0}


@pytest.mark.parametrize("response, letter", [(" D", "D"), ("(B) no worries", "B"), ("The answer is C.", "C"), ("none", None)])
def test_quality_takes_the_first_option_letter(response, letter):
    assert zs.first_option_letter(response) == letter


def test_load_dataset_and_task_flags(tmp_path):
    write_jsonl(tmp_path / "zeroscrolls" / "qasper.validation.jsonl", [{"id": 1, "input": INPUT, "output": "apples"}])
    dataset = zs.load_dataset("qasper", data_path=str(tmp_path), tokenizer=tiny_tokenizer())
    assert dataset["test"][0]["id"] == "1"
    assert zs.metric_names("qasper") == ("f1",) and "qasper" in zs.SINGLE_REFERENCE_TASKS
    assert zs.metric_names("squality") == ("rouge1", "rouge2", "rougeL") and zs.metric_names("quality") == ("acc",)


def test_input_without_query_block_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="f record 1: no query block"):
        zs.build_docs("qasper", [{"id": 1, "input": f"{INSTRUCTION}\n\nStory:\n{STORY}", "output": ""}], tiny_tokenizer(), 100, "f")


@pytest.mark.skipif(not (SHARED_DATA / "zeroscrolls").is_dir(), reason="shared data not present")
def test_every_shared_row_splits_around_its_document():
    for task in zs.TASKS:
        lines = (SHARED_DATA / "zeroscrolls" / f"{task}.validation.jsonl").read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            text = json.loads(line)["input"]
            head, document, query, _ = zs.split_input(text, f"{task}:{number}")
            assert head + document + query == text and len(document) > 10 * len(query) - 2000
            assert query.endswith(("Answer:\n", "Summary:\n"))


def test_committed_yaml_matches_the_generator_and_flags_single_reference_tasks():
    import yaml
    from conftest import REPO_ROOT

    from lpes_harness.tasks.suites import yaml_files

    for folder, files in (("leval", yaml_files.leval_files()), ("zeroscrolls", yaml_files.zeroscrolls_files())):
        committed = {p.name: p.read_text(encoding="utf-8") for p in (REPO_ROOT / "tasks" / "suites" / folder).iterdir()}
        assert committed == files
    qasper = yaml.safe_load(files["zeroscrolls_qasper.yaml"].split("custom_dataset")[0])
    assert qasper["metadata"]["single_reference"] is True and qasper["generation_kwargs"]["max_gen_toks"] == 512
