"""Layer-specific RoPE position scaling: the only module that touches RoPE.

LPES gives decoder layer h its own factor s_h: that layer rotates queries and keys as
if token i sat at position i / s_h. Weights are untouched and the model still runs one
forward pass.

How it is done (transformers 5.x): the model computes RoPE's ``(cos, sin)`` in a
model-level ``rotary_emb`` module and hands them to the decoder layers as the
``position_embeddings`` keyword. Some models call it more than once per forward, with
extra arguments: Gemma-3 calls ``rotary_emb(hidden, position_ids, layer_type)`` once per
layer type, because its sliding and full layers use different bases. We install

- a forward pre-hook on the decoder that starts a new forward, and a forward hook on
  ``rotary_emb`` that records *every* call of that forward: its arguments
  (``position_ids`` already account for left padding and for the KV-cache offset) and the
  ``(cos, sin)`` it returned;
- a forward pre-hook on each decoder layer that finds which recorded call produced the
  ``position_embeddings`` it received (by identity of the tensors) and, when the layer's
  scale is not 1, replaces them with the same call, same extra arguments, re-run at
  ``position_ids / s_h``.

Within one forward, all layers fed by one call share one extra rotary computation: the
positions of their distinct scales are stacked into one batch. Which layers a call feeds is
learnt as layers run (and known from the start for ``layer_type`` calls), so each distinct
(call, scale) is computed once.

The re-run uses the model's own rotary function (so llama3, yarn, LongRoPE, partial
rotary, interleaved layouts and attention scaling stay exactly as the model defines them)
but *without* transformers' ``dynamic_rope_update`` decorator: dynamic NTK and LongRoPE
choose their frequencies from the sequence length of the call, and that choice must come
from the true positions (the model's own call, which has just made it), not from the
scaled ones. It also means LPES never changes the rotary module's state.

Scales live in a plain list on the installed state and are read at call time, so
:func:`set_scales` changes them in place with no re-install; :func:`remove` takes the
hooks off and leaves the model exactly as it was. Layers with scale 1 are left untouched,
so all-ones is bit-exact vanilla.

What is refused at :func:`install`, with the model type and the reason: models without a
model-level rotary embedding (learned or ALiBi positions), rotary embeddings that do not
return a ``(cos, sin)`` pair (Llama-4's complex ``freqs_cis``), and a scale other than 1 on
a layer that applies no RoPE (NoPE layers of SmolLM3, Cohere2, ...).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

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
    model_type: str = "unknown"


@dataclass
class _RotaryCall:
    """One call of ``rotary_emb`` in the current forward."""

    args: tuple
    kwargs: dict
    output: tuple | None  # the (cos, sin) it returned; None when it is not such a pair
    key: tuple | None = None  # its arguments other than x and position_ids (e.g. layer_type)
    scaled: dict = field(default_factory=dict)  # scale -> (cos, sin) at position_ids / scale


@dataclass
class _LPESState:
    parts: RoPEParts
    rotary: "_RotaryFunction"
    scales: list[float]
    nope_layers: dict[int, str] = field(default_factory=dict)  # layer -> why it has no RoPE
    handles: list[Any] = field(default_factory=list)
    # Derived from ``scales`` when they are set: the distinct non-1 values.
    distinct: list[float] = field(default_factory=list)
    # Per layer, the key of the rotary call that feeds it (None until known).
    layer_keys: list = field(default_factory=list)
    # Per call key: the non-1 scales of the layers that call feeds (or may feed), sorted;
    # derived from ``scales`` and ``layer_keys``, so emptied when either changes.
    wanted: dict = field(default_factory=dict)
    # Per forward: every rotary call so far.
    calls: list[_RotaryCall] = field(default_factory=list)
    divisors: dict = field(default_factory=dict)  # (scales, device) -> the scales as a tensor

    def assign(self, scales: list[float]) -> None:
        self.scales[:] = scales
        self.distinct = sorted({s for s in scales if s != 1.0})
        self.divisors = {}
        self.wanted = {}
        for call in self.calls:
            call.scaled.clear()


_STATE_ATTR = "_lpes_state"


# ----------------------------------------------------------------------------- discovery

_SUPPORTED = "transformers causal LMs with a model-level rotary embedding (Llama, Qwen, Mistral, Gemma, Phi, ...)"
# Where the decoder (the module holding rotary_emb and the layer list) sits in a model.
_DECODER_PATHS = ("model", "model.language_model", "language_model", "base_model", "")
_LAYER_LISTS = ("layers", "h")


def _model_type(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__


def _attribute_path(obj, path: str):
    for name in filter(None, path.split(".")):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def find_rope_parts(model: nn.Module) -> RoPEParts:
    """Locate the model-level ``rotary_emb`` and the decoder layers, or explain why not."""
    model_type = _model_type(model)
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
            f"that LPES can scale; LPES supports {_SUPPORTED}. Models with learned or absolute "
            f"positions (GPT-2, OPT, BERT) cannot use it."
        )
    config = getattr(decoder, "config", None) or model.config
    if getattr(config, "alibi", False):
        raise RoPENotFoundError(
            f"model type '{model_type}' with alibi=True encodes positions with ALiBi attention biases, "
            f"not RoPE, so there is nothing for LPES to scale; LPES supports {_SUPPORTED}."
        )
    first = layers[0] if len(layers) else None
    if first is None or "position_embeddings" not in inspect.signature(first.forward).parameters:
        raise RoPENotFoundError(
            f"model type '{model_type}': its decoder layers do not take `position_embeddings`, so "
            f"per-layer RoPE cannot be injected; LPES supports {_SUPPORTED}."
        )
    return RoPEParts(rotary_emb=decoder.rotary_emb, layers=layers, decoder=decoder, model_type=model_type)


def num_layers(model: nn.Module) -> int:
    return len(find_rope_parts(model).layers)


# ----------------------------------------------------------------------------- the rotary function


class _RotaryFunction:
    """The model's rotary ``forward``, callable on other positions without side effects.

    transformers wraps rotary forwards in ``dynamic_rope_update``, which, for dynamic NTK
    and LongRoPE, picks the frequencies from ``max(position_ids)`` of the call and stores
    them on the module. We call the function *under* that decorator: the frequencies stay
    those the model's own call (at the true positions) has just chosen, identical for every
    layer whatever the other layers' scales, and the module is never modified by LPES.
    """

    def __init__(self, rotary_emb: nn.Module, model_type: str):
        self.module = rotary_emb
        self.function = _undecorated_forward(type(rotary_emb).forward)
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


def _undecorated_forward(forward: Callable) -> Callable:
    """``forward`` without transformers' ``dynamic_rope_update`` wrapper (and what sits above it,
    ``torch.no_grad``, which :class:`_RotaryFunction` applies itself); ``forward`` if it has none."""
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


def _is_cos_sin(output) -> bool:
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


def _probe_rotary(parts: RoPEParts, rotary: _RotaryFunction, config) -> None:
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
    if not _is_cos_sin(output):
        raise RoPENotFoundError(
            f"model type '{parts.model_type}': its rotary embedding {type(parts.rotary_emb).__name__} returns "
            f"{_describe(output)}, not a (cos, sin) pair, and its layers apply it their own way; "
            f"LPES supports {_SUPPORTED}."
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
    return _nope_layers(find_rope_parts(model))


def _nope_layers(parts: RoPEParts) -> dict[int, str]:
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


def _check_nope(state: _LPESState, scales: list[float]) -> None:
    scaled = [i for i in state.nope_layers if scales[i] != 1.0]
    if scaled:
        nope = sorted(state.nope_layers)
        reasons = "; ".join(sorted(set(state.nope_layers.values())))
        raise LPESError(
            f"model type '{state.parts.model_type}': layer(s) {scaled} were given scale(s) "
            f"{[scales[i] for i in scaled]}, but they apply no RoPE ({reasons}), so a position scale "
            f"there has no meaning; give 1.0 for layers {nope}"
        )


# ----------------------------------------------------------------------------- hooks


def _start_forward(state: _LPESState):
    def hook(module, args):
        state.calls = []  # a new forward: the calls of the previous one are stale
        return None

    return hook


def _remember_rotary_call(state: _LPESState):
    def hook(module, args, kwargs, output):
        call = _RotaryCall(args, kwargs, tuple(output) if _is_cos_sin(output) else None)
        if state.distinct and call.output is not None:
            call.key = state.rotary.key(args, kwargs)
        state.calls.append(call)
        return None

    return hook


def _call_that_made(state: _LPESState, position_embeddings) -> _RotaryCall | None:
    if not isinstance(position_embeddings, (tuple, list)) or len(position_embeddings) != 2:
        return None
    cos = position_embeddings[0]
    for call in reversed(state.calls):
        if call.output is not None and call.output[0] is cos:
            return call
    return None


def _compute_scaled(state: _LPESState, call: _RotaryCall, scales: list[float]) -> list[tuple]:
    """``call`` re-run at ``position_ids / s`` for every ``s`` in ``scales``: one rotary computation.

    Positions become a (n_scales * batch, seq) tensor, so the whole set costs about what
    one (cos, sin) costs; this matters during cached generation, where each step is tiny
    and one call per layer would show in the latency.
    """
    plain = state.rotary.plain_split(call.args, call.kwargs)
    if plain is not None:
        bound = None
        x, position_ids = plain
    else:
        bound = state.rotary.bind(call.args, call.kwargs)
        position_ids = bound.arguments["position_ids"]
    if position_ids.dim() != 2:
        raise RuntimeError(
            f"LPES: model type '{state.parts.model_type}' calls its rotary embedding with position_ids "
            f"of shape {tuple(position_ids.shape)} (several position axes, as in M-RoPE); LPES supports "
            f"(batch, seq) positions only"
        )
    divisors = state.divisors.get((tuple(scales), position_ids.device))
    if divisors is None:  # once per device and set of scales, not once per forward
        divisors = torch.tensor(scales, dtype=torch.float32, device=position_ids.device).view(-1, 1, 1)
        state.divisors[(tuple(scales), position_ids.device)] = divisors
    scaled_positions = (position_ids.float()[None] / divisors).reshape(-1, position_ids.shape[-1])
    if bound is None:
        cos, sin = state.rotary((x, scaled_positions))
    else:
        bound.arguments["position_ids"] = scaled_positions
        cos, sin = state.rotary(bound)
    n = len(scales)
    # One unbind per tensor: n views at the cost of one call, not n indexing calls.
    cos, sin = cos.reshape(n, -1, *cos.shape[1:]).unbind(0), sin.reshape(n, -1, *sin.shape[1:]).unbind(0)
    return list(zip(cos, sin))


def _scaled_position_embeddings(state: _LPESState, call: _RotaryCall, scale: float) -> tuple:
    """(cos, sin) of ``call`` at ``position_ids / scale``.

    On the first request for a call, every distinct scale of the layers that this call
    feeds (or may feed, while that is not yet known) is computed in one stacked call.
    """
    found = call.scaled.get(scale)
    if found is not None:
        return found
    wanted = state.wanted.get(call.key)
    if wanted is None:  # once per set of scales and call key, not once per forward
        wanted = sorted({s for s, key in zip(state.scales, state.layer_keys)
                         if s != 1.0 and (key is None or key == call.key)})
        state.wanted[call.key] = wanted
    missing = sorted({scale, *wanted} - call.scaled.keys())
    call.scaled.update(zip(missing, _compute_scaled(state, call, missing)))
    return call.scaled[scale]


def _layer_pre_hook(state: _LPESState, layer_index: int):
    def hook(module, args, kwargs):
        scale = state.scales[layer_index]
        if scale == 1.0:
            # The model's own (cos, sin), bit-exact vanilla behaviour; nothing to look up (which
            # call feeds a layer only matters for the scaled ones). All scales 1: the model as it is.
            return None
        call = _call_that_made(state, kwargs.get("position_embeddings"))
        if call is not None and state.layer_keys[layer_index] != call.key:
            state.layer_keys[layer_index] = call.key
            state.wanted.clear()
        if call is None:
            raise RuntimeError(
                f"LPES: decoder layer {layer_index} of model type '{state.parts.model_type}' was called "
                f"without `position_embeddings` from one of this forward's rotary_emb calls "
                f"({len(state.calls)} recorded), so its scale {scale} cannot be applied; this "
                f"architecture's forward is not supported"
            )
        kwargs["position_embeddings"] = _scaled_position_embeddings(state, call, scale)
        return args, kwargs

    return hook


def _release_after_forward(state: _LPESState):
    def hook(module, args, output):
        # Drop the per-forward tensors so no activations outlive the forward.
        state.calls = []
        return None

    return hook


# ----------------------------------------------------------------------------- public API


def check_supported(model: nn.Module) -> RoPEParts:
    """Everything :func:`install` checks before it touches the model; raises :class:`LPESError`."""
    parts = find_rope_parts(model)
    _probe_rotary(parts, _RotaryFunction(parts.rotary_emb, parts.model_type), _decoder_config(parts, model))
    return parts


def _decoder_config(parts: RoPEParts, model: nn.Module):
    return getattr(parts.decoder, "config", None) or model.config


def _known_layer_keys(rotary: _RotaryFunction, config, n_layers: int) -> list:
    """Which call feeds which layer, when the model says so: Gemma-3's ``layer_type`` calls."""
    layer_types = getattr(config, "layer_types", None)
    if rotary.extra == ["layer_type"] and isinstance(layer_types, (list, tuple)) and len(layer_types) == n_layers:
        return [(("layer_type", t),) for t in layer_types]
    return [None] * n_layers


def install(model: nn.Module, scales: Sequence[float] | float) -> nn.Module:
    """Make layer h of ``model`` use positions i / scales[h]. Returns the same model.

    Installing on a model that already has LPES just updates the scales. Refuses (with
    :class:`LPESError`, naming the model type and the reason) models LPES cannot scale
    correctly; nothing is installed then.
    """
    if is_installed(model):
        set_scales(model, scales)
        return model
    parts = find_rope_parts(model)
    config = _decoder_config(parts, model)
    rotary = _RotaryFunction(parts.rotary_emb, parts.model_type)
    values = validate_scales(scales, len(parts.layers))
    _probe_rotary(parts, rotary, config)
    state = _LPESState(parts=parts, rotary=rotary, scales=[], nope_layers=_nope_layers(parts))
    _check_nope(state, values)
    state.layer_keys = _known_layer_keys(rotary, config, len(parts.layers))
    state.assign(values)
    state.handles.append(parts.decoder.register_forward_pre_hook(_start_forward(state)))
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
    values = validate_scales(scales, len(state.parts.layers))
    _check_nope(state, values)
    state.assign(values)
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
