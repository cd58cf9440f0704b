"""Shared pieces of the baselines: RoPE at other bases or positions, attention calls, greedy decoding.

The baselines need what :mod:`lpes_harness.rope` does not give: per-head positions
(Ms-PoE), several RoPE bases in one layer (MoICE) or per batch row (Attention Buckets).
They all start from the same facts about transformers 5.x decoders:

- the model-level ``rotary_emb`` is called once per forward with ``position_ids``, which
  already account for left padding and for the KV-cache offset; a forward hook on it
  records them (:class:`PositionRecorder`);
- its ``forward`` is ``cos/sin(position_ids[..., None] * inv_freq) * attention_scaling``,
  elementwise, so :func:`cos_sin` with the model's own ``inv_freq`` reproduces it bit for
  bit, and another base only changes ``inv_freq`` (:func:`inv_freq_for_base`);
- attention modules compute ``q/k/v`` with ``q_proj/k_proj/v_proj``, rotate, update the
  cache, then call the attention function chosen by ``config._attn_implementation``.
  :func:`attend` calls that same function, so the trivial settings of the baselines run
  the very kernel the vanilla model runs.
"""

from __future__ import annotations

import inspect
import math
import types
from typing import Any, Callable, Sequence

import torch
from torch import nn

from lpes_harness import rope, rope_anatomy
from lpes_harness.arg_values import number_list

SUPPORTED_ATTENTION = ("sdpa", "eager")


class BaselineError(rope_anatomy.LPESError):
    """Bad input to a baseline: the message names what was given and what is accepted."""


# ----------------------------------------------------------------------------- argument parsing


def parse_float_list(name: str, value: Any, minimum_exclusive: float | None = 0.0) -> list[float]:
    """``1.0;1.3;1.6`` (or a number, or a list) -> floats, each checked."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        values = [float(value)]
    elif isinstance(value, (list, tuple)):
        values = [float(v) for v in value]
    else:
        text = str(value).strip()
        try:
            values = number_list(text, ";,")
        except ValueError:
            raise BaselineError(f"{name}={value!r} is not understood; give numbers separated by ';'") from None
    if not values:
        raise BaselineError(f"{name}={value!r} is empty; give numbers separated by ';'")
    for v in values:
        if not math.isfinite(v) or (minimum_exclusive is not None and v <= minimum_exclusive):
            raise BaselineError(f"{name}={value!r}: every value must be a finite number > {minimum_exclusive:g}")
    return values


def parse_layers(value: Any, n_layers: int, default_start: int = 0) -> list[int]:
    """``None`` -> ``default_start..L-1``; ``"2:"`` / ``"2:10"`` (a slice) or ``"2;3;5"`` -> layer indices."""
    if value is None:
        return list(range(min(default_start, n_layers), n_layers))
    text = ";".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value).strip()
    accepted = "a slice like '2:' or '2:10', or indices separated by ';' (e.g. '2;3;5')"
    try:
        if ":" in text:
            start, _, stop = text.partition(":")
            layers = list(range(n_layers))[slice(int(start) if start else None, int(stop) if stop else None)]
        else:
            layers = sorted({int(part) for part in text.split(";") if part.strip()})
    except ValueError:
        raise BaselineError(f"layers={value!r} is not understood; give {accepted}") from None
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad or not layers:
        raise BaselineError(f"layers={value!r} selects {bad or 'no layers'}; the model has layers 0..{n_layers - 1}")
    return layers


# ----------------------------------------------------------------------------- RoPE


def rope_theta(model: nn.Module) -> float:
    """The model's RoPE base, for models whose RoPE is the plain ('default') kind."""
    config = model.config
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise BaselineError(
            f"this baseline changes the RoPE base, which is defined only for plain RoPE; the model "
            f"(model type '{rope_anatomy.model_type_of(model)}') uses rope_type={rope_type!r}. Accepted: models with "
            f"rope_type 'default' (Llama 2, SmolLM2, Qwen2, Mistral)"
        )
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise BaselineError(
            f"the model config (model type '{rope_anatomy.model_type_of(model)}') has no rope_theta; cannot derive RoPE bases from it"
        )
    return float(theta)


