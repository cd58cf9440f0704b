"""Greedy decoding with a KV cache, for the methods whose forward is not the model's own."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn


def greedy_generate(
    next_logits: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor],
    new_cache: Callable[[], Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    max_length: int,
    eos_token_ids: Sequence[int] = (),
    pad_token_id: int | None = None,
    stopping_criteria=None,
) -> torch.Tensor:
    """Greedy decoding with a KV cache, as ``generate(do_sample=False)`` does it.

    ``next_logits(step_ids, attention_mask, position_ids, cache) -> (B, V)`` gives the
    last-position logits. Positions follow generate's rule for left padding:
    ``cumsum(mask) - 1``, with 1 on padding. Rows that emitted an end-of-sequence token
    continue with ``pad_token_id``, like generate.
    """
    batch = input_ids.shape[0]
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.device).long()
    sequences = input_ids
    cache = new_cache()
    unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
    eos = torch.tensor(list(eos_token_ids), device=input_ids.device, dtype=torch.long)
    step_ids = input_ids
    while sequences.shape[1] < max_length:
        positions = mask.cumsum(-1) - 1
        positions = positions.masked_fill(mask == 0, 1)[:, -step_ids.shape[1] :]
        logits = next_logits(step_ids, mask, positions, cache)
        next_tokens = logits.argmax(dim=-1)
        if pad_token_id is not None and eos.numel():
            next_tokens = torch.where(unfinished, next_tokens, torch.full_like(next_tokens, pad_token_id))
        sequences = torch.cat([sequences, next_tokens[:, None]], dim=-1)
        mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=-1)
        if eos.numel():
            unfinished &= ~torch.isin(next_tokens, eos)
        if stopping_criteria is not None:
            unfinished &= ~stopping_criteria(sequences, None)
        if not unfinished.any():
            break
        step_ids = next_tokens[:, None]
    return sequences


def eos_ids(model: nn.Module) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def generate_with(forward_logits, model: nn.Module, input_ids, attention_mask=None, max_length=None,
                  max_new_tokens=None, stopping_criteria=None, pad_token_id=None) -> torch.Tensor:
    """``generate(do_sample=False)`` for a method whose logits come from its own
    ``forward_logits(model, ids, mask, positions, cache, last_only=True)``: one ``DynamicCache`` holds every
    copy the method runs (Buckets' K bases, FitM's dummy copies, PCD's two)."""
    from transformers import DynamicCache

    if max_length is None:
        max_length = input_ids.shape[1] + (max_new_tokens or 20)

    def next_logits(step_ids, mask, positions, cache):
        return forward_logits(model, step_ids, mask, positions, cache, last_only=True)

    return greedy_generate(next_logits, lambda: DynamicCache(config=model.config), input_ids, attention_mask,
                           max_length, eos_token_ids=eos_ids(model), pad_token_id=pad_token_id,
                           stopping_criteria=stopping_criteria)
