"""lm-eval requests, and lm-eval's tokenisation of a (context, answer) pair.

The fitness and the answer-logits scorer build the requests lm-eval's own evaluator would
build, and tokenise exactly as its ``loglikelihood`` does; both go through here, so that a
change of lm-eval's request or tokenisation API touches this module only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def encode_pair(lm, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context tokens, continuation tokens) as HFLM's ``loglikelihood`` makes them.

    lm-eval moves the context's trailing spaces into the continuation, then encodes the whole
    and splits it (causal models).
    """
    context_tokens, continuation_tokens = lm._encode_pair(context, continuation)
    return list(context_tokens), list(continuation_tokens)


def loglikelihood_tokens(lm, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context tokens, continuation tokens) of one ``loglikelihood`` request, as lm-eval's
    ``TemplateLM.loglikelihood`` makes them: :func:`encode_pair`, or, for an empty context, the
    model's prefix token (BOS / EOS) as the context."""
    if context:
        return encode_pair(lm, context, continuation)
    tokens = list(lm.tok_encode(continuation, add_special_tokens=False))
    if tokens and tokens[0] == lm.prefix_token_id:
        return tokens[:1], tokens[1:]
    return [lm.prefix_token_id], tokens


def answer_token_count(lm, context: str, continuation: str) -> int:
    """How many tokens lm-eval scores for ``continuation`` after ``context`` (at least 1)."""
    return max(1, len(encode_pair(lm, context, continuation)[1]))


def loglikelihood_requests(pairs: Sequence[tuple[str, str]]) -> list:
    """One ``loglikelihood`` request per ``(context, continuation)``."""
    from lm_eval.api.instance import Instance

    return [Instance("loglikelihood", {}, tuple(pair), index) for index, pair in enumerate(pairs)]


def generate_requests(prompts: Iterable[tuple[Mapping[str, Any], str]], generation_kwargs: Mapping[str, Any]) -> list:
    """One ``generate_until`` request per ``(doc, prompt)``."""
    from lm_eval.api.instance import Instance

    kwargs = dict(generation_kwargs or {})
    return [Instance("generate_until", doc, (prompt, kwargs), index) for index, (doc, prompt) in enumerate(prompts)]
