"""L-Eval closed-ended tasks: L-Eval's prompts, document truncation, and its exam scoring."""

import pytest
from conftest import SHARED_DATA
from suite_fixtures import write_jsonl
from tiny_models import tiny_tokenizer

from lpes_harness.tasks.suites import leval
from lpes_harness.tasks.suites.common import count_tokens

DOCUMENT = "The lecture explains data science. " * 40  # ~1,400 characters, one token per character


def _records():
    return [
        {"input": DOCUMENT, "instructions": ["Q1 doc0\nA. x\nB. y", "Q2 doc0"], "outputs": ["B", "AC"], "source": "s", "evaluation": "exam"},
        {"input": "Short doc.", "instructions": ["Q1 doc1"], "outputs": ["(D) the fourth"], "source": "s", "evaluation": "exam"},
    ]


@pytest.mark.parametrize(
    "response, multiple, expected",
    [
        (" B", False, "B"),
        ("The answer is C", False, "C"),
        ("As the text says, C", False, "A"),  # L-Eval's rule: the first A-D character, even inside a word
        ("", False, "None"),
        ("BD", True, "BD"),
        ("DB.", True, "BD"),
        (" B and D are correct", True, "BD"),
        (" B\nQuestion 2. A and C", True, "B"),  # stops at the next question
        ("no letters here", True, "A"),  # L-Eval's random guess
    ],
)
def test_output_option_parsing_follows_leval(response, multiple, expected):
    assert leval.parse_output_options(response, multiple) == expected


def test_exam_score_gives_quarter_credit_for_a_proper_subset():
    assert leval.exam_score("BD", "BD") == 1.0
    assert leval.exam_score("B", "BD") == 0.25
    assert leval.exam_score("BC", "BD") == 0.0
    assert leval.exam_score("None", "B") == 0.0


def test_gold_options_from_quality_and_coursera_answers():
    assert leval.parse_gold_options("(B) Their subconscious knew") == "B"
    assert leval.parse_gold_options("ACD") == "ACD"


def test_sci_fi_gold_splits_into_loyalty_and_fact_and_outputs_parse_true_false():
    assert leval.split_judgement("True [fact: False]") == ("true", "false")
    assert leval.parse_true_false("  False. The document says") == "false"
    assert leval.parse_true_false("I cannot tell") == "<error>"


def test_docs_go_round_robin_over_documents():
    assert leval.round_robin(_records()) == [(0, 0), (1, 0), (0, 1)]


def test_prompt_is_leval_exam_prompt_and_fits_the_token_budget():
    tokenizer = tiny_tokenizer()
    docs = leval.build_docs("coursera", _records(), tokenizer, max_context_tokens=700)
    first = docs[0]
    assert first["prompt"].startswith(leval.SYSTEM_PROMPTS["coursera"] + "\n\nDocument is as follows. The lecture")
    assert first["prompt"].endswith(
        " \nQuestion: Q1 doc0\nA. x\nB. y.  Please directly give the answer without any additional output or explanation \nAnswer:"
    )
    assert first["truncated"] and count_tokens(tokenizer, first["prompt"]) <= 700
    assert not docs[1]["truncated"] and "Short doc." in docs[1]["prompt"]
    assert leval.process_results(docs[2], [" C and A."]) == {"exact_match": 1.0}  # "AC" in any order
    assert leval.process_results(docs[1], ["D"]) == {"exact_match": 1.0}


def test_sci_fi_asks_loyalty_with_document_and_fact_without():
    records = [{"input": DOCUMENT, "instructions": [f"1.\tMen fly, True or False? Answer this question {leval.FACT_FROM}"], "outputs": ["True [fact: False]"]}]
    loyalty, fact = leval.build_docs("sci_fi", records, tiny_tokenizer(), 4000)
    assert "Document is as follows." in loyalty["prompt"] and loyalty["target"] == "true"
    assert "Document" not in fact["prompt"] and leval.FACT_TO in fact["prompt"] and fact["target"] == "false"
    assert leval.process_results(loyalty, ["True"]) == {"exact_match": 1.0, "loyalty": 1.0}
    assert leval.process_results(fact, ["True"]) == {"exact_match": 0.0, "fact": 0.0}


def test_load_dataset_reads_leval_folder_with_given_tokenizer(tmp_path):
    write_jsonl(tmp_path / "leval" / "tpo.jsonl", _records())
    dataset = leval.load_dataset("tpo", data_path=str(tmp_path), max_context_tokens="900", tokenizer=tiny_tokenizer())
    assert len(dataset["test"]) == 3 and dataset["test"][0]["leval_task"] == "tpo"


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="unknown L-Eval task 'toefl'"):
        leval.load_dataset("toefl", tokenizer=tiny_tokenizer())


@pytest.mark.skipif(not (SHARED_DATA / "leval").is_dir(), reason="shared data not present")
def test_shared_leval_question_counts_and_gold_answers_parse():
    counts = {}
    for stem in leval.TASKS.values():
        records = leval.read_task(stem, str(SHARED_DATA))
        counts[stem] = sum(len(r["instructions"]) for r in records)
        for record in records:
            for gold in record["outputs"]:
                if stem == "sci_fi":
                    assert leval.split_judgement(gold)[0] in ("true", "false")
                else:
                    assert set(leval.parse_gold_options(gold)) <= set("ABCD")
    assert counts == {"coursera": 172, "quality": 202, "tpo": 269, "sci_fi": 64}


def test_truncation_tokenizer_comes_from_the_model_args_lm_eval_merges_into_metadata(tmp_path):
    from tiny_models import save_tiny_checkpoint

    from lpes_harness.tasks.suites.common import tokenizer_from_metadata

    checkpoint = save_tiny_checkpoint(tmp_path / "tiny")
    tokenizer = tokenizer_from_metadata({"pretrained": checkpoint, "version": 1.0})
    assert count_tokens(tokenizer, "abc") == 3  # the tiny character-level tokenizer
    assert tokenizer_from_metadata({"tokenizer": checkpoint, "pretrained": "elsewhere"}).vocab_size == tokenizer.vocab_size
