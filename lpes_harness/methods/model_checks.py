"""What a method can run on: refused, before anything is changed, where it would be wrong."""

from __future__ import annotations


import torch
from torch import nn

from lpes_harness.core import rope, rope_anatomy, rope_math
from lpes_harness.methods.arguments import MethodError


# The methods re-implement a Llama-style attention (q/k/v/o projections, optional per-head
# q/k norms, rotate-half RoPE on the whole head, the model's attention kernel). The families
# where that was checked against the model's own attention (tests/test_families.py); any
# other model type is refused by the methods that rewrite attention. `gemma3` is Gemma-3's
# text decoder inside its vision wrapper (gemma-3-4b and up), the same attention
# (tests/test_methods_reductions.py).
VERIFIED_ATTENTION = ("llama", "mistral", "qwen2", "qwen3", "gemma", "granite", "gemma3_text", "gemma3")
_ATTENTION_CHILDREN = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}


def _refuse(who: str, model_type: str, reason: str, accepted: str) -> MethodError:
    return MethodError(f"{who} cannot run on model type '{model_type}': {reason}. {accepted}")


def check_model(
    model: nn.Module, who: str, rewrites_attention: bool
) -> tuple[rope_anatomy.RoPEParts, list[rope_math.LayerRoPE]]:
    """Refuse, before anything is changed, a model on which method ``who`` would be wrong.

    Returns the model's parts and each layer's RoPE (:class:`rope_math.LayerRoPE`). Every
    method recomputes RoPE itself as ``cos/sin(position_ids * inv_freq)``, so each of the
    model's RoPEs (one, or one per layer type as on Gemma-3) must be what its rotary call
    computes (not Cohere's interleaved layout, not Llama-4's complex ``freqs_cis``), and
    which call feeds which layer must be known (Gemma-3's ``layer_types``). A method that
    also rewrites each layer's attention (Ms-PoE, MoICE) needs the Llama-style attention it
    re-implements, in every layer (no NoPE layer, no partial rotary, no fused projections,
    no attention softcapping, causal), on a model type where that was verified.
    """
    try:
        parts = rope.check_supported(model)
    except rope_anatomy.LPESError as err:
        raise MethodError(f"{who} cannot run on this model: {err}") from err
    model_type = parts.model_type
    plain = ("Accepted: Llama-style models with plain RoPE, one for all layers or one per layer type "
             "(Llama, SmolLM2, Qwen2, Mistral, Gemma-3)")
    rotary = parts.rotary_emb
    config = rope_anatomy.decoder_config(parts, model)
    ropes = rope_math.layer_ropes(parts, config)
    rotary_function = rope_anatomy.RotaryFunction(rotary, model_type)
    if ropes is None:
        raise _refuse(
            who, model_type,
            f"its rotary embedding is called with {', '.join(map(repr, rotary_function.extra))}, and the config "
            f"does not say which call feeds which layer (as Gemma-3's `layer_types` does)",
            plain,
        )
    for layer_rope in rope_math.distinct(ropes):
        name, scaling = f"{layer_rope.prefix}inv_freq", f"{layer_rope.prefix}attention_scaling"
        if not isinstance(getattr(rotary, name, None), torch.Tensor) or not hasattr(rotary, scaling):
            raise _refuse(who, model_type, f"its rotary embedding {type(rotary).__name__} has no `{name}`", plain)
        device = layer_rope.inv_freq.device
        position_ids = torch.arange(8, device=device)[None]
        with torch.no_grad():
            # the undecorated forward: no dynamic-RoPE side effects
            own = rotary_function.function(rotary, torch.zeros(1, 8, 1, device=device), position_ids, **dict(layer_rope.key))
        ours = rope_math.cos_sin(position_ids, layer_rope.inv_freq, layer_rope.attention_scaling, torch.float32)
        if any(a.shape != b.shape or not torch.allclose(a.float(), b, atol=1e-6) for a, b in zip(own, ours)):
            raise _refuse(
                who, model_type,
                "its rotary embedding lays out (cos, sin) differently from cat(freqs, freqs) (e.g. interleaved pairs)",
                plain,
            )
    if not rewrites_attention:
        return parts, ropes

    nope = rope_anatomy.nope_layers_in(parts)
    if nope:
        raise _refuse(who, model_type, f"layers {sorted(nope)} apply no RoPE, and this method rotates every layer", plain)
    for name in ("attn_logit_softcapping", "clip_qkv"):
        if getattr(config, name, None) is not None:
            reason = f"its attention uses {name}={getattr(config, name)!r}, which this method does not re-implement"
            raise _refuse(who, model_type, reason, plain)
    for index, layer in enumerate(parts.layers):
        attn = getattr(layer, "self_attn", None)
        children = set(dict(attn.named_children())) if attn is not None else set()
        if attn is None or not {"q_proj", "k_proj", "v_proj", "o_proj"} <= children or children - _ATTENTION_CHILDREN:
            found = f"its attention has parts {sorted(children)}" if attn is not None else "it has no `self_attn`"
            raise _refuse(
                who, model_type,
                f"layer {index}: {found}, and this method re-implements a `self_attn` made of q_proj, k_proj, "
                f"v_proj, o_proj and optional per-head q_norm / k_norm",
                plain,
            )
        if not getattr(attn, "is_causal", True):
            raise _refuse(
                who, model_type,
                f"layer {index}: its attention is bidirectional (is_causal=False), and this method re-implements "
                f"causal attention",
                plain,
            )
        head_dim = getattr(attn, "head_dim", None)
        rotated = 2 * ropes[index].inv_freq.numel()
        if rotated != head_dim:
            raise _refuse(
                who, model_type,
                f"RoPE rotates {rotated} of the {head_dim} dimensions of a head (partial rotary), "
                f"and this method rotates whole heads",
                plain,
            )
        for norm in ("q_norm", "k_norm"):
            weight = getattr(getattr(attn, norm, None), "weight", None)
            if weight is not None and weight.shape[-1] != head_dim:
                raise _refuse(
                    who, model_type,
                    f"its {norm} normalises all heads together ({weight.shape[-1]} values), "
                    f"this method normalises per head",
                    plain,
                )
    if model_type not in VERIFIED_ATTENTION:
        raise _refuse(
            who, model_type,
            f"this method re-implements the attention of model types {', '.join(VERIFIED_ATTENTION)} (checked "
            f"against the model's own); '{model_type}' has not been checked",
            f"Accepted model types: {', '.join(VERIFIED_ATTENTION)}",
        )
    return parts, ropes