def inv_freq_for_base(rotary_emb: nn.Module, theta: float, base: float) -> torch.Tensor:
    """``1 / base^(2i/d)``, derived from the model's own ``inv_freq = 1 / theta^(2i/d)``.

    Raising to ``ln(base)/ln(theta)`` keeps the model's dimension layout (partial rotary
    included) and is exact when ``base == theta`` (the power is then exactly 1).
    """
    inv_freq = rotary_emb.inv_freq.float()
    if base == theta:
        return inv_freq.clone()
    return inv_freq ** (math.log(base) / math.log(theta))


def cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor, attention_scaling: float, dtype: torch.dtype):
    """What ``rotary_emb.forward`` computes, for any ``inv_freq`` broadcastable to ``position_ids[..., None]``."""
    freqs = position_ids[..., None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention_scaling).to(dtype), (emb.sin() * attention_scaling).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return (x * cos) + (rotate_half(x) * sin)


class PositionRecorder:
    """Forward hook on ``rotary_emb``: remembers each call's ``position_ids`` (and may replace its output)."""

    def __init__(self, rotary_emb: nn.Module, replace: Callable | None = None):
        self.position_ids: torch.Tensor | None = None
        self.replace = replace
        self.handle = rotary_emb.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        position_ids = kwargs["position_ids"] if "position_ids" in kwargs else args[1]
        self.position_ids = position_ids
        if self.replace is not None:
            x = kwargs["x"] if "x" in kwargs else args[0]
            return self.replace(x, position_ids, output)
        return None

    def remove(self) -> None:
        self.handle.remove()


# ----------------------------------------------------------------------------- what a baseline can run on

# The baselines re-implement a Llama-style attention (q/k/v/o projections, optional per-head
# q/k norms, rotate-half RoPE on the whole head, the model's attention kernel). The families
# where that was checked against the model's own attention (tests/test_families.py); any
# other model type is refused by the baselines that rewrite attention.
VERIFIED_ATTENTION = ("llama", "mistral", "qwen2", "qwen3", "gemma", "granite")
_ATTENTION_CHILDREN = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}


def _refuse(who: str, model_type: str, reason: str, accepted: str) -> BaselineError:
    return BaselineError(f"{who} cannot run on model type '{model_type}': {reason}. {accepted}")


