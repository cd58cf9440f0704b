"""MDQA: the gold passage among BM25 distractors that hold no answer, moved to each position."""

import json
import re

from conftest import SHARED_DATA

from lpes_harness.tasks.mdqa import MDQA, format_documents
from lpes_harness.tasks.metrics import normalize_answer
from lpes_harness.tasks.position import build_docs, build_examples, resolve_options

NQ_ORACLE = SHARED_DATA / "lost_in_the_middle" / "nq-open-oracle.jsonl.gz"


def options(**metadata):
    return resolve_options(MDQA, {"data_path": str(NQ_ORACLE), **metadata})[0]


def document_lines(prompt):
    return [line for line in prompt.split("\n") if line.startswith("Document [")]


def test_no_distractor_contains_an_answer():
    examples = build_examples(MDQA, options(split="search", num_samples=40, num_docs=10))
    assert len(examples) == 40
    for _, example in examples:
        assert len(example.distractors) == 9
        answers = [normalize_answer(a) for a in example.answers if normalize_answer(a)]
        for passage in example.distractors:
            text = normalize_answer(passage["title"] + " " + passage["text"])
            assert not any(answer in text for answer in answers), (example.answers, passage)
            assert passage["text"] != example.gold["text"]
        assert len({p["text"] for p in example.distractors}) == 9  # no passage twice


def test_gold_passage_is_at_litm_gold_index_for_every_position():
    for percent in MDQA.positions:
        for doc in build_docs(MDQA, percent, options(split="search", num_samples=5, num_docs=20)):
            lines = document_lines(doc["prompt"])
            assert len(lines) == 20
            assert doc["gold_index"] == {0: 0, 25: 4, 50: 9, 75: 14, 100: 19}[percent]  # LitM's indices
            gold_line = lines[doc["gold_index"]]
            assert gold_line.startswith(f"Document [{doc['gold_index'] + 1}](Title: ")
            # the gold line holds an answer; every other one holds none
            holds = [any(normalize_answer(a) in normalize_answer(line) for a in doc["answers"]) for line in lines]
            assert holds[doc["gold_index"]] and sum(holds) == 1


def test_prompt_is_litm_qa_prompt():
    doc = build_docs(MDQA, 0, options(split="search", num_samples=1))[0]
    assert doc["prompt"].startswith(
        "Write a high-quality answer for the given question using only the provided search results "
        "(some of which might be irrelevant).\n\nDocument [1](Title: "
    )
    assert doc["prompt"].endswith(f"\n\nQuestion: {doc['question']}\nAnswer:")
    assert format_documents([{"title": "T", "text": "x y"}]) == "Document [1](Title: T) x y"


def test_default_is_ten_documents_from_the_shared_oracle_file():
    opts, _ = resolve_options(MDQA, {"split": "search", "num_samples": 2})
    docs = build_docs(MDQA, 50, opts)
    assert [len(document_lines(d["prompt"])) for d in docs] == [10, 10]
    assert [d["gold_index"] for d in docs] == [4, 4]


def test_litm_prebuilt_file_is_read_as_is(tmp_path):
    # LitM's prebuilt files hold all documents, in retrieval order, one of them gold.
    path = tmp_path / "nq-open-5_total_documents_gold_at_2.jsonl"
    with open(path, "w") as f:
        for q in range(4):
            ctxs = [{"title": f"D{q}-{i}", "text": f"distractor {q} {i}", "isgold": False} for i in range(4)]
            ctxs.insert(2, {"title": f"G{q}", "text": f"gold passage {q} says answer{q}", "isgold": True})
            f.write(json.dumps({"question": f"question {q}?", "answers": [f"answer{q}"], "ctxs": ctxs}) + "\n")
    docs = build_docs(MDQA, 100, resolve_options(MDQA, {"data_path": str(path), "num_samples": 2})[0])
    assert len(docs) == 2 and len({doc["question"] for doc in docs}) == 2  # the checks below run on each sample
    for doc in docs:
        q = re.search(r"question (\d)", doc["question"]).group(1)
        titles = re.findall(r"\(Title: ([^)]+)\)", doc["prompt"])
        assert titles == [f"D{q}-0", f"D{q}-1", f"D{q}-2", f"D{q}-3", f"G{q}"]  # gold moved last, order kept
