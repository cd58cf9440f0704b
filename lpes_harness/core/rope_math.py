"""RoPE at other bases or positions, computed from the model's own frequencies.

:mod:`lpes_harness.core.rope`'s base scaling computes its (cos, sin) here, and the methods of
:mod:`lpes_harness.methods` what ``rope`` does not give: per-head positions (Ms-PoE), several RoPE
bases in one layer (MoICE) or per batch row (Attention Buckets). A core module: it imports no
method. It starts from three facts about transformers 5.x decoders:

- the model-level ``rotary_emb`` is called with ``position_ids``, which already account for
  left padding and for the KV-cache offset; a forward hook on it records them
  (:class:`PositionRecorder`);
- it is called once per forward, or, on models whose layer types use different RoPEs
  (Gemma-3: sliding layers base 10k, full layers 1M), once per layer type with
  ``layer_type`` as an extra argument; the config's ``layer_types`` says which layer gets
  which call (:func:`rope_anatomy.known_layer_keys`), so each layer has one
  :class:`LayerRoPE` (:func:`layer_ropes`);
- its ``forward`` is ``cos/sin(position_ids[..., None] * inv_freq) * attention_scaling``,
  elementwise, with the ``inv_freq`` and ``attention_scaling`` of the call (prefixed by the
  layer type where there are several, transformers' own naming), so :func:`cos_sin` with
  them reproduces it bit for bit (``methods.model_checks.check_model`` checks each of the model's
  RoPEs against its call), and another base only changes ``inv_freq``
  (:func:`inv_freq_for_base`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from lpes_harness.core.rope_anatomy import LPESError, RoPEParts, RotaryFunction, known_layer_keys


@dataclass(frozen=True)
class LayerRoPE:
    """The RoPE a layer rotates with: the model's only one (``layer_type`` None) or its layer type's.

    The frequencies are read from the rotary module when asked for, never copied: dynamic
    NTK replaces ``inv_freq`` on the module as the sequence grows.
    """

    rotary_emb: nn.Module
    layer_type: str | None

    @property
    def key(self) -> tuple:
        """The rotary call that computes it, as :meth:`RotaryFunction.key` names calls."""
        return () if self.layer_type is None else (("layer_type", self.layer_type),)

    @property
    def prefix(self) -> str:
        return "" if self.layer_type is None else f"{self.layer_type}_"

    @property
    def inv_freq(self) -> torch.Tensor:
        return getattr(self.rotary_emb, f"{self.prefix}inv_freq")

    @property
    def attention_scaling(self) -> float:
        return getattr(self.rotary_emb, f"{self.prefix}attention_scaling")


def layer_ropes(parts: RoPEParts, config) -> list[LayerRoPE] | None:
    """Each decoder layer's RoPE; None when the rotary embedding takes other arguments than
    ``x``, ``position_ids`` and a ``layer_type`` that the config gives every layer."""
    rotary = RotaryFunction(parts.rotary_emb, parts.model_type)
    if not rotary.extra:
        return [LayerRoPE(parts.rotary_emb, None)] * len(parts.layers)
    keys = known_layer_keys(rotary, config, len(parts.layers))
    if any(key is None for key in keys):
        return None
    return [LayerRoPE(parts.rotary_emb, dict(key)["layer_type"]) for key in keys]


def distinct(ropes: list[LayerRoPE]) -> list[LayerRoPE]:
    """The model's RoPEs, each once, in layer order."""
    return list(dict.fromkeys(ropes))


def rope_theta(config, model_type: str, layer_type: str | None = None) -> float:
    """The RoPE base of the model (or of one layer type), for plain ('default') RoPE only."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        params = params.get(layer_type) or {}
    where = f"model type '{model_type}'" + (f", layer type {layer_type}" if layer_type else "")
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise LPESError(
            f"a change of RoPE base is defined only for plain RoPE; the model "
            f"({where}) uses rope_type={rope_type!r}. Accepted: models with "
            f"rope_type 'default' (Llama 2, SmolLM2, Qwen2, Mistral, Gemma-3 270M / 1B)"
        )
    theta = params.get("rope_theta", None if layer_type else getattr(config, "rope_theta", None))
    if theta is None:
        raise LPESError(f"the model config ({where}) has no rope_theta; cannot derive RoPE bases from it")
    return float(theta)


def inv_freq_for_base(inv_freq: torch.Tensor, theta: float, base: float) -> torch.Tensor:
    """``1 / base^(2i/d)``, derived from the model's own ``inv_freq = 1 / theta^(2i/d)``.

    Raising to ``ln(base)/ln(theta)`` keeps the model's dimension layout (partial rotary
    included) and is exact when ``base == theta`` (the power is then exactly 1).
    """
    inv_freq = inv_freq.float()
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
    """Forward hook on ``rotary_emb``: remembers each call's ``position_ids`` (and may replace its output).

    ``replace(x, position_ids, output, key)`` gets the call's key (:attr:`LayerRoPE.key`): on
    Gemma-3 each layer type's call must be replaced by that type's RoPE.
    """

    def __init__(self, parts: RoPEParts, replace: Callable | None = None):
        self.position_ids: torch.Tensor | None = None
        self.replace = replace
        self.rotary = RotaryFunction(parts.rotary_emb, parts.model_type)
        self.handle = parts.rotary_emb.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        position_ids = kwargs["position_ids"] if "position_ids" in kwargs else args[1]
        self.position_ids = position_ids  # every call of a forward gets the same ones
        if self.replace is not None:
            x = kwargs["x"] if "x" in kwargs else args[0]
            return self.replace(x, position_ids, output, self.rotary.key(args, kwargs))
        return None

    def remove(self) -> None:
        self.handle.remove()
