"""Where RoPE sits in a transformers decoder, and whether LPES can scale it.

The model anatomy that :mod:`lpes_harness.core.rope` (LPES) and the baselines share, with no hooks:

- :func:`find_rope_parts`: the model-level ``rotary_emb``, the decoder and its layer list,
  or :class:`RoPENotFoundError` naming the model type and why (learned or ALiBi positions,
  layers that take no ``position_embeddings``);
- :class:`RotaryFunction`: the model's own rotary ``forward``, callable at other positions
  without transformers' ``dynamic_rope_update`` side effects (:func:`undecorated_forward`);
  :func:`probe_rotary` refuses rotary embeddings that return no ``(cos, sin)`` pair;
- :func:`nope_layers`: the layers that apply no RoPE (NoPE), from the attention modules and a
  table of the model types whose attention decides it per layer;
- :class:`LPESError`: what LPES raises on bad input (here, as the leaf both sides import).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


class LPESError(ValueError):
    """Bad input to LPES: the message names what was given and what is accepted."""


class RoPENotFoundError(LPESError):
    """The model has no model-level rotary embedding that LPES can scale."""


@dataclass
class RoPEParts:
    """The pieces of a transformers decoder that LPES needs."""

    rotary_emb: nn.Module
    layers: nn.ModuleList
    decoder: nn.Module
    model_type: str = "unknown"


SUPPORTED = "transformers causal LMs with a model-level rotary embedding (Llama, Qwen, Mistral, Gemma, Phi, ...)"
# Where the decoder (the module holding rotary_emb and the layer list) sits in a model.
_DECODER_PATHS = ("model", "model.language_model", "language_model", "base_model", "")
_LAYER_LISTS = ("layers", "h")


def model_type_of(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__


def _attribute_path(obj, path: str):
    for name in filter(None, path.split(".")):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def find_rope_parts(model: nn.Module) -> RoPEParts:
    """Locate the model-level ``rotary_emb`` and the decoder layers, or explain why not."""
    model_type = model_type_of(model)
    decoder = layers = None
    for path in _DECODER_PATHS:
        candidate = _attribute_path(model, path)
        if candidate is None or not isinstance(getattr(candidate, "rotary_emb", None), nn.Module):
            continue
        lists = [getattr(candidate, name, None) for name in _LAYER_LISTS]
        layers = next((found for found in lists if isinstance(found, nn.ModuleList)), None)
        if layers is not None:
            decoder = candidate
            break
    if decoder is None:
        raise RoPENotFoundError(
            f"model type '{model_type}' ({type(model).__name__}) has no rotary position embedding "
            f"that LPES can scale; LPES supports {SUPPORTED}. Models with learned or absolute "
            f"positions (GPT-2, OPT, BERT) cannot use it."
        )
    config = getattr(decoder, "config", None) or model.config
    if getattr(config, "alibi", False):
        raise RoPENotFoundError(
            f"model type '{model_type}' with alibi=True encodes positions with ALiBi attention biases, "
            f"not RoPE, so there is nothing for LPES to scale; LPES supports {SUPPORTED}."
        )
    first = layers[0] if len(layers) else None
    if first is None or "position_embeddings" not in inspect.signature(first.forward).parameters:
        raise RoPENotFoundError(
            f"model type '{model_type}': its decoder layers do not take `position_embeddings`, so "
            f"per-layer RoPE cannot be injected; LPES supports {SUPPORTED}."
        )
    return RoPEParts(rotary_emb=decoder.rotary_emb, layers=layers, decoder=decoder, model_type=model_type)


# ----------------------------------------------------------------------------- the rotary function


class RotaryFunction:
    """The model's rotary ``forward``, callable on other positions without side effects.

    transformers wraps rotary forwards in ``dynamic_rope_update``, which, for dynamic NTK
    and LongRoPE, picks the frequencies from ``max(position_ids)`` of the call and stores
    them on the module. We call the function *under* that decorator: the frequencies stay
    those the model's own call (at the true positions) has just chosen, identical for every
    layer whatever the other layers' scales, and the module is never modified by LPES.
    """

    def __init__(self, rotary_emb: nn.Module, model_type: str):
        self.module = rotary_emb
        self.function = undecorated_forward(type(rotary_emb).forward)
        self.signature = inspect.signature(self.function)
        names = list(self.signature.parameters)
        if "position_ids" not in names or len(names) < 3:
            raise RoPENotFoundError(
                f"model type '{model_type}': its rotary embedding {type(rotary_emb).__name__}.forward"
                f"{self.signature} takes no `position_ids`, so LPES cannot recompute it at other positions"
            )
        self.extra = [n for n in names[2:] if n != "position_ids"]  # after self and x
        # The common signature forward(self, x, position_ids): calls are split without
        # inspect's bind (a per-forward cost that shows in cached generation).
        self.plain = names[2:] == ["position_ids"]
        self.x_name = names[1]

    def bind(self, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        bound = self.signature.bind(self.module, *args, **kwargs)
        bound.apply_defaults()
        return bound

    def key(self, args: tuple, kwargs: dict) -> tuple:
        """What distinguishes one call from another, besides the positions: e.g. ``layer_type``."""
        if not self.extra:
            return ()
        arguments = self.bind(args, kwargs).arguments
        return tuple((name, _hashable(arguments[name])) for name in self.extra)

    def __call__(self, bound: "inspect.BoundArguments | tuple"):
        """``bound``: the call's bound arguments, or ``(x, position_ids)`` for the plain signature."""
        with torch.no_grad():
            if isinstance(bound, tuple):
                return self.function(self.module, *bound)
            return self.function(*bound.args, **bound.kwargs)

    def plain_split(self, args: tuple, kwargs: dict):
        """``(x, position_ids)`` of a call of the plain signature; None when it must be bound."""
        if not self.plain or len(args) > 2:
            return None
        values = dict(zip((self.x_name, "position_ids"), args))
        for name, value in kwargs.items():
            if name in values or name not in (self.x_name, "position_ids"):
                return None
            values[name] = value
        if len(values) != 2:
            return None
        return values[self.x_name], values["position_ids"]


