"""RoPE at other bases or positions, as the baselines compute it themselves.

The baselines need what :mod:`lpes_harness.rope` does not give: per-head positions
(Ms-PoE), several RoPE bases in one layer (MoICE) or per batch row (Attention Buckets).
They start from two facts about transformers 5.x decoders:

- the model-level ``rotary_emb`` is called once per forward with ``position_ids``, which
  already account for left padding and for the KV-cache offset; a forward hook on it
  records them (:class:`PositionRecorder`);
- its ``forward`` is ``cos/sin(position_ids[..., None] * inv_freq) * attention_scaling``,
  elementwise, so :func:`cos_sin` with the model's own ``inv_freq`` reproduces it bit for
  bit, and another base only changes ``inv_freq`` (:func:`inv_freq_for_base`).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from lpes_harness.baselines.arguments import BaselineError
from lpes_harness.rope_anatomy import model_type_of


def rope_theta(model: nn.Module) -> float:
    """The model's RoPE base, for models whose RoPE is the plain ('default') kind."""
    config = model.config
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise BaselineError(
            f"this baseline changes the RoPE base, which is defined only for plain RoPE; the model "
            f"(model type '{model_type_of(model)}') uses rope_type={rope_type!r}. Accepted: models with "
            f"rope_type 'default' (Llama 2, SmolLM2, Qwen2, Mistral)"
        )
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise BaselineError(
            f"the model config (model type '{model_type_of(model)}') has no rope_theta; cannot derive RoPE bases from it"
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
