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

``scaling="base"`` (not the paper's; see :func:`install`) reads s_h as a factor on the layer's RoPE
base instead: layer h rotates with base s_h * theta, which leaves RoPE's fastest frequencies as
they are and slows the slowest by s_h (frequency j times s_h^(-2j/d)), where a position scale
slows all of them alike. On Gemma-3-270M that is the change that removes its position bias
(results/tuned_baselines_gemma3/buckets_single_base), and a position scale cannot express it.
The layer's (cos, sin) are then computed from the model's own ``inv_freq`` raised to the new
base (:mod:`lpes_harness.core.rope_math`, which the methods that change bases share); so
it is defined for plain ('default') RoPE only and refused, at :func:`install`, for others.

``scaling="both"`` gives layer h a pair (p_h, b_h), passed as one flat list of 2L numbers (the L
position factors, then the L base factors; :mod:`lpes_harness.core.scaling`): the layer rotates with base
b_h * theta at positions i / p_h. A pair with b_h = 1 takes the position path above, one with
p_h = 1 the base path; a pair (1, 1) leaves the layer untouched. Base factors other than 1 are
refused, at :func:`install` or :func:`set_scales`, on RoPEs other than plain ones. What each scaling
does to a layer's RoPE is its entry's ``rope_pair`` in that table: one path here serves them all.

Scales live in a plain list on the installed state and are read at call time, so
:func:`set_scales` changes them in place with no re-install; :func:`remove` takes the
hooks off and leaves the model exactly as it was. Layers with scale 1 are left untouched,
so all-ones is bit-exact vanilla.

What is refused at :func:`install`, with the model type and the reason: models without a
model-level rotary embedding (learned or ALiBi positions), rotary embeddings that do not
return a ``(cos, sin)`` pair (Llama-4's complex ``freqs_cis``), and a scale other than 1 on
a layer that applies no RoPE (NoPE layers of SmolLM3, Cohere2, ...). Finding the rotary
embedding, the layers and the NoPE layers, and the model's rotary function without its
decorator, is :mod:`lpes_harness.core.rope_anatomy` (shared with the baselines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from lpes_harness.core import rope_math
from lpes_harness.core.rope_anatomy import (
    LPESError,
    RoPEParts,
    RotaryFunction,
    decoder_config,
    find_rope_parts,
    is_cos_sin,
    known_layer_keys,
    nope_layers_in,
    probe_rotary,
)
from lpes_harness.core.rope_factors import validate_scales
from lpes_harness.core.scaling import DEFAULT, SCALINGS, Scaling

# Key under which the scales are kept in ``model.config`` (and so in config.json
# after ``save_pretrained``); ``lpes_hf`` re-applies them on load.
CONFIG_KEY = "lpes_scales"
# ... and what they scale, when it is not positions.
CONFIG_SCALING_KEY = "lpes_scaling"


@dataclass
class _RotaryCall:
    """One call of ``rotary_emb`` in the current forward."""

    args: tuple
    kwargs: dict
    output: tuple | None  # the (cos, sin) it returned; None when it is not such a pair
    key: tuple | None = None  # its arguments other than x and position_ids (e.g. layer_type)
    scaled: dict = field(default_factory=dict)  # layer factor -> its (cos, sin)


@dataclass
class _LPESState:
    parts: RoPEParts
    rotary: RotaryFunction
    scales: list[float]  # as given: one per layer, or 2L under scaling "both"
    nope_layers: dict[int, str] = field(default_factory=dict)  # layer -> why it has no RoPE
    handles: list[Any] = field(default_factory=list)
    # Derived from ``scales`` when they are set: each layer's factor (a number, or a (p, b) pair
    # under "both") and the distinct ones that change something.
    factors: list = field(default_factory=list)
    distinct: list = field(default_factory=list)
    # Per layer, the key of the rotary call that feeds it (None until known).
    layer_keys: list = field(default_factory=list)
    # Per call key: the non-identity factors of the layers that call feeds (or may feed), sorted;
    # derived from ``scales`` and ``layer_keys``, so emptied when either changes.
    wanted: dict = field(default_factory=dict)
    # Per forward: every rotary call so far.
    calls: list[_RotaryCall] = field(default_factory=list)
    divisors: dict = field(default_factory=dict)  # (scales, device) -> the scales as a tensor
    kind: Scaling = SCALINGS[DEFAULT]  # the table's entry of the scaling
    # A scaling that moves bases: per rotary call key, the RoPE it computes and that RoPE's base theta.
    bases: dict = field(default_factory=dict)
    # One that also moves positions, on a RoPE a base factor cannot change: why; refused once a base factor is not 1.
    base_refusal: str | None = None

    @property
    def identity(self):
        """The factor that leaves a layer as it is: 1, or the pair (1, 1) under "both"."""
        return self.kind.identity_factor

    def assign(self, scales: list[float]) -> None:
        self.scales[:] = scales
        self.factors = self.kind.layer_factors(scales)
        self.distinct = sorted({f for f in self.factors if f != self.identity})
        self.divisors = {}
        self.wanted = {}
        for call in self.calls:
            call.scaled.clear()


_STATE_ATTR = "_lpes_state"


# ----------------------------------------------------------------------------- validation


def _check_factors(state: _LPESState, scales: list[float]) -> None:
    """What the model's layers cannot take: a factor on a NoPE layer, a base factor on a RoPE it cannot change."""
    factors = state.kind.layer_factors(scales)
    scaled = [i for i in state.nope_layers if factors[i] != state.identity]
    if scaled:
        nope = sorted(state.nope_layers)
        reasons = "; ".join(sorted(set(state.nope_layers.values())))
        raise LPESError(
            f"model type '{state.parts.model_type}': layer(s) {scaled} were given scale(s) "
            f"{[factors[i] for i in scaled]}, but they apply no RoPE ({reasons}), so a position scale "
            f"there has no meaning; give {state.identity} for layers {nope}"
        )
    if state.base_refusal and any(state.kind.rope_pair(f)[1] != 1.0 for f in factors):
        raise LPESError(state.base_refusal)


# ----------------------------------------------------------------------------- hooks


def _start_forward(state: _LPESState):
    def hook(module, args):
        state.calls = []  # a new forward: the calls of the previous one are stale
        return None

    return hook


def _remember_rotary_call(state: _LPESState):
    def hook(module, args, kwargs, output):
        call = _RotaryCall(args, kwargs, tuple(output) if is_cos_sin(output) else None)
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


def _compute_scaled(state: _LPESState, call: _RotaryCall, factors: list) -> list[tuple]:
    """``call``'s (cos, sin) for every layer factor in ``factors``.

    Position scales ``s``: the call re-run at ``position_ids / s`` for all of them at once, one
    rotary computation: positions become a (n_scales * batch, seq) tensor, so the whole set costs
    about what one (cos, sin) costs; this matters during cached generation, where each step is tiny
    and one call per layer would show in the latency. Every scaling's factor is a pair (p, b) to RoPE
    (:meth:`~lpes_harness.core.scaling.Scaling.rope_pair`: a position scale s is (s, 1), a base factor
    b is (1, b)): those with b = 1 are position scales, the others the call's RoPE at base b, at
    ``position_ids / p`` (:func:`_rebased`).
    """
    plain = state.rotary.plain_split(call.args, call.kwargs)
    if plain is not None:
        bound = None
        x, position_ids = plain
    else:
        x, bound = None, state.rotary.bind(call.args, call.kwargs)
        position_ids = bound.arguments["position_ids"]
    if position_ids.dim() != 2:
        raise RuntimeError(
            f"LPES: model type '{state.parts.model_type}' calls its rotary embedding with position_ids "
            f"of shape {tuple(position_ids.shape)} (several position axes, as in M-RoPE); LPES supports "
            f"(batch, seq) positions only"
        )
    pairs = [state.kind.rope_pair(factor) for factor in factors]
    scales = [p for p, b in pairs if b == 1.0]
    stacked = dict(zip(scales, _stacked(state, position_ids, x, bound, scales))) if scales else {}

    def divided(p: float) -> torch.Tensor:
        return position_ids if p == 1.0 else position_ids.float() / _divisors(state, [p], position_ids)[0]

    return [stacked[p] if b == 1.0 else _rebased(state, call, divided(p), b) for p, b in pairs]


def _divisors(state: _LPESState, scales: list[float], position_ids: torch.Tensor) -> torch.Tensor:
    """``scales`` as a (n, 1, 1) float32 tensor on the positions' device, made once per device and set."""
    divisors = state.divisors.get((tuple(scales), position_ids.device))
    if divisors is None:  # once per device and set of scales, not once per forward
        divisors = torch.tensor(scales, dtype=torch.float32, device=position_ids.device).view(-1, 1, 1)
        state.divisors[(tuple(scales), position_ids.device)] = divisors
    return divisors


def _stacked(state: _LPESState, position_ids: torch.Tensor, x, bound, scales: list[float]) -> list[tuple]:
    """The rotary call (``x`` of a plain call, else its ``bound`` arguments) at ``position_ids / s`` for each ``s``."""
    divisors = _divisors(state, scales, position_ids)
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


def _rebased(state: _LPESState, call: _RotaryCall, position_ids: torch.Tensor, factor: float) -> tuple:
    """``call``'s (cos, sin) with its RoPE's base multiplied by ``factor``, at ``position_ids``."""
    layer_rope, theta = state.bases[call.key]
    inv_freq = rope_math.inv_freq_for_base(layer_rope.inv_freq, theta, theta * factor)
    return rope_math.cos_sin(position_ids, inv_freq, layer_rope.attention_scaling, call.output[0].dtype)


def _scaled_position_embeddings(state: _LPESState, call: _RotaryCall, factor) -> tuple:
    """(cos, sin) of ``call`` for a layer of factor ``factor`` (:func:`_compute_scaled`).

    On the first request for a call, every distinct factor of the layers that this call
    feeds (or may feed, while that is not yet known) is computed at once.
    """
    found = call.scaled.get(factor)
    if found is not None:
        return found
    wanted = state.wanted.get(call.key)
    if wanted is None:  # once per set of scales and call key, not once per forward
        wanted = sorted({f for f, key in zip(state.factors, state.layer_keys)
                         if f != state.identity and (key is None or key == call.key)})
        state.wanted[call.key] = wanted
    missing = sorted({factor, *wanted} - call.scaled.keys())
    call.scaled.update(zip(missing, _compute_scaled(state, call, missing)))
    return call.scaled[factor]


def _layer_pre_hook(state: _LPESState, layer_index: int):
    def hook(module, args, kwargs):
        factor = state.factors[layer_index]
        if factor == state.identity:
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
                f"({len(state.calls)} recorded), so its scale {factor} cannot be applied; this "
                f"architecture's forward is not supported"
            )
        kwargs["position_embeddings"] = _scaled_position_embeddings(state, call, factor)
        return args, kwargs

    return hook


def _release_after_forward(state: _LPESState):
    def hook(module, args, output):
        # Drop the per-forward tensors so no activations outlive the forward.
        state.calls = []
        return None

    return hook


# ----------------------------------------------------------------------------- public API


def num_layers(model: nn.Module) -> int:
    """How many scales ``model`` takes: one per decoder layer."""
    return len(find_rope_parts(model).layers)


def check_supported(model: nn.Module) -> RoPEParts:
    """Everything :func:`install` checks before it touches the model; raises :class:`LPESError`."""
    parts = find_rope_parts(model)
    probe_rotary(parts, RotaryFunction(parts.rotary_emb, parts.model_type), decoder_config(parts, model))
    return parts


def install(model: nn.Module, scales: Sequence[float] | float, scaling: str = DEFAULT) -> nn.Module:
    """Make layer h of ``model`` use positions i / scales[h]. Returns the same model.

    ``scaling="base"``: layer h uses RoPE base scales[h] * theta (its own layer type's theta) at
    the true positions instead; plain ('default') RoPE only. ``scaling="both"``: ``scales`` holds
    2L numbers, ``[p_0..p_{L-1}, b_0..b_{L-1}]``, and layer h uses base b_h * theta at positions
    i / p_h (base factors other than 1 on plain RoPE only).

    Installing on a model that already has LPES just updates the scales (the scaling must be the
    installed one). Refuses (with :class:`LPESError`, naming the model type and the reason) models
    LPES cannot scale correctly; nothing is installed then.
    """
    if scaling not in SCALINGS:
        raise LPESError(f"scaling={scaling!r} is not one of {', '.join(SCALINGS)}")
    if is_installed(model):
        if _get_state(model).kind.name != scaling:
            raise LPESError(f"LPES is installed on this model with scaling={_get_state(model).kind.name!r}; "
                            f"remove it (rope.remove) before installing scaling={scaling!r}")
        set_scales(model, scales)
        return model
    parts = find_rope_parts(model)
    config = decoder_config(parts, model)
    rotary = RotaryFunction(parts.rotary_emb, parts.model_type)
    values = validate_scales(scales, len(parts.layers), scaling)
    probe_rotary(parts, rotary, config)
    kind = SCALINGS[scaling]
    state = _LPESState(parts=parts, rotary=rotary, scales=[], nope_layers=nope_layers_in(parts), kind=kind)
    if kind.moves_base:
        try:
            state.bases = _layer_bases(parts, config, kind)
        except LPESError as err:
            if not kind.moves_positions:  # nothing left that such a RoPE could take
                raise
            state.base_refusal = str(err)  # it still takes position factors on such a RoPE
    _check_factors(state, values)
    state.layer_keys = known_layer_keys(rotary, config, len(parts.layers))
    state.assign(values)
    state.handles.append(parts.decoder.register_forward_pre_hook(_start_forward(state)))
    state.handles.append(parts.rotary_emb.register_forward_hook(_remember_rotary_call(state), with_kwargs=True))
    for index, layer in enumerate(parts.layers):
        state.handles.append(layer.register_forward_pre_hook(_layer_pre_hook(state, index), with_kwargs=True))
    state.handles.append(parts.decoder.register_forward_hook(_release_after_forward(state)))
    setattr(model, _STATE_ATTR, state)
    setattr(model.config, CONFIG_KEY, list(state.scales))
    if scaling != DEFAULT:  # absent means position: configs saved before base scaling still load
        setattr(model.config, CONFIG_SCALING_KEY, scaling)
    return model


def _layer_bases(parts: RoPEParts, config, kind: Scaling) -> dict:
    """Per rotary call key, the RoPE it computes and its base; refuses what a base factor cannot change."""
    what = f"scaling={kind.name!r}" + (" with a base factor other than 1" if kind.moves_positions else "")
    ropes = rope_math.layer_ropes(parts, config)
    if ropes is None:
        raise LPESError(f"model type '{parts.model_type}': its rotary embedding takes arguments other than the "
                        f"positions and a layer type, so {what} cannot tell which RoPE each layer uses")
    try:
        return {r.key: (r, rope_math.rope_theta(config, parts.model_type, r.layer_type))
                for r in rope_math.distinct(ropes)}
    except LPESError as err:
        raise LPESError(f"{what}: {err}") from None


def set_scales(model: nn.Module, scales: Sequence[float] | float) -> None:
    """Change the installed scales in place (no re-install, no reload); 2L numbers under scaling "both"."""
    state = _get_state(model)
    values = validate_scales(scales, len(state.parts.layers), state.kind.name)
    _check_factors(state, values)
    state.assign(values)
    setattr(model.config, CONFIG_KEY, list(state.scales))


def get_scaling(model: nn.Module) -> str | None:
    """What the installed scales multiply ("position", "base" or "both"); None when LPES is not installed."""
    state = getattr(model, _STATE_ATTR, None)
    return None if state is None else state.kind.name


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
    for key in (CONFIG_KEY, CONFIG_SCALING_KEY):
        if hasattr(model.config, key):
            delattr(model.config, key)
    return model


def saved_scales(config) -> list[float] | None:
    """Scales stored in a model config by :func:`install` (e.g. read back from config.json)."""
    value = getattr(config, CONFIG_KEY, None)
    return None if value is None else [float(v) for v in value]


def saved_scaling(config) -> str:
    """What the scales stored in a model config multiply (read back from config.json)."""
    return getattr(config, CONFIG_SCALING_KEY, None) or DEFAULT


def _get_state(model: nn.Module) -> _LPESState:
    state = getattr(model, _STATE_ATTR, None)
    if state is None:
        raise LPESError("LPES is not installed on this model; call lpes_harness.core.rope.install(model, scales) first")
    return state
