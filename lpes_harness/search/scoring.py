"""One forward pass per sample, with logits only where a gold answer is read.

lm-eval's ``loglikelihood`` gives the same ``(log-prob, is_greedy)`` pairs, but it computes the
full-vocabulary logits (and their log-softmax) at every prompt position and keeps only the
answer's few; for a 600-token prompt and a 49k vocabulary that output layer is about a fifth of
the model's FLOPs. And it runs the whole prompt again for every acceptable answer (a KV value
with and without quotes, MDQA's several answers).

Here each distinct prompt runs once through the decoder, keeping its KV cache; its answers then
cost one batched forward over their own few tokens on that cache, and the output layer runs
only at the answer positions (transformers' ``logits_to_keep``).

Tokenisation is lm-eval's own (``lm._encode_pair``, which moves the context's trailing spaces
into the continuation). A sequence longer than the model's window is truncated from the left
and scored alone, exactly as lm-eval does.
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
    """Score each ``(context, continuation)``; pairs that share a context share its forward pass.

    ``lm`` is an lm-eval HFLM (``lpes_hf`` included): its tokenizer, ``max_length`` and
    device are used as its own ``loglikelihood`` would use them.
    """
    encoded = [lm._encode_pair(context, continuation) for context, continuation in pairs]
    for (context, continuation), (_, answer) in zip(pairs, encoded):
        if not answer:
            raise ValueError(f"the answer {continuation!r} encodes to no tokens (context ends {context[-40:]!r})")
    by_context: dict[tuple[int, ...], list[int]] = {}
    for index, (context, answer) in enumerate(encoded):
        by_context.setdefault(tuple(context), []).append(index)
    results: list[AnswerScore | None] = [None] * len(pairs)
    for context, indices in by_context.items():
        answers = [encoded[i][1] for i in indices]
        for i, score in zip(indices, _score_context(lm, list(context), answers)):
            results[i] = score
    return results


@torch.inference_mode()
def _score_context(lm, context: list[int], answers: list[list[int]]) -> list[AnswerScore]:
    width = max(len(answer) for answer in answers)
    # One answer: a single forward over prompt + answer is cheapest (splitting it in two costs
    # an extra read of the weights, measured ~10 % on a CPU). Too long: lm-eval's truncation.
    if len(answers) == 1 or len(context) < 2 or len(context) + width > lm.max_length + 1:
        return [_score_alone(lm, context, answer) for answer in answers]
    from transformers import DynamicCache

    # Everything but the context's last token is shared; each answer then reads
    # [last context token] + answer[:-1], whose logits predict the answer's tokens.
    prefix = torch.tensor([context[:-1]], dtype=torch.long, device=lm.device)
    cache = DynamicCache(config=lm.model.config)
    lm.model.get_decoder()(prefix, past_key_values=cache, use_cache=True)  # no output layer: nothing to read
    # All answers in one batch on copies of that cache: on a CPU a forward over a few tokens
    # costs about one read of the weights, so one batched forward beats one per answer.
    # Rows are right-padded: under the causal mask no real token sees the padding after it.
    cache.batch_repeat_interleave(len(answers))
    rows = [[context[-1], *answer[:-1]] + [context[-1]] * (width - len(answer)) for answer in answers]
    steps = torch.tensor(rows, dtype=torch.long, device=lm.device)
    logits = lm.model(steps, past_key_values=cache, use_cache=True, logits_to_keep=width).logits
    return [_judge(logits[row, : len(answer)], answer) for row, answer in enumerate(answers)]


@torch.inference_mode()
def _score_alone(lm, context: list[int], answer: list[int]) -> AnswerScore:
    # lm-eval feeds (context + answer)[:-1], keeping the last max_length tokens.
    tokens = (context + answer)[-(lm.max_length + 1) :][:-1]
    inputs = torch.tensor([tokens], dtype=torch.long, device=lm.device)
    logits = lm.model(inputs, use_cache=False, logits_to_keep=len(answer)).logits[0]
    return _judge(logits, answer)


def _judge(logits: torch.Tensor, answer: list[int]) -> AnswerScore:
    logprobs = F.log_softmax(logits[-len(answer) :].float(), dim=-1)
    target = torch.tensor(answer, dtype=torch.long, device=logprobs.device)
    return AnswerScore(
        logprob=float(logprobs.gather(1, target[:, None]).sum()),
        is_greedy=bool((logprobs.argmax(dim=-1) == target).all()),
        num_tokens=len(answer),
    )
