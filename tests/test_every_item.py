"""``--every-item`` (issue #100): a prompt asked about every needle it holds, all scored from one forward of the text
the questions share. Tiny random models built in code, CPU only."""

import re

import pytest
import torch

from lpes_harness.core import rope
from lpes_harness.search.drawn_conditions import draw_conditions
from lpes_harness.search.gradient import TokenSample, answer_log_probs
from lpes_harness.search.shared_prefix import group_log_probs, shared_length
from lpes_harness.tasks.position import build_examples, build_docs, item_docs, resolve_options, resolve_task
from test_search_gradient import SMALL_NEEDLES, chars, chat_checkpoint, load_lm  # noqa: F401 (a fixture)
from tiny_models import random_ids, tiny_gemma3, tiny_model

L = 4


def group(shared=30, own=(5, 9, 1), answer=3, seed=20):
    """Samples whose prompts begin with the same ``shared`` tokens, then differ (own tails of the given lengths)."""
    head = random_ids(shared, seed=seed)[0].tolist()
    out = []
    for k, tail in enumerate(own):
        ids = random_ids(tail + answer, seed=seed + 1 + k)[0].tolist()
        out.append(TokenSample(tuple(head + ids[:tail]), tuple(ids[tail:])))
    return out


def test_the_shared_length_leaves_every_prompt_a_token_of_its_own():
    samples = group(shared=30, own=(5, 9, 1))
    assert shared_length(samples) == 30  # the 1-token tail is its own
    same = [samples[0], samples[0]]
    assert shared_length(same) == len(samples[0].prompt) - 1
    assert shared_length([samples[0]]) == len(samples[0].prompt) - 1


@pytest.mark.parametrize("scaling, factors", [
    ("position", [1.0] * L),
    ("position", [0.6, 1.0, 1.4, 1.9]),
    ("both", [0.6, 1.0, 1.4, 1.9, 0.5, 0.8, 1.0, 2.0]),
])
def test_one_forward_of_the_shared_text_gives_each_questions_own_forward(scaling, factors):
    model = tiny_model("llama", max_position_embeddings=4096).eval()
    rope.install(model, factors, scaling)
    samples = group()
    with torch.no_grad():
        together = group_log_probs(model, samples)
        alone = [answer_log_probs(model, s) for s in samples]
    assert [t.shape for t in together] == [a.shape for a in alone]
    for t, a in zip(together, alone):
        torch.testing.assert_close(t, a, rtol=0, atol=2e-5)
        assert t.argmax(-1).tolist() == a.argmax(-1).tolist()
    # The cache is cut back after each question: scoring them in the other order changes nothing.
    with torch.no_grad():
        backwards = group_log_probs(model, samples[::-1])[::-1]
    for t, b in zip(together, backwards):
        torch.testing.assert_close(t, b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("factors", [None, [1.0, 1.6, 1.0, 2.1, 3.0, 2.0, 4.5, 1.5]])
def test_a_model_with_sliding_window_layers_scores_the_shared_text_once_as_each_question_alone(factors):
    # Gemma-3's sliding layers see 8 tokens back here and the shared text is 30: a cache that let them see the
    # whole text, or cut back the wrong keys, would score the questions otherwise than their own forwards.
    model = tiny_gemma3().eval()
    if factors is not None:  # base factors on every layer, position factors on the global ones (1 elsewhere)
        rope.install(model, factors, "both")
    samples = group()
    assert len(samples[0].prompt) > 3 * model.config.sliding_window
    with torch.no_grad():
        together = group_log_probs(model, samples)
        alone = [answer_log_probs(model, s) for s in samples]
    for t, a in zip(together, alone):
        torch.testing.assert_close(t, a, rtol=0, atol=2e-5)


def multi_needle_example(percent=50, num_needles=4, num_sentences=6):
    task = resolve_task("multi_needle")
    options, _ = resolve_options(task, {"num_needles": num_needles, "num_sentences": num_sentences, "split": "search",
                                        "num_samples": 2})
    index, example = build_examples(task, options)[1]
    doc = next(d for d in build_docs(task, percent, options) if d["sample_index"] == index)
    return task, example, doc, index


@pytest.mark.parametrize("percent", [0, 50, 100])
def test_a_prompt_asked_about_each_other_needle_differs_only_in_its_question(percent):
    task, example, doc, index = multi_needle_example(percent)
    asked = item_docs(task, example, percent, index)
    assert len(asked) == 3  # four needles: the gold one and three others
    question = "What is the special magic number for {}?"
    haystack = doc["prompt"][:doc["prompt"].index(question.format(doc["city"]))]
    for one in asked:
        number = re.search(rf"The special magic number for {one['city']} is (\d+)\.", haystack).group(1)
        assert one["answers"] == [number] and one["target"] == number and number != doc["target"]
        assert one["prompt"] == haystack + question.format(one["city"])  # the same text, another question
        assert one["answer_prefix"] == f"The special magic number for {one['city']} is"
        assert one["sample_index"] == index and one["gold_index"] == one["asked_item"] != doc["gold_index"]
        assert one["gold_percent"] == round(100 * one["gold_index"] / (one["num_items"] - 1))
    assert sorted(d["city"] for d in asked) == sorted(doc["distractor_cities"].split(","))


def test_a_task_whose_items_cannot_be_asked_about_gives_no_other_questions():
    task = resolve_task("needle")
    options, _ = resolve_options(task, {"split": "search", "num_samples": 1})
    index, example = build_examples(task, options)[0]
    assert task.ask_item is None and item_docs(task, example, 50, index) == []


def test_question_groups_start_with_the_drawn_sample_and_share_its_text(chat_checkpoint):  # noqa: F811
    from lpes_harness.search.gradient_samples import position_question_groups, position_token_samples

    lm = load_lm(chat_checkpoint)
    conditions = draw_conditions(5, 3, SMALL_NEEDLES)
    groups = position_question_groups(lm, "multi_needle", "search", conditions, (0, 50, 100), seed=3)
    alone = position_token_samples(lm, "multi_needle", "search", conditions, (0, 50, 100), seed=3)
    assert [g[0] for g in groups] == alone  # the drawn sample, token for token
    for members, condition in zip(groups, conditions):
        assert len(members) == condition["num_needles"]  # one question a needle
        answers = [chars(lm, m.answer).strip() for m in members]
        assert len(set(answers)) == len(answers)
        for i, member in enumerate(members):
            # Each question's rivals are the other needles' numbers (the drawn sample's gold among them).
            assert sorted(chars(lm, o).strip() for o in member.others) == sorted(set(answers) - {answers[i]})
            assert ("asked_item" in member.condition) == (i > 0)
        # The text before the question is shared: the cached forward covers all but the questions' own tokens
        # (question, chat turn, answer prefix: about 60 characters of the tiny tokenizer).
        tails = [len(m.prompt) - shared_length(members) for m in members]
        assert max(tails) < 100 < shared_length(members)
    with torch.no_grad():
        for members in groups:
            for together, member in zip(group_log_probs(lm.model, members), members):
                torch.testing.assert_close(together, answer_log_probs(lm.model, member), rtol=0, atol=2e-5)


def test_every_item_is_refused_for_a_task_that_cannot_ask_about_its_items(tmp_path, capsys):
    from lpes_harness.commands.search_cli import parse_args

    with pytest.raises(SystemExit) as stop:
        parse_args(["--search-method", "racing", "--profile", "cpu", "--task", "needle", "--every-item",
                    "--output", str(tmp_path / "x")])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "cannot ask a prompt about its other items" in error[0], error
    assert not (tmp_path / "x").exists()
