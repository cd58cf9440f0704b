"""Attention Buckets (Chen et al., 2023): ``install`` on a model; ``buckets_hf`` runs it in lm-eval.

    lm_eval --model buckets_hf --model_args "bases=1.0;1.3;1.6;1.9;2.2;2.5;2.8" --tasks mdqa

The model runs K times in parallel, each copy with its own RoPE base (all layers), batched
together along the batch dimension (copy k holds rows ``k*B .. k*B+B-1``), so each copy
keeps its own KV cache inside one cache object. At every step the K last-token logit
vectors are merged with weights ``softmax_k(max_vocab logits_k)``: the copy whose top
token is most confident counts most (the authors' ``base_mean`` path, a weighted sum of
raw logits).

- ``bases`` are given *relative to the model's theta* (``1.3`` means ``1.3 * theta``); the
  default is the set of the authors' RAG experiments, ``[10000, 13000, ..., 28000]`` for
  Llama 2's ``theta = 10000``, i.e. ``1.0;1.3;1.6;1.9;2.2;2.5;2.8``. ``absolute_bases=true``
  takes the numbers as bases as they are.
- On a model whose layer types have their own RoPE (Gemma-3: sliding layers theta = 10k,
  full layers 1M), the bases are relative to *each layer type's* theta: copy k runs every
  layer at ``bases[k]`` times its own type's theta (``1.3`` -> 13k on sliding layers, 1.3M on
  full ones), which keeps the model's ratio between the types, as one base per copy does
  on a model with one RoPE. ``absolute_bases=true`` is refused there: one number cannot
  say which type's base it is.
- ``loglikelihood`` merges the logits the same way at each answer position (each position
  is the "last token" of its prefix). One forward of the K copies through the decoder, and
  the output layer only at the answer's positions, for every copy: the numbers lm-eval's own
  path gives (full-vocabulary logits of all K copies at every position, merged), at a
  fraction of the cost (docs/baselines.md).
- Generation is greedy, with its own decoding loop: the K copies must share one merged
  token per step, which ``generate()`` cannot express. Sampling arguments are refused.
- Only plain RoPE (``rope_type: default``) has a base to change, on every layer type
  (gemma-3-4b and up use linear scaling on their full layers: refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lpes_harness.core import rope_anatomy, rope_math
from lpes_harness.core.arg_values import parse_bool
from lpes_harness.methods import METHODS, arguments, decoding, model_checks
from lpes_harness.methods.arguments import MethodError
from lpes_harness.methods.state import MethodState, Slot
from lpes_harness.core.models import cache_keyword, output_layer

ENTRY = METHODS["buckets"]
# The authors' RAG base set (base_rag/test_nq_kl.py), relative to Llama 2's theta = 10000.
DEFAULT_RELATIVE_BASES = ENTRY.parameter("bases").default


@dataclass
class _BucketsState(MethodState):
    relative_bases: list[float]  # the K bases as multiples of theta (of each layer type's theta)
    # Per RoPE (None: the model's one RoPE, else a layer type): its K absolute bases.
    bases: dict[str | None, list[float]]
    ropes: dict[tuple, rope_math.LayerRoPE]  # per rotary call (LayerRoPE.key): the RoPE it computes
    inv_freq: dict[tuple, torch.Tensor]  # per rotary call: (K, D/2), row k at base k
    recorder: rope_math.PositionRecorder


SLOT = Slot("_buckets_state", "Attention Buckets", "buckets")


def resolve_bases(thetas: dict[str | None, float], model_type: str, bases: Any = None,
                  absolute_bases: bool = False) -> tuple[list[float], dict[str | None, list[float]]]:
    """``(relative, {layer type or None: absolute})``: each RoPE's K bases, from its own theta.

    ``thetas``: per layer type (None: the model's one RoPE), its theta."""
    given = list(DEFAULT_RELATIVE_BASES) if bases is None else arguments.parse_float_list("bases", bases)
    if absolute_bases and len(thetas) > 1:
        found = ", ".join(f"{t} theta={theta:g}" for t, theta in thetas.items())
        raise MethodError(
            f"buckets_hf: absolute_bases=true is ambiguous on model type '{model_type}', whose layer types each have "
            f"their own RoPE base ({found}); give bases relative to each layer type's theta (absolute_bases=false)"
        )
    if absolute_bases:
        (theta,) = thetas.values()
        return [b / theta for b in given], {t: [float(b) for b in given] for t in thetas}
    return [float(b) for b in given], {t: [theta * float(b) for b in given] for t, theta in thetas.items()}


def install(model: nn.Module, bases: Any = None, absolute_bases: bool = False) -> nn.Module:
    """Make row block k of every batch use RoPE base ``bases[k]`` (times each layer type's theta).
    Inputs must be repeated K times."""
    SLOT.free(model)
    absolute_bases = parse_bool("absolute_bases", absolute_bases, MethodError)
    parts, layer_ropes = model_checks.check_model(model, "buckets_hf", rewrites_attention=False)
    config = rope_anatomy.decoder_config(parts, model)
    ropes = rope_math.distinct(layer_ropes)
    thetas = {r.layer_type: rope_math.rope_theta(config, parts.model_type, r.layer_type) for r in ropes}
    relative, absolute = resolve_bases(thetas, parts.model_type, bases, absolute_bases)
    inv_freq = {}
    for r in ropes:  # each layer type's K bases, from its own frequencies and theta
        inv_freq[r.key] = torch.stack([rope_math.inv_freq_for_base(r.inv_freq, thetas[r.layer_type], b)
                                       for b in absolute[r.layer_type]])
    ropes_by_key = {r.key: r for r in ropes}
    state = _BucketsState(relative, absolute, ropes_by_key, inv_freq, recorder=None)  # type: ignore[arg-type]

    def per_block_rope(x, position_ids, output, key):
        n_bases, batch = len(state.relative_bases), x.shape[0]
        if batch % n_bases:
            raise RuntimeError(
                f"Attention Buckets: the batch ({batch} rows) is not {n_bases} copies of the input; "
                "call the model through buckets.forward_logits"
            )
        if key not in state.inv_freq:
            raise RuntimeError(f"Attention Buckets: a rotary call {key} that the model's layer types did not announce")
        position_ids = position_ids.expand(batch, -1)  # (1, T) when the model made them itself
        rows = state.inv_freq[key].to(position_ids.device).repeat_interleave(batch // n_bases, dim=0)
        return rope_math.cos_sin(position_ids, rows[:, None, :], state.ropes[key].attention_scaling, x.dtype)

    state.recorder = rope_math.PositionRecorder(parts, replace=per_block_rope)
    state.changes.on_remove(state.recorder.remove)
    return SLOT.attach(model, state)


remove = SLOT.remove  # takes every change off: the model as it was
get_state = SLOT.get


def settings(model: nn.Module) -> dict:
    """The installed bases, for lm-eval's model info: one RoPE's K bases, or {layer type: its K bases}."""
    bases = get_state(model).bases
    return {"bases": bases[None] if list(bases) == [None] else bases}


def check_arguments(bases: Any = None, absolute_bases: Any = False) -> None:
    """What install checks that needs no model (``buckets_hf`` runs it before the model loads)."""
    parse_bool("absolute_bases", absolute_bases, MethodError)
    if bases is not None:
        arguments.parse_float_list("bases", bases)


def merge_logits(logits: torch.Tensor) -> torch.Tensor:
    """``(K, ..., V)`` -> ``(..., V)``: sum_k softmax_k(max_v logits_k) * logits_k."""
    weights = torch.softmax(logits.float().max(dim=-1).values, dim=0)  # (K, ...)
    return (weights[..., None] * logits.float()).sum(dim=0)


def forward_logits(model: nn.Module, input_ids, attention_mask=None, position_ids=None, past_key_values=None, last_only=False):
    """One forward of the K copies; returns merged logits ``(B, T, V)`` (``(B, V)`` with ``last_only``)."""
    n_bases = len(get_state(model).relative_bases)
    repeat = lambda t: None if t is None else t.repeat(n_bases, *([1] * (t.dim() - 1)))  # noqa: E731
    out = model(
        input_ids=repeat(input_ids),
        attention_mask=repeat(attention_mask),
        position_ids=repeat(position_ids),
        use_cache=past_key_values is not None,
        **{cache_keyword(model): past_key_values},
        logits_to_keep=1 if last_only else 0,
    )
    logits = out.logits.reshape(n_bases, input_ids.shape[0], *out.logits.shape[1:])
    merged = merge_logits(logits)
    return merged[:, -1] if last_only else merged


def answer_logits(model: nn.Module, input_ids, rows, columns) -> torch.Tensor:
    """Merged logits ``(n, V)`` at positions ``(rows[i], columns[i])`` of ``input_ids`` ``(B, T)``:
    one forward of the K copies through the decoder, the output layer only at those positions
    (for every copy), merged as :func:`forward_logits` merges them."""
    n_bases = len(get_state(model).relative_bases)
    hidden = model.get_decoder()(input_ids=input_ids.repeat(n_bases, 1), use_cache=False).last_hidden_state
    hidden = hidden.reshape(n_bases, input_ids.shape[0], *hidden.shape[1:])[:, rows, columns]  # (K, n, H)
    return merge_logits(output_layer(model, hidden))


def generate(model: nn.Module, input_ids, attention_mask=None, max_length=None, max_new_tokens=None,
             stopping_criteria=None, pad_token_id=None):
    """Greedy decoding of the merged K copies, with one KV cache holding all of them."""
    return decoding.generate_with(forward_logits, model, input_ids, attention_mask, max_length, max_new_tokens,
                                  stopping_criteria, pad_token_id)