def check_model(model: nn.Module, who: str, rewrites_attention: bool) -> rope_anatomy.RoPEParts:
    """Refuse, before anything is changed, a model on which baseline ``who`` would be wrong.

    Every baseline recomputes RoPE itself as ``cos/sin(position_ids * inv_freq)``, so the
    model's rotary embedding must be one ``rotary_emb(x, position_ids)`` call per forward
    (not Gemma-3's one call per layer type) whose output that formula reproduces (not
    Cohere's interleaved layout, not Llama-4's complex ``freqs_cis``). A baseline that also
    rewrites each layer's attention (Ms-PoE, MoICE) needs the Llama-style attention it
    re-implements, in every layer (no NoPE layer, no partial rotary, no fused projections,
    no attention softcapping), on a model type where that was verified.
    """
    try:
        parts = rope.check_supported(model)
    except rope_anatomy.LPESError as err:
        raise BaselineError(f"{who} cannot run on this model: {err}") from err
    model_type = parts.model_type
    plain = "Accepted: Llama-style models with one plain RoPE for all layers (Llama, SmolLM2, Qwen2, Mistral)"
    rotary = parts.rotary_emb
    extra = [name for name in list(inspect.signature(type(rotary).forward).parameters)[3:]]
    if extra:
        raise _refuse(
            who, model_type,
            f"its rotary embedding is called with {', '.join(map(repr, extra))} (a different RoPE per layer type, "
            f"e.g. Gemma-3's 10k sliding / 1M full bases), and this baseline applies one RoPE to every layer",
            plain,
        )
    if not isinstance(getattr(rotary, "inv_freq", None), torch.Tensor) or not hasattr(rotary, "attention_scaling"):
        raise _refuse(who, model_type, f"its rotary embedding {type(rotary).__name__} has no `inv_freq`", plain)
    device = rotary.inv_freq.device
    position_ids = torch.arange(8, device=device)[None]
    forward = rope_anatomy.undecorated_forward(type(rotary).forward)  # no dynamic-RoPE side effects
    with torch.no_grad():
        own = forward(rotary, torch.zeros(1, 8, 1, device=device), position_ids)
    ours = cos_sin(position_ids, rotary.inv_freq, rotary.attention_scaling, torch.float32)
    if any(a.shape != b.shape or not torch.allclose(a.float(), b, atol=1e-6) for a, b in zip(own, ours)):
        raise _refuse(
            who, model_type,
            "its rotary embedding lays out (cos, sin) differently from cat(freqs, freqs) (e.g. interleaved pairs)",
            plain,
        )
    if not rewrites_attention:
        return parts

    config = rope_anatomy.decoder_config(parts, model)
    nope = rope_anatomy.nope_layers_in(parts)
    if nope:
        raise _refuse(who, model_type, f"layers {sorted(nope)} apply no RoPE, and this baseline rotates every layer", plain)
    for name in ("attn_logit_softcapping", "clip_qkv"):
        if getattr(config, name, None) is not None:
            reason = f"its attention uses {name}={getattr(config, name)!r}, which this baseline does not re-implement"
            raise _refuse(who, model_type, reason, plain)
    for index, layer in enumerate(parts.layers):
        attn = getattr(layer, "self_attn", None)
        children = set(dict(attn.named_children())) if attn is not None else set()
        if attn is None or not {"q_proj", "k_proj", "v_proj", "o_proj"} <= children or children - _ATTENTION_CHILDREN:
            found = f"its attention has parts {sorted(children)}" if attn is not None else "it has no `self_attn`"
            raise _refuse(
                who, model_type,
                f"layer {index}: {found}, and this baseline re-implements a `self_attn` made of q_proj, k_proj, "
                f"v_proj, o_proj and optional per-head q_norm / k_norm",
                plain,
            )
        head_dim = getattr(attn, "head_dim", None)
        if 2 * rotary.inv_freq.numel() != head_dim:
            raise _refuse(
                who, model_type,
                f"RoPE rotates {2 * rotary.inv_freq.numel()} of the {head_dim} dimensions of a head (partial rotary), "
                f"and this baseline rotates whole heads",
                plain,
            )
        for norm in ("q_norm", "k_norm"):
            weight = getattr(getattr(attn, norm, None), "weight", None)
            if weight is not None and weight.shape[-1] != head_dim:
                raise _refuse(
                    who, model_type,
                    f"its {norm} normalises all heads together ({weight.shape[-1]} values), "
                    f"this baseline normalises per head",
                    plain,
                )
    if model_type not in VERIFIED_ATTENTION:
        raise _refuse(
            who, model_type,
            f"this baseline re-implements the attention of model types {', '.join(VERIFIED_ATTENTION)} (checked "
            f"against the model's own); '{model_type}' has not been checked",
            f"Accepted model types: {', '.join(VERIFIED_ATTENTION)}",
        )
    return parts


# ----------------------------------------------------------------------------- attention


def check_attention_implementation(model: nn.Module, who: str) -> None:
    implementation = getattr(model.config, "_attn_implementation", None) or "eager"
    if implementation not in SUPPORTED_ATTENTION:
        raise BaselineError(
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
    group size is taken from the shapes, not from the module, because the baselines
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


def replace_attention_forward(attn: nn.Module, forward: Callable) -> None:
    """Route ``attn(...)`` to ``forward(attn, ...)``; :func:`restore_attention_forward` undoes it."""
    attn.forward = types.MethodType(forward, attn)


def restore_attention_forward(attn: nn.Module) -> None:
    if "forward" in attn.__dict__:
        del attn.__dict__["forward"]


# ----------------------------------------------------------------------------- decoding


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


# ----------------------------------------------------------------------------- lm-eval

# What a baseline overrides of HFLM lives with the rest of lm-eval's internals.
from lpes_harness.lmeval.hflm import RightPaddingLengthsMixin  # noqa: E402,F401 (re-exported)
