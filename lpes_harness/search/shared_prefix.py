"""Several questions about one prompt from one forward of the text they share.

A ``multi_needle`` prompt holds eight needles and asks about one; asked about each of the others
(:func:`lpes_harness.search.gradient_samples.position_question_groups`) the prompt changes only in its question,
after the text. So the shared tokens go through the model once, into a key-value cache, and each question's own
tokens (the question, the chat template's turn, the answer prefix and the answer: about 40 tokens) run on top of
it, the cache cut back to the shared part after each. With a layer's RoPE factors installed the cached keys are
rotated as a full forward rotates them (cached generation equals full recomputation: the package's tests), so
each question's answer log-probabilities are those of its own full forward, within float rounding.

Why it pays: the questions about middle needles are where a model lost in the middle fails, and they are where a
curve's gain shows; eight questions cost about one forward of the text, not eight.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from lpes_harness.core.models import cache_keyword
from lpes_harness.search.gradient import TokenSample, _device


def shared_length(samples: Sequence[TokenSample]) -> int:
    """The tokens every sample's prompt begins with, less one: each sample keeps at least one prompt token of its
    own, so its first answer token is read from its own forward's last position."""
    first = samples[0].prompt
    shared = min(len(s.prompt) for s in samples) - 1
    for sample in samples[1:]:
        shared = min(shared, next((k for k, (a, b) in enumerate(zip(first, sample.prompt)) if a != b), shared))
    return max(shared, 0)


def group_log_probs(model: nn.Module, samples: Sequence[TokenSample]) -> list[torch.Tensor]:
    """Each sample's (answer length, vocabulary) log-probabilities, as
    :func:`~lpes_harness.search.gradient.answer_log_probs` gives them, from one forward of the shared prompt."""
    from transformers import DynamicCache

    device, shared = _device(model), shared_length(samples)
    cache = DynamicCache()
    keyword = {cache_keyword(model): cache}
    if shared:
        # One position's logits, not the shared text's thousands: the vocabulary projection is a fifth of
        # SmolLM2's weights, and nothing reads the prefix's logits.
        model(torch.tensor([samples[0].prompt[:shared]], device=device), use_cache=True, logits_to_keep=1, **keyword)
    out = []
    for sample in samples:
        own = torch.tensor([sample.prompt[shared:] + sample.answer], device=device)
        logits = model(own, use_cache=True, logits_to_keep=len(sample.answer) + 1, **keyword).logits[0, :-1]
        out.append(torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1))
        # A negative count: the tokens to drop, as both transformers 4.x's and 5.x's DynamicCache.crop read it.
        cache.crop(shared - cache.get_seq_length())
    return out
