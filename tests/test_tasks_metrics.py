"""LitM's metrics: SQuAD normalisation, best_subspan_em on the first line, KV substring accuracy."""

import pytest

from lpes_harness.tasks.metrics import best_subspan_em, normalize_answer, substring_accuracy


@pytest.mark.parametrize(
    "text, normalized",
    [
        ("The  Quick, Brown fox!", "quick brown fox"),  # case, punctuation, article, spaces
        ("an apple a day", "apple day"),
        ("Theater", "theater"),  # articles only as whole words
        ("U.S. Army", "us army"),  # punctuation removed, not replaced by a space
        ("  Wilhelm Conrad Röntgen\t", "wilhelm conrad röntgen"),
    ],
)
def test_normalize_answer_follows_squad(text, normalized):
    assert normalize_answer(text) == normalized


def test_best_subspan_em_finds_a_normalised_gold_answer_inside_the_prediction():
    assert best_subspan_em("The answer is the U.S. Army.", ["US Army"]) == 1.0
    assert best_subspan_em("paris", ["Lyon", "PARIS"]) == 1.0  # any of the gold answers
    assert best_subspan_em("Wilhelm", ["Wilhelm Conrad Röntgen"]) == 0.0  # gold in prediction, not the reverse


def test_best_subspan_em_only_reads_the_first_line():
    # Copying the context back would always contain the answer; LitM cuts at the first newline.
    assert best_subspan_em("I do not know.\nParis", ["Paris"]) == 0.0
    assert best_subspan_em("  Paris\nLyon", ["Lyon"]) == 0.0


def test_kv_substring_accuracy_is_case_insensitive_and_exact_on_the_value():
    assert substring_accuracy(' "869AB4E4"', ["869ab4e4"]) == 1.0
    assert substring_accuracy(" 212a348", ["212a348a"]) == 0.0  # one digit short
    assert substring_accuracy("", ["212a348a"]) == 0.0
