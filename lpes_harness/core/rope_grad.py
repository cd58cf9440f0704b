"""Per-layer RoPE factors as a tensor the loss can be differentiated by (the gradient search's path).

:mod:`lpes_harness.core.rope` takes its factors as Python floats and re-runs the model's rotary
function under ``torch.no_grad``: nothing there can carry a gradient. Here the factors are one
torch tensor, laid out as the scaling's flat list (:mod:`lpes_harness.core.scaling`: L numbers, or
2L for ``both``), and each decoder layer's ``(cos, sin)`` is computed from it in plain torch ops, so
a gradient flows from the loss through the rotary angles into every factor:

    angle_{h,i,j} = (i / p_h) * inv_freq_j ** (1 + ln b_h / ln theta)

which is layer h's RoPE at base ``b_h * theta`` (``inv_freq_j = theta^(-2j/d)``, so raising it to
``ln(b theta) / ln theta`` gives ``(b theta)^(-2j/d)``, as :func:`rope_math.inv_freq_for_base` does)
at positions ``i / p_h``. That is the model's RoPE only for plain ('default') RoPE: other RoPE types
(llama3, yarn, ...) are refused, as :mod:`rope` refuses base factors on them.

Identity stays bit-exact: a layer whose factors are all exactly 1 keeps the model's own ``(cos, sin)``;
when the factors require a gradient, the layer gets ``own + (ours - ours.detach())``, which adds an
exact zero to every value (so the logits are the plain model's, bit for bit) while the gradient is
that of ``ours``. Elsewhere the values are ``ours``, which equal :mod:`rope`'s float path to float
rounding (``tests/test_search_gradient.py``).

The computation runs in the factors' dtype promoted with float32: float64 factors give float64
angles, which the finite-difference test needs (the model's own rotary works in float32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from lpes_harness.core import rope, rope_math
from lpes_harness.core.rope_anatomy import LPESError, RotaryFunction, decoder_config, find_rope_parts, nope_layers_in
from lpes_harness.core.scaling import DEFAULT, SCALINGS


@dataclass
class _Call:
    """One ``rotary_emb`` call of the current forward: its positions and the ``cos`` it returned."""

    position_ids: torch.Tensor
    cos: torch.Tensor


@dataclass(eq=False)
class DifferentiableRoPE:
    """Hooks on ``model`` that rotate layer h by the factors in :attr:`factors` (a tensor, or None: the plain model).

    Use as a context manager, or call :meth:`remove`; set :attr:`factors` before each forward.
    """

    model: nn.Module = field(repr=False)
    scaling: str = DEFAULT
    factors: torch.Tensor | None = None
    handles: list = field(default_factory=list, repr=False)
    _calls: list = field(default_factory=list, repr=False)
    _at_one: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise LPESError(f"scaling={self.scaling!r} is not one of {', '.join(SCALINGS)}")
        if rope.is_installed(self.model):
            raise LPESError("LPES's float hooks are installed on this model (rope.install); remove them (rope.remove) "
                            "first: two sets of hooks would both rewrite the layers' (cos, sin)")
        self.kind = SCALINGS[self.scaling]
        parts = find_rope_parts(self.model)
        config = decoder_config(parts, self.model)
        ropes = rope_math.layer_ropes(parts, config)
        if ropes is None:
            raise LPESError(f"model type '{parts.model_type}': its rotary embedding takes arguments other than the "
                            f"positions and a layer type, so the gradient path cannot tell which RoPE each layer uses")
        self.parts, self.ropes = parts, ropes
        self.log_thetas = [math.log(rope_math.rope_theta(config, parts.model_type, r.layer_type)) for r in ropes]
        self.nope_layers = nope_layers_in(parts)
        self.rotary = RotaryFunction(parts.rotary_emb, parts.model_type)
        self.handles.append(parts.decoder.register_forward_pre_hook(self._start_forward))
        self.handles.append(parts.rotary_emb.register_forward_hook(self._remember_call, with_kwargs=True))
        for index, layer in enumerate(parts.layers):
            self.handles.append(layer.register_forward_pre_hook(self._layer_hook(index), with_kwargs=True))
        self.handles.append(parts.decoder.register_forward_hook(self._end_forward))

    @property
    def num_layers(self) -> int:
        return len(self.parts.layers)

    def identity(self, dtype=torch.float32) -> torch.Tensor:
        """The factors that leave the model as it is: ones in the scaling's layout."""
        return torch.ones(self.num_layers * self.kind.per_layer, dtype=dtype)

    def layer_pairs(self, factors: torch.Tensor) -> torch.Tensor:
        """``factors`` (the flat list) as an (L, 2) tensor of each layer's (p_h, b_h); the axes a scaling does not
        move are ones (what :meth:`Scaling.rope_pair` does for one layer, here for all and differentiably)."""
        if factors.dim() != 1 or factors.numel() != self.num_layers * self.kind.per_layer:
            raise LPESError(f"scaling={self.scaling!r} takes {self.kind.per_layer} factor(s) per layer on a model of "
                            f"{self.num_layers} layers ({self.num_layers * self.kind.per_layer} numbers); "
                            f"got a tensor of shape {tuple(factors.shape)}")
        curves = dict(zip(self.kind.axes, factors.view(self.kind.per_layer, self.num_layers)))
        ones = torch.ones(self.num_layers, dtype=factors.dtype, device=factors.device)
        return torch.stack([curves.get("position", ones), curves.get("base", ones)], dim=-1)

    # ------------------------------------------------------------------ hooks
    def _start_forward(self, module, args):
        self._calls = []
        if self.factors is None:
            self._at_one = [True] * self.num_layers
            return None
        pairs = self.layer_pairs(self.factors)
        self._at_one = (pairs.detach() == 1).all(dim=-1).tolist()  # one read a forward, not one a layer
        moved = [h for h in self.nope_layers if not self._at_one[h]]
        if moved:
            raise LPESError(f"layer(s) {moved} apply no RoPE ({'; '.join(sorted(set(self.nope_layers.values())))}): "
                            f"give them factor 1")
        return None

    def _remember_call(self, module, args, kwargs, output):
        if isinstance(output, (tuple, list)) and len(output) == 2:
            plain = self.rotary.plain_split(args, kwargs)
            position_ids = plain[1] if plain is not None else self.rotary.bind(args, kwargs).arguments["position_ids"]
            self._calls.append(_Call(position_ids, output[0]))
        return None

    def _end_forward(self, module, args, output):
        self._calls = []  # no activations outlive the forward
        return None

    def _layer_hook(self, index: int):
        def hook(module, args, kwargs):
            factors = self.factors
            if factors is None or (self._at_one[index] and not factors.requires_grad):
                return None  # the model's own (cos, sin): bit-exact vanilla
            own = kwargs.get("position_embeddings")
            call = next((c for c in reversed(self._calls) if own is not None and c.cos is own[0]), None)
            if call is None:
                raise RuntimeError(f"decoder layer {index} of model type '{self.parts.model_type}' was called without "
                                   f"`position_embeddings` from this forward's rotary_emb calls; the gradient path "
                                   f"does not support this architecture's forward")
            p, b = self.layer_pairs(factors)[index].unbind(-1)
            ours = self._cos_sin(index, call.position_ids, p, b, own[0].dtype)
            if self._at_one[index]:  # an exact zero added: the plain model's values, the gradient of ours
                ours = tuple(o + (x - x.detach()) for o, x in zip(own, ours))
            kwargs["position_embeddings"] = ours
            return args, kwargs

        return hook

    def _cos_sin(self, index: int, position_ids: torch.Tensor, p: torch.Tensor, b: torch.Tensor, dtype) -> tuple:
        """Layer ``index``'s (cos, sin) at base ``b * theta`` and positions ``position_ids / p``, differentiable in p, b."""
        layer_rope = self.ropes[index]
        compute = torch.promote_types(p.dtype, torch.float32)
        p, b = p.to(position_ids.device, compute), b.to(position_ids.device, compute)
        inv_freq = layer_rope.inv_freq.to(device=position_ids.device, dtype=compute)
        inv_freq = inv_freq ** (1 + torch.log(b) / self.log_thetas[index])
        freqs = (position_ids.to(compute) / p)[..., None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = layer_rope.attention_scaling
        return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)

    # ------------------------------------------------------------------ lifetime
    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self._calls = []

    def __enter__(self) -> "DifferentiableRoPE":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
