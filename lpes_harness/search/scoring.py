"""One forward pass per (context, gold answer), with logits only where the answer is read.

lm-eval's ``loglikelihood`` gives the same ``(log-prob, is_greedy)`` pair, but it computes the
full-vocabulary logits (and their log-softmax) at every prompt position and then keeps only
the answer's few. For a 600-token prompt and a 49k vocabulary that output layer is about a
fifth of the model's FLOPs, spent on numbers nobody reads. Here the decoder runs once over
the whole sequence and the output layer only over the answer positions (transformers'
``logits_to_keep``).

Tokenisation is lm-eval's own (``lm._encode_pair``, which moves the context's trailing
spaces into the continuation), and the input is truncated from the left to the model's
length exactly as lm-eval does, so both paths score the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AnswerScore:
    logprob: float  # sum of the answer tokens' log-probabilities (lm-eval's first value)
    is_greedy: bool  # every answer token is the argmax: greedy decoding writes the answer
    num_tokens: int


def score_answers(lm, pairs: Sequence[tuple[str, str]]) -> list[AnswerScore]:
    """Score each ``(context, continuation)`` with one forward pass of ``lm.model``.

    ``lm`` is an lm-eval HFLM (``lpes_hf`` included): its tokenizer, ``max_length`` and
    device are used as its own ``loglikelihood`` would use them.
    """
    return [_score_one(lm, context, continuation) for context, continuation in pairs]


@torch.inference_mode()
def _score_one(lm, context: str, continuation: str) -> AnswerScore:
    context_tokens, answer_tokens = lm._encode_pair(context, continuation)
    if not answer_tokens:
        raise ValueError(f"the answer {continuation!r} encodes to no tokens")
    # lm-eval feeds (context + answer)[:-1], keeping the last max_length tokens.
    tokens = (context_tokens + answer_tokens)[-(lm.max_length + 1) :][:-1]
    inputs = torch.tensor([tokens], dtype=torch.long, device=lm.device)
    logits = _answer_logits(lm.model, inputs, len(answer_tokens))
    logprobs = F.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(answer_tokens, dtype=torch.long, device=logprobs.device)
    return AnswerScore(
        logprob=float(logprobs.gather(1, target[:, None]).sum()),
        is_greedy=bool((logprobs.argmax(dim=-1) == target).all()),
        num_tokens=len(answer_tokens),
    )


def _answer_logits(model, inputs: torch.Tensor, num_answer_tokens: int) -> torch.Tensor:
    """The logits of the last ``num_answer_tokens`` input positions, shape [n, vocab]."""
    try:
        output = model(inputs, logits_to_keep=num_answer_tokens, use_cache=False)
    except TypeError:  # a model class without logits_to_keep: full logits, then slice
        output = model(inputs, use_cache=False)
    return output.logits[0, -num_answer_tokens:]
