"""An LPES curve installed under a method (a stack, ``lpes+pcd``): each layer's RoPE as the curve left it,
for the stacking methods that compute a layer's (cos, sin) themselves (PCD's lowered-base copy, STRING's
shifted queries). FitM and positional hidden-state scaling need nothing here: they rotate with the
(cos, sin) the layer is handed, which the curve's layer hooks (:mod:`lpes_harness.core.rope`, installed
first, so run first) have already replaced.

The curve gives layer h a pair (p_h, b_h): it rotates with base b_h x theta at positions i / p_h. A method
that rotates a layer at other positions q, or at another base r x theta, does so in that layer's frame:
at q / p_h and base r x b_h x theta. Where no curve is installed, or a layer's pair is (1, 1), that is the
method's own computation, number for number. The pairs are read at each call, so a search's
``rope.set_scales`` on the installed curve moves them too.
"""

from __future__ import annotations

import torch
from torch import nn

from lpes_harness.core import rope, rope_anatomy, rope_math
from lpes_harness.core.scaling import SCALINGS

PLAIN = (1.0, 1.0)  # a layer's pair without a curve: its own positions and base


class LayerFrames:
    """The curve under a method on ``model``, layer by layer (``ropes``: each layer's RoPE, as
    :func:`~lpes_harness.methods.model_checks.check_model` returns them)."""

    def __init__(self, model: nn.Module, parts: rope_anatomy.RoPEParts, ropes: list[rope_math.LayerRoPE]):
        self.model, self.ropes = model, ropes
        self.config, self.model_type = rope_anatomy.decoder_config(parts, model), parts.model_type

    def pair(self, layer: int) -> tuple[float, float]:
        """Layer ``layer``'s (position factor, base factor) under the installed curve; (1, 1) without one."""
        scales = rope.get_scales(self.model)
        if scales is None:
            return PLAIN
        kind = SCALINGS[rope.get_scaling(self.model)]
        return kind.rope_pair(kind.layer_factors(scales)[layer])

    def cos_sin(self, layer: int, position_ids: torch.Tensor, dtype: torch.dtype, base_ratio: float = 1.0,
                pair: tuple[float, float] | None = None):
        """Layer ``layer``'s (cos, sin) at ``position_ids`` and base ``base_ratio`` x theta, in the curve's frame
        (``pair``: the layer's, unless given). Without a curve and at ratio 1: the layer's own RoPE, computed
        as :func:`rope_math.cos_sin` of its frequencies; a base that moves needs plain RoPE (theta)."""
        p, b = self.pair(layer) if pair is None else pair
        layer_rope = self.ropes[layer]
        positions = position_ids if p == 1.0 else position_ids.float() / p
        factor = base_ratio * b
        inv_freq = layer_rope.inv_freq
        if factor != 1.0:
            theta = rope_math.rope_theta(self.config, self.model_type, layer_rope.layer_type)
            inv_freq = rope_math.inv_freq_for_base(inv_freq, theta, theta * factor)
        return rope_math.cos_sin(positions, inv_freq.to(positions.device), layer_rope.attention_scaling, dtype)
