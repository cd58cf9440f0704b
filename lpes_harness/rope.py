"""Layer-specific RoPE position scaling: the only module that touches RoPE.

LPES gives decoder layer h its own factor s_h: that layer rotates queries and keys as
if token i sat at position i / s_h. Weights are untouched and the model still runs one
forward pass.

How it is done (transformers >= 4.48 / 5.x): the model computes RoPE's ``(cos, sin)``
once, in a model-level ``rotary_emb`` module, and hands them to every decoder layer as
the ``position_embeddings`` keyword. We install

- a forward hook on ``rotary_emb`` that remembers the call's inputs (hidden states for
  dtype/device, and ``position_ids``, which already account for left padding and for the
  KV-cache offset during generation);
- a forward pre-hook on each decoder layer that, when the layer's scale is not 1,
  replaces ``position_embeddings`` with ``rotary_emb.forward(x, position_ids / s_h)``.

Calling ``rotary_emb.forward`` (not ``rotary_emb(...)``) bypasses our own hook, and
reusing the model's module keeps every RoPE variant (llama3, yarn, attention scaling)
exactly as the model defines it. Within one forward, all layers share one extra
rotary call: the positions of all distinct scales are stacked into one batch.

Scales live in a plain list on the installed state and are read at call time, so
:func:`set_scales` changes them in place with no re-install; :func:`remove` takes the
hooks off and leaves the model exactly as it was.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

# Key under which the scales are kept in ``model.config`` (and so in config.json
# after ``save_pretrained``); ``lpes_hf`` re-applies them on load.
CONFIG_KEY = "lpes_scales"


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


@dataclass
class _LPESState:
    parts: RoPEParts
    scales: list[float]
    handles: list[Any] = field(default_factory=list)
    # Derived from ``scales`` when they are set: the distinct non-1 values, and for each
    # layer the slot of its value in that list (-1 for scale 1, which needs no work).
    distinct: list[float] = field(default_factory=list)
    slot_of_layer: list[int] = field(default_factory=list)
    # Per forward: the rotary call's inputs, then the stacked (cos, sin) of all distinct scales.
    rotary_args: tuple | None = None
    rotary_kwargs: dict | None = None
    stacked: tuple[torch.Tensor, torch.Tensor] | None = None
    divisors: dict = field(default_factory=dict)  # device -> the distinct scales as a tensor

    def assign(self, scales: list[float]) -> None:
        self.scales[:] = scales
        self.distinct = sorted({s for s in scales if s != 1.0})
        self.slot_of_layer = [self.distinct.index(s) if s != 1.0 else -1 for s in scales]
        self.stacked = None
        self.divisors = {}


_STATE_ATTR = "_lpes_state"


# ----------------------------------------------------------------------------- discovery


def find_rope_parts(model: nn.Module) -> RoPEParts:
    """Locate the model-level ``rotary_emb`` and the decoder layers, or explain why not."""
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    supported = "transformers causal LMs with a model-level rotary embedding (Llama, Qwen2, Mistral, ...)"
    decoder = None
    for candidate in (getattr(model, "model", None), getattr(model, "base_model", None), model):
        if candidate is not None and hasattr(candidate, "rotary_emb") and hasattr(candidate, "layers"):
            decoder = candidate
            break
    if decoder is None:
        raise RoPENotFoundError(
            f"model type '{model_type}' ({type(model).__name__}) has no rotary position embedding "
            f"that LPES can scale; LPES supports {supported}. Models with learned or absolute "
            f"positions (GPT-2, OPT, BERT) cannot use it."
        )
    layers = decoder.layers
    first = layers[0] if len(layers) else None
    if first is None or "position_embeddings" not in inspect.signature(first.forward).parameters:
        raise RoPENotFoundError(
            f"model type '{model_type}': its decoder layers do not take `position_embeddings`, so "
            f"per-layer RoPE cannot be injected; LPES supports {supported}."
        )
    return RoPEParts(rotary_emb=decoder.rotary_emb, layers=layers, decoder=decoder)


def num_layers(model: nn.Module) -> int:
    return len(find_rope_parts(model).layers)


# ----------------------------------------------------------------------------- validation


def validate_scales(scales: Sequence[float] | float, n_layers: int) -> list[float]:
    """Return ``scales`` as a list of ``n_layers`` floats; a single number means uniform."""
    if isinstance(scales, (int, float)) and not isinstance(scales, bool):
        scales = [float(scales)] * n_layers
    if isinstance(scales, torch.Tensor):
        scales = scales.flatten().tolist()
    try:
        values = [float(s) for s in scales]
    except (TypeError, ValueError) as err:
        raise LPESError(f"scales must be numbers, got {scales!r}") from err
    if len(values) != n_layers:
        raise LPESError(
            f"got {len(values)} scales but the model has {n_layers} decoder layers; "
            f"give one scale per layer (or a single number for a uniform scale)"
        )
    for index, value in enumerate(values):
        if not math.isfinite(value) or value <= 0:
            raise LPESError(f"scale for layer {index} is {value!r}; every scale must be a finite number > 0")
    return values


# ----------------------------------------------------------------------------- hooks


def _remember_rotary_call(state: _LPESState):
    def hook(module, args, kwargs, output):
        # A new forward has started: (cos, sin) of the previous one are stale.
        state.rotary_args, state.rotary_kwargs, state.stacked = args, kwargs, None
        return None

    return hook


def _stacked_position_embeddings(state: _LPESState):
    """(cos, sin) for every distinct scale at once: one rotary call per forward.

    Positions become a (n_scales * batch, seq) tensor, so the whole set costs about
    what one (cos, sin) costs; this matters during cached generation, where each step
    is tiny and 30 separate calls would show in the latency.
    """
    if state.stacked is None:
        args, kwargs = list(state.rotary_args), dict(state.rotary_kwargs)
        in_kwargs = "position_ids" in kwargs
        position_ids = kwargs["position_ids"] if in_kwargs else args[1]
        divisors = state.divisors.get(position_ids.device)
        if divisors is None:  # once per device and set of scales, not once per forward
            divisors = torch.tensor(state.distinct, dtype=torch.float32, device=position_ids.device)
            divisors = state.divisors[position_ids.device] = divisors.view(-1, *([1] * position_ids.dim()))
        scaled = position_ids.float()[None] / divisors
        batch_shape = position_ids.shape
        scaled = scaled.reshape(-1, *batch_shape[1:])
        if in_kwargs:
            kwargs["position_ids"] = scaled
        else:
            args[1] = scaled
        # .forward skips our own hook on rotary_emb.
        cos, sin = state.parts.rotary_emb.forward(*args, **kwargs)
        n = len(state.distinct)
        state.stacked = (cos.reshape(n, -1, *cos.shape[1:]), sin.reshape(n, -1, *sin.shape[1:]))
    return state.stacked


def _layer_pre_hook(state: _LPESState, layer_index: int):
    def hook(module, args, kwargs):
        slot = state.slot_of_layer[layer_index]
        if slot < 0:
            return None  # scale 1: the model's own (cos, sin), bit-exact vanilla behaviour
        if "position_embeddings" not in kwargs or state.rotary_args is None:
            raise RuntimeError(
                "LPES: decoder layer was called without `position_embeddings` from the model's "
                "rotary_emb; this architecture's forward is not supported"
            )
        cos, sin = _stacked_position_embeddings(state)
        kwargs["position_embeddings"] = (cos[slot], sin[slot])
        return args, kwargs

    return hook


def _release_after_forward(state: _LPESState):
    def hook(module, args, output):
        # Drop the per-forward tensors so no activations outlive the forward.
        state.rotary_args = state.rotary_kwargs = state.stacked = None
        return None

    return hook


# ----------------------------------------------------------------------------- public API


def install(model: nn.Module, scales: Sequence[float] | float) -> nn.Module:
    """Make layer h of ``model`` use positions i / scales[h]. Returns the same model.

    Installing on a model that already has LPES just updates the scales.
    """
    if is_installed(model):
        set_scales(model, scales)
        return model
    parts = find_rope_parts(model)
    state = _LPESState(parts=parts, scales=[])
    state.assign(validate_scales(scales, len(parts.layers)))
    state.handles.append(parts.rotary_emb.register_forward_hook(_remember_rotary_call(state), with_kwargs=True))
    for index, layer in enumerate(parts.layers):
        state.handles.append(layer.register_forward_pre_hook(_layer_pre_hook(state, index), with_kwargs=True))
    state.handles.append(parts.decoder.register_forward_hook(_release_after_forward(state)))
    setattr(model, _STATE_ATTR, state)
    setattr(model.config, CONFIG_KEY, list(state.scales))
    return model


def set_scales(model: nn.Module, scales: Sequence[float] | float) -> None:
    """Change the installed scales in place (no re-install, no reload)."""
    state = _get_state(model)
    state.assign(validate_scales(scales, len(state.parts.layers)))
    setattr(model.config, CONFIG_KEY, list(state.scales))


def get_scales(model: nn.Module) -> list[float] | None:
    state = getattr(model, _STATE_ATTR, None)
    return None if state is None else list(state.scales)


def is_installed(model: nn.Module) -> bool:
    return getattr(model, _STATE_ATTR, None) is not None


def remove(model: nn.Module) -> nn.Module:
    """Take every LPES hook off; the model behaves exactly as before :func:`install`."""
    state = getattr(model, _STATE_ATTR, None)
    if state is None:
        return model
    for handle in state.handles:
        handle.remove()
    delattr(model, _STATE_ATTR)
    if hasattr(model.config, CONFIG_KEY):
        delattr(model.config, CONFIG_KEY)
    return model


def saved_scales(config) -> list[float] | None:
    """Scales stored in a model config by :func:`install` (e.g. read back from config.json)."""
    value = getattr(config, CONFIG_KEY, None)
    return None if value is None else [float(v) for v in value]


def _get_state(model: nn.Module) -> _LPESState:
    state = getattr(model, _STATE_ATTR, None)
    if state is None:
        raise LPESError("LPES is not installed on this model; call lpes_harness.rope.install(model, scales) first")
    return state
