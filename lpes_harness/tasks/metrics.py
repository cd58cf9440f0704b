"""Scoring functions of "Lost in the Middle" (Liu et al., 2023), rewritten here.

- KV retrieval: the gold value, case-insensitively, anywhere in the answer.
- Multi-document QA: ``best_subspan_em``. The answer is cut at its first line (so a
  model cannot win by copying the context back, which always holds the answer),
  SQuAD-normalised, and scores 1 when any normalised gold answer is a substring of it.
"""

import re
import string
from collections.abc import Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation, drop articles, squeeze spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def first_line(text: str) -> str:
    return text.split("\n")[0].strip()


def best_subspan_em(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when a normalised gold answer occurs in the normalised first line of ``prediction``."""
    normalized_prediction = normalize_answer(first_line(prediction))
    for answer in answers:
        if normalize_answer(answer) in normalized_prediction:
            return 1.0
    return 0.0


def substring_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """LitM's KV-retrieval accuracy: a gold value, any case, anywhere in the answer."""
    prediction = prediction.lower()
    return 1.0 if any(answer.lower() in prediction for answer in answers) else 0.0
