"""The methods' attention rewrite: the model's own projections and attention kernel.

Attention modules compute ``q/k/v`` with ``q_proj/k_proj/v_proj``, rotate, update the cache,
then call the attention function chosen by ``config._attn_implementation``. :func:`attend`
calls that same function, so the trivial settings of the methods run the very kernel the
vanilla model runs.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from lpes_harness.methods.arguments import MethodError

SUPPORTED_ATTENTION = ("sdpa", "eager")


def check_attention_implementation(model: nn.Module, who: str) -> None:
    implementation = getattr(model.config, "_attn_implementation", None) or "eager"
    if implementation not in SUPPORTED_ATTENTION:
        raise MethodError(
            f"{who} rewrites the attention of each layer and supports attn_implementation "
            f"{' or '.join(SUPPORTED_ATTENTION)}; the model uses {implementation!r}. "
            f"Load it with attn_implementation=sdpa"
        )


def projections(attn: nn.Module, hidden_states: torch.Tensor):
    """Pre-RoPE ``q (B, Hq, T, D)``, ``k, v (B, Hkv, T, D)`` exactly as the model's attention makes them."""
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, attn.head_dim)
    q = attn.q_proj(hidden_states).view(hidden_shape)
    k = attn.k_proj(hidden_states).view(hidden_shape)
    if hasattr(attn, "q_norm"):  # Qwen3-style per-head norms come before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    v = attn.v_proj(hidden_states).view(hidden_shape)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def repeat_heads(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def attend(attn: nn.Module, query, key, value, attention_mask, **kwargs) -> torch.Tensor:
    """The model's own attention function on ``(query, key, value)``; returns ``(B, T, Hq, D)``.

    ``key``/``value`` may have fewer heads than ``query`` (grouped-query attention); the
    group size is taken from the shapes, not from the module, because the methods
    change the number of key heads (Ms-PoE keeps one rotated key per query head).
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    if key.shape[1] != value.shape[1]:
        value = repeat_heads(value, key.shape[1] // value.shape[1])
    view = types.SimpleNamespace(
        num_key_value_groups=query.shape[1] // key.shape[1],
        is_causal=True,
        training=False,
        layer_idx=attn.layer_idx,
        config=attn.config,
        head_dim=attn.head_dim,
    )
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager_attention_forward)
    kwargs.pop("output_attentions", None)
    output, _ = interface(
        view,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0,
        scaling=attn.scaling,
        sliding_window=getattr(attn, "sliding_window", None),
        **kwargs,
    )
    return output


def layer_cache(past_key_values, cache):
    """The KV cache handed to an attention layer: transformers 5.24 renamed ``past_key_values``
    to ``cache`` (the old name is deprecated until 5.40), so a replaced forward reads either.
    Missing it would silently drop the cache: each decoding step would attend to itself alone."""
    return past_key_values if past_key_values is not None else cache
