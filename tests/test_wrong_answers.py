"""Each kind of wrong answer, and the verdict it leads to, on fixed answer lists: no model."""

import pytest

from lpes_harness.evaluation.validity import judge
from lpes_harness.evaluation.wrong_answers import classify
from lpes_harness.tasks.position import build_examples, place_gold, resolve_options, resolve_task

KV = resolve_task("kv_retrieval")
NEEDLES = resolve_task("multi_needle")


def examples(task, metadata, num_samples):
    options, _ = resolve_options(task, {**metadata, "split": "heldout", "num_samples": num_samples})
    return [example for _, example in build_examples(task, options)]


def classified(task, example, percent, answer):
    items, gold_at = place_gold(example, percent)
    right = task.metric(answer, list(example.answers)) == 1
    return classify(answer, right, items, gold_at, task.render(items, example), task), items, gold_at


def test_each_kind_of_wrong_answer_on_kv():
    example = examples(KV, {"num_pairs": 5}, 1)[0]
    value_of = {pair[1]: pair for pair in example.distractors}
    # gold at 50 %: index 2 of 5; the first pair (index 0) is a distractor
    first_value = example.distractors[0][1]
    c, items, gold_at = classified(KV, example, 50, f' "{first_value}"')
    assert (c.kind, c.item_index, c.rank, c.rank_from_end, c.offset, c.depth) == ("other_item", 0, 0, 4, -2, 0.0)
    assert items[0] == value_of[first_value] and gold_at == 2
    assert classified(KV, example, 50, f" {example.answers[0]}")[0].kind == "correct"
    assert classified(KV, example, 50, f" {example.fields['key']}")[0].kind == "in_context"  # the asked key copied
    assert classified(KV, example, 50, " 1000000000")[0].kind == "made_up"
    assert classified(KV, example, 50, "  ")[0].kind == "empty"


def test_another_needle_is_named_with_its_depth_and_rank():
    example = examples(NEEDLES, {"num_sentences": 20}, 1)[0]
    items, gold_at = place_gold(example, 50)
    needles = [i for i, item in enumerate(items) if NEEDLES.item_answer(item)]
    later = needles[-2]  # the last needle but one: a distractor after the gold one
    number = NEEDLES.item_answer(items[later])
    c = classify(f" {number}. The blue kite", False, items, gold_at, NEEDLES.render(items, example), NEEDLES)
    assert c.kind == "other_item" and c.item_index == later and c.rank_from_end == 1
    assert c.depth == pytest.approx(round(100 * later / (len(items) - 1), 1)) and c.offset == later - gold_at


def test_a_document_task_matches_text_items():
    mdqa = resolve_task("mdqa")
    docs = [{"title": "Oslo", "text": "Oslo is the capital of Norway."}, {"title": "Lima", "text": "Lima lies in Peru."}]
    prompt = "Document [1](Title: Oslo) ... Question: where?"
    c = classify("Peru", False, docs, 0, prompt, mdqa)
    assert (c.kind, c.item_index) == ("other_item", 1)
    assert classify("Atlantis", False, docs, 0, prompt, mdqa).kind == "made_up"


def answers_by(task, samples, rule):
    """``rule(example, percent, items, gold_at) -> answer`` at every position."""
    return {p: [rule(e, p, *place_gold(e, p)) for e in samples] for p in task.positions}


def value(task, item):
    return task.item_answer(item)


def test_position_bias_is_a_valid_task_and_its_shape_is_reported():
    """Right at both ends, another needle's value in the middle (Gemma-3 at 4k tokens)."""
    metadata = {"num_sentences": 20}
    samples = examples(NEEDLES, metadata, 20)

    def rule(example, percent, items, gold_at):
        if percent in (0, 100):
            return f" {example.answers[0]}."
        return f" {value(NEEDLES, [i for i in items if value(NEEDLES, i)][-2])}."  # the needle before the last

    removed = [" 1234567." for _ in samples]  # a made-up number without the gold item
    result = judge("multi_needle", answers_by(NEEDLES, samples, rule), removed, metadata=metadata)
    assert result["verdict"].startswith("measures retrieval") and "60 of 60 (100%) are another item's value" in result["verdict"]
    assert result["wrong_answers"]["counts"]["50"]["other_item"] == 20


def test_a_first_pair_policy_is_copying():
    """The first pair's value whatever was asked: right at 0 % only, and that policy explains it."""
    metadata = {"num_pairs": 6}
    samples = examples(KV, metadata, 10)
    result = judge("kv_retrieval", answers_by(KV, samples, lambda e, p, items, g: f" {items[0][1]}"),
                   [f" {e.distractors[0][1]}" for e in samples], metadata=metadata)
    fixed = result["wrong_answers"]["fixed_place"]
    assert (fixed["side"], fixed["rank"], fixed["share"], fixed["gold_there_at"]) == ("first", 0, 1.0, [0])
    assert "fixed-place policy explains its right answers (copying)" in result["verdict"]
    assert result["verdict"].startswith("does NOT measure retrieval")


def test_empty_answers_where_it_does_best_are_copying():
    """Right on most samples at 0 %, empty on the rest there and everywhere else (SmolLM2 kv_retrieval)."""
    metadata = {"num_pairs": 6}
    samples = examples(KV, metadata, 20)

    def rule(example, percent, items, gold_at):
        return f" {example.answers[0]}" if percent == 0 and samples.index(example) % 5 else ""

    result = judge("kv_retrieval", answers_by(KV, samples, rule), ["" for _ in samples], metadata=metadata)
    assert result["by_position"]["0"]["accuracy"] == 0.8
    assert "empty or made-up answers where it does best too (4 of 20 at 0 %)" in result["verdict"]


def test_a_position_bias_with_a_few_made_up_answers_in_the_middle_stays_valid():
    """Made-up numbers only where the gold is in the middle are part of the position effect."""
    metadata = {"num_sentences": 20}
    samples = examples(NEEDLES, metadata, 20)

    def rule(example, percent, items, gold_at):
        return f" {example.answers[0]}." if percent in (0, 100) else " 10000000000."

    result = judge("multi_needle", answers_by(NEEDLES, samples, rule), [" 10000000000." for _ in samples], metadata=metadata)
    assert result["verdict"].startswith("measures retrieval")
    assert result["wrong_answers"]["counts"]["25"]["made_up"] == 20


def test_judge_refuses_ragged_answers():
    with pytest.raises(ValueError, match="every position needs 2 answers"):
        judge("kv_retrieval", {p: [""] for p in KV.positions}, ["", ""])