def undecorated_forward(forward: Callable) -> Callable:
    """``forward`` without transformers' ``dynamic_rope_update`` wrapper (and what sits above it,
    ``torch.no_grad``, which :class:`RotaryFunction` applies itself); ``forward`` if it has none."""
    try:
        from transformers.modeling_rope_utils import dynamic_rope_update

        marker = dynamic_rope_update(lambda self, x, position_ids: None).__code__
    except ImportError:  # pragma: no cover - older transformers
        return forward
    function = forward
    while function is not None:
        if getattr(function, "__code__", None) is marker:
            return function.__wrapped__
        function = getattr(function, "__wrapped__", None)
    return forward


def _hashable(value):
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype))
    return ("object", type(value).__name__)


def is_cos_sin(output) -> bool:
    return (
        isinstance(output, (tuple, list))
        and len(output) == 2
        and all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in output)
    )


def _describe(output) -> str:
    if isinstance(output, torch.Tensor):
        if output.is_complex():
            return "one complex tensor (`freqs_cis`, rotations as complex numbers)"
        return f"one {str(output.dtype).replace('torch.', '')} tensor"
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {len(output)}"
    return type(output).__name__


def probe_rotary(parts: RoPEParts, rotary: RotaryFunction, config) -> None:
    """Refuse rotary embeddings whose output is not a ``(cos, sin)`` pair (Llama-4's ``freqs_cis``)."""
    buffers = [b for b in parts.rotary_emb.buffers() if b.is_floating_point()]
    device = buffers[0].device if buffers else torch.device("cpu")
    if device.type == "meta":
        return  # nothing to run on yet; the layer hooks still refuse to guess at run time
    extra = {}
    for name in rotary.extra:
        if rotary.signature.parameters[name].default is not inspect.Parameter.empty:
            continue
        layer_types = getattr(config, "layer_types", None)
        if name == "layer_type" and layer_types:
            extra[name] = layer_types[0]
        else:
            return  # an argument we cannot make up: checked at run time instead
    x = torch.zeros(1, 2, 1, device=device)
    position_ids = torch.arange(2, device=device)[None]
    output = rotary(rotary.bind((x, position_ids), extra))
    if not is_cos_sin(output):
        raise RoPENotFoundError(
            f"model type '{parts.model_type}': its rotary embedding {type(parts.rotary_emb).__name__} returns "
            f"{_describe(output)}, not a (cos, sin) pair, and its layers apply it their own way; "
            f"LPES supports {SUPPORTED}."
        )


# ----------------------------------------------------------------------------- NoPE layers

# Model types whose attention applies RoPE only on some layers, decided by attributes of the
# attention module (read from transformers' modeling code): attention -> applies RoPE?
_ROPE_ONLY_WHERE: dict[str, tuple[Callable[[nn.Module], bool], str]] = {
    "cohere2": (lambda a: a.sliding_window is not None, "full-attention layers use no positional encoding"),
    "cohere2_moe": (
        lambda a: a.sliding_window is not None or bool(getattr(a, "force_rope", False)),
        "full-attention layers use no positional encoding",
    ),
    "flint": (lambda a: a.sliding_window is not None, "full-attention layers use no positional encoding"),
}
for _type in ("exaone4", "exaone4_5", "exaone_moe", "kolibri1"):
    _ROPE_ONLY_WHERE[_type] = (
        lambda a: a.sliding_window is None or bool(a.is_sliding),
        "global layers of the hybrid-attention model use no positional encoding",
    )


def _attention_of(layer: nn.Module) -> nn.Module | None:
    for name in ("self_attn", "attention", "self_attention", "attn"):
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def nope_layers(model: nn.Module) -> dict[int, str]:
    """Decoder layers that apply no RoPE (NoPE), each with the reason; a scale there means nothing."""
    return nope_layers_in(find_rope_parts(model))


def nope_layers_in(parts: RoPEParts) -> dict[int, str]:
    rule = _ROPE_ONLY_WHERE.get(parts.model_type) or _ROPE_ONLY_WHERE.get(
        getattr(getattr(parts.decoder, "config", None), "model_type", None)
    )
    found = {}
    for index, layer in enumerate(parts.layers):
        attention = _attention_of(layer)
        if attention is None:
            continue
        use_rope = getattr(attention, "use_rope", None)
        if use_rope is not None and not use_rope:
            found[index] = "its attention has use_rope=False (no_rope_layers in the config)"
        elif rule is not None and not rule[0](attention):
            found[index] = rule[1]
    return found


# ----------------------------------------------------------------------------- which call feeds which layer


def decoder_config(parts: RoPEParts, model: nn.Module):
    """The decoder's own config (a multimodal model's text config), else the model's."""
    return getattr(parts.decoder, "config", None) or model.config


def known_layer_keys(rotary: RotaryFunction, config, n_layers: int) -> list:
    """Which call feeds which layer, when the model says so: Gemma-3's ``layer_type`` calls."""
    layer_types = getattr(config, "layer_types", None)
    if rotary.extra == ["layer_type"] and isinstance(layer_types, (list, tuple)) and len(layer_types) == n_layers:
        return [(("layer_type", t),) for t in layer_types]
    return [None] * n_layers
