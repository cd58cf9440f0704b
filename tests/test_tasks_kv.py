"""KV retrieval: LitM's prompt and format, a seeded generator, the gold pair moved to each position."""

import json
import re
import uuid

import pytest
from conftest import SHARED_DATA

from lpes_harness.tasks.data import TaskDataError
from lpes_harness.tasks.kv_retrieval import KV_RETRIEVAL, format_kv_records, generate_kv_record, render_prompt
from lpes_harness.tasks.position import Example, build_docs, build_examples, resolve_options

LITM_KV_FILE = SHARED_DATA / "lost_in_the_middle" / "kv-retrieval-75_keys.jsonl.gz"


def kv_docs(percent, **metadata):
    options, _ = resolve_options(KV_RETRIEVAL, metadata)
    return build_docs(KV_RETRIEVAL, percent, options)


def pairs_in_prompt(prompt):
    return re.findall(r'"([^"]+)": "([^"]+)"', prompt)


def test_prompt_is_litm_kv_retrieval_prompt_verbatim():
    example = Example(gold=("k2", "v2"), distractors=[("k1", "v1")], answers=["v2"], fields={"key": "k2"})
    expected = (
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        'JSON data:\n{"k1": "v1",\n "k2": "v2"}\n\n'
        'Key: "k2"\nCorresponding value:'
    )
    assert render_prompt([("k1", "v1"), ("k2", "v2")], example) == expected


def test_gold_pair_sits_at_litm_gold_index_for_every_position():
    for percent in KV_RETRIEVAL.positions:
        for doc in kv_docs(percent, num_samples=5, num_pairs=30):
            pairs = pairs_in_prompt(doc["prompt"])
            assert len(pairs) == 30
            assert doc["gold_index"] == percent * 29 // 100
            assert pairs[doc["gold_index"]] == (doc["key"], doc["value"])
            assert doc["prompt"].endswith(f'Key: "{doc["key"]}"\nCorresponding value:')


def test_positions_show_the_same_sample_with_only_the_gold_pair_moved():
    first, last = kv_docs(0, num_samples=3), kv_docs(100, num_samples=3)
    for a, b in zip(first, last):
        assert (a["key"], a["value"]) == (b["key"], b["value"])
        gold = (a["key"], a["value"])
        others_a = [p for p in pairs_in_prompt(a["prompt"]) if p != gold]
        others_b = [p for p in pairs_in_prompt(b["prompt"]) if p != gold]
        assert others_a == others_b  # the distractors keep their order


def test_fewer_pairs_than_positions_warns_which_positions_share_a_place(caplog):
    # 5 pairs, 6 positions: LitM's index puts 0 % and 20 % both on the first pair, so those two
    # subtasks hold the same prompts; the user is told, with the count that separates them.
    docs = kv_docs(20, num_pairs=5, num_samples=2)
    assert [d["prompt"] for d in docs] == [d["prompt"] for d in kv_docs(0, num_pairs=5, num_samples=2)]
    assert "with 5 items, gold position 20 % puts the gold item where 0 % does (item 1)" in caplog.text
    assert "give at least 6 items" in caplog.text
    caplog.clear()
    kv_docs(20, num_pairs=6, num_samples=2)
    kv_docs(40, num_pairs=5, num_samples=2)  # 5 pairs: 40 % is the second pair, alone
    assert "score the same prompts" not in caplog.text


def test_generator_is_seeded():
    assert kv_docs(40, num_samples=4, seed=7) == kv_docs(40, num_samples=4, seed=7)
    assert kv_docs(40, num_samples=4, seed=7)[0]["prompt"] != kv_docs(40, num_samples=4, seed=8)[0]["prompt"]


@pytest.mark.parametrize(
    "value_format, check",
    [
        ("hex8", lambda s: re.fullmatch(r"[0-9a-f]{8}", s)),
        ("uuid", lambda s: str(uuid.UUID(s)) == s and uuid.UUID(s).version == 4),
    ],
)
def test_value_formats(value_format, check):
    import random

    record = generate_kv_record(random.Random(0), num_pairs=12, value_format=value_format)
    strings = [s for pair in record["ordered_kv_records"] for s in pair]
    assert len(record["ordered_kv_records"]) == 12
    assert all(check(s) for s in strings)
    assert len(set(strings)) == 24  # keys and values all distinct: the gold value is unambiguous
    assert [record["key"], record["value"]] in record["ordered_kv_records"]


def test_reads_litm_kv_file_and_moves_its_gold_pair():
    docs = kv_docs(60, data_path=str(LITM_KV_FILE), num_samples=3, split="search")
    assert len(docs) == 3  # the checks below run on every sample asked for
    for doc in docs:
        pairs = pairs_in_prompt(doc["prompt"])
        assert len(pairs) == 75
        assert doc["gold_index"] == 44  # 60 % of the way through 75 pairs
        assert pairs[44] == (doc["key"], doc["value"])


def test_litm_file_heldout_split_is_what_remains_after_search_and_validation(caplog):
    options, _ = resolve_options(KV_RETRIEVAL, {"data_path": str(LITM_KV_FILE), "split": "heldout"})
    # 500 records: search takes 200, validation the last (500 - 200) // 4 = 75, held-out the 225
    # in between (fewer than the default 500: a warning).
    assert len(build_examples(KV_RETRIEVAL, options)) == 225
    assert "fewer than the default 500" in caplog.text


def test_generator_options_with_a_data_file_are_an_error():
    with pytest.raises(TaskDataError, match="num_pairs"):
        resolve_options(KV_RETRIEVAL, {"data_path": str(LITM_KV_FILE), "num_pairs": 20})


def test_bad_value_format_names_the_accepted_ones():
    with pytest.raises(TaskDataError, match=r"value_format='hex9'.*\['hex8', 'uuid'\]"):
        resolve_options(KV_RETRIEVAL, {"value_format": "hex9"})


def test_record_whose_gold_pair_is_missing_is_reported(tmp_path):
    path = tmp_path / "kv.jsonl"
    record = {"ordered_kv_records": [["a", "1"], ["b", "2"]], "key": "c", "value": "3"}
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(TaskDataError, match="must occur exactly once"):
        # one record: the search split is empty and held-out holds it
        kv_docs(0, data_path=str(path), split="heldout", num_samples=1)


def test_format_kv_records_matches_litm_layout_for_one_line_per_pair():
    assert format_kv_records([("a", "1"), ("b", "2"), ("c", "3")]) == '{"a": "1",\n "b": "2",\n "c": "3"}'


def test_greedy_match_also_accepts_the_value_in_its_json_quotes_and_the_metric_agrees():
    for doc in kv_docs(40, num_samples=3):
        assert doc["greedy_answers"] == [doc["value"], f'"{doc["value"]}"']
        for form in doc["greedy_answers"]:
            assert KV_RETRIEVAL.metric(form, doc["answers"]) == 1


def test_an_answer_form_the_metric_rejects_is_refused():
    from dataclasses import replace

    def make_example(sample, options):
        return Example(gold=("k", "v"), distractors=[("a", "b")], answers=["v"], other_forms=["w"])

    task = replace(KV_RETRIEVAL, make_example=make_example)
    options, _ = resolve_options(task, {"num_samples": 1})
    with pytest.raises(ValueError, match="the answer form 'w' does not score 1"):
        build_docs(task, 0, options)
