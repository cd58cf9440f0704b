"""multi_needle: the gold needle moves and nothing else does; keys are distinct; the task declares its roles."""

import random

import pytest

from lpes_harness.tasks.multi_needle import MULTI_NEEDLE, distractor_slots, make_example
from lpes_harness.tasks.position import Sample, build_docs, gold_index, resolve_options

OPTIONS, _ = resolve_options(MULTI_NEEDLE, {"split": "search", "num_samples": 4})


def docs_by_position():
    return {p: build_docs(MULTI_NEEDLE, p, OPTIONS) for p in MULTI_NEEDLE.positions}


def split_items(doc):
    haystack = doc["prompt"].split("\n\n")[1]
    return [s + "." for s in haystack[:-1].split(". ")]


def test_gold_needle_sits_at_litm_index_and_everything_else_is_identical():
    by_position = docs_by_position()
    for sample in range(4):
        lists = {p: split_items(by_position[p][sample]) for p in MULTI_NEEDLE.positions}
        city = by_position[0][sample]["city"]
        number = by_position[0][sample]["target"]
        gold = f"The special magic number for {city} is {number}."
        for percent, items in lists.items():
            assert len(items) == 60 + 8
            assert items.index(gold) == gold_index(percent, len(items))
            assert items.count(gold) == 1
        without_gold = {p: [s for s in items if s != gold] for p, items in lists.items()}
        assert all(rest == without_gold[0] for rest in without_gold.values())


def test_distractor_keys_are_distinct_from_the_gold_key_and_values_distinct():
    for index in range(50):
        example = make_example(Sample(index, random.Random(f"t/{index}")), {"num_needles": 8, "num_sentences": 60})
        needles = [s for s in example.distractors if s.startswith("The special magic number")]
        cities = [s.split(" for ")[1].split(" is ")[0] for s in needles]
        numbers = [s.rsplit(" ", 1)[1].rstrip(".") for s in needles]
        assert len(needles) == 7
        assert example.fields["city"] not in cities and len(set(cities)) == 7
        assert example.answers[0] not in numbers and len(set(numbers)) == 7


def test_distractors_sit_at_fixed_spread_slots_never_at_the_ends():
    slots = distractor_slots(60, 7)
    assert slots == sorted(set(slots)) and slots[0] > 0 and slots[-1] < 66


def test_seed_redraws_the_sample_and_splits_never_share_one():
    other_seed, _ = resolve_options(MULTI_NEEDLE, {"split": "search", "num_samples": 4, "seed": 1})
    heldout, _ = resolve_options(MULTI_NEEDLE, {"split": "heldout", "num_samples": 4})
    prompts = {d["prompt"] for d in build_docs(MULTI_NEEDLE, 50, OPTIONS)}
    assert prompts.isdisjoint(d["prompt"] for d in build_docs(MULTI_NEEDLE, 50, other_seed))
    assert prompts.isdisjoint(d["prompt"] for d in build_docs(MULTI_NEEDLE, 50, heldout))


def test_answer_prefix_and_roles_are_declared_by_the_task():
    doc = build_docs(MULTI_NEEDLE, 0, OPTIONS)[0]
    assert doc["answer_prefix"] == f"The special magic number for {doc['city']} is"
    assert MULTI_NEEDLE.roles == {"begin": (0,), "middle": (25, 50, 75), "end": (100,)}
    assert MULTI_NEEDLE.chat_template


@pytest.mark.parametrize("metadata, message", [
    ({"num_needles": 0}, "num_needles=0 must be at least 1"),
    ({"num_needles": 99}, "exceeds the 40 cities"),
    ({"num_sentences": "x"}, "num_sentences='x' is not an integer"),
])  # fmt: skip
def test_bad_options_are_named(metadata, message):
    from lpes_harness.tasks.data import TaskDataError

    with pytest.raises(TaskDataError, match=message):
        resolve_options(MULTI_NEEDLE, metadata)
