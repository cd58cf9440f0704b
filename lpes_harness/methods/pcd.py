"""Positional Contrastive Decoding (PCD; Xiao et al., "Mitigating Posterior Salience Attenuation in
Long-Context LLMs with Positional Contrastive Decoding", ACL 2025, arXiv 2506.08371): ``install`` on a
model; ``pcd_hf`` runs it in lm-eval.

    lm_eval --model pcd_hf --model_args "base_ratio=0.1,weight=0.5" --tasks mdqa

What the paper defines (there is no public code): the logits ``L`` of the model as it is (RoPE
frequencies ``theta_j = B^(-2(j-1)/d)``, "long-aware" attention) are contrasted with the logits
``L'`` of the same model whose RoPE base is lowered from ``B`` to ``B' < B``
(``theta'_j = B'^(-2(j-1)/d)``, "local-aware" attention: the low-frequency dimensions over-rotate,
so attention decays faster with distance and favours the nearby tokens), and the next token is
decoded from the contrast, which keeps what the long-aware attention adds over the local one.
Two forwards per token. Here:

- **Which dimensions.** Every dimension takes the base ``B'`` (``theta'_j / theta_j = (B/B')^(2(j-1)/d)``:
  1 for the highest frequency, growing toward the lowest, which is the paper's "over-rotating the
  low-frequency encoding"), on every layer. ``base_ratio`` is ``B'/B``; on a model whose layer types
  have their own RoPE (Gemma-3: 10k sliding, 1M full) each type's base is lowered by that ratio,
  keeping the model's ratio between the types (as ``buckets`` does with its bases).
- **The contrast** (our reading; the stored copies of the paper we could read stop before its
  equation): ``L_PCD = L + w (L - L')``, i.e. ``(1 + w) L - w L'``, the contrastive-decoding form
  of O'Brien & Lewis (2023), ``weight`` = ``w``. Written as ``L + w (L - L')`` it is ``L`` itself, bit
  for bit, at ``w = 0`` and at ``B' = B`` (``L - L' = 0``). Contrasting log-probabilities instead
  of logits gives the same distribution (they differ by a constant per position), so lm-eval's
  log-softmax of ``L_PCD`` is the same either way.
- **No plausibility mask.** Contrastive decoding often restricts the choice to tokens with
  ``p >= alpha * max p`` under ``L``; no summary of PCD mentions one, and in ``loglikelihood`` a
  mask would give every answer token outside that set a log-likelihood of ``-inf``. Not applied.
- **Defaults** ``base_ratio = 0.1``, ``weight = 0.5`` are ours (the paper's settings could not be
  read); the tuner's grid spans them.

The two copies run as two row blocks of one batch (rows ``B .. 2B-1`` at the lowered base), so
one KV cache holds both: the first block keeps the model's own (cos, sin), the second gets them
at ``B'`` from the model's own frequencies (:func:`~lpes_harness.core.rope_math.inv_freq_for_base`).
``loglikelihood`` contrasts the logits at each answer position, the output layer only there;
generation is greedy, with its own loop (the two copies share one token per step). Only plain
RoPE (``rope_type: default``) has a base to lower. At the identity (``weight=0`` or
``base_ratio=1``) :func:`forward_logits` and :func:`generate` run the plain model, one copy.

**On an LPES curve** (installed first: ``pcd_hf lpes_scales=``, the stack ``lpes+pcd``) the model is the
curve's: ``L`` is the curve's logits, and the copy is that model at the lowered base, layer h at base
``r x b_h x theta`` and positions ``i / p_h`` (its pair under the curve). The copy's (cos, sin) then differ
per layer, so they are set by a hook on each layer, after the curve's, instead of on the rotary call (whose
output the curve's hooks must find unchanged); with every pair (1, 1) that gives the numbers of the hook
above, bit for bit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lpes_harness.core import rope, rope_anatomy, rope_math
from lpes_harness.core.models import cache_keyword, output_layer
from lpes_harness.methods import METHODS, decoding, model_checks
from lpes_harness.methods.under_lpes import LayerFrames
from lpes_harness.methods.state import MethodState, Slot

ENTRY = METHODS["pcd"]
BASE_RATIO, WEIGHT = ENTRY.parameter("base_ratio"), ENTRY.parameter("weight")
WHO = ENTRY.lm_eval


@dataclass
class _PCDState(MethodState):
    base_ratio: float  # B'/B
    weight: float  # w of L + w (L - L')
    bases: dict[str | None, float]  # per RoPE (None: the model's one, else a layer type): the lowered base B'
    ropes: dict[tuple, rope_math.LayerRoPE]  # per rotary call (LayerRoPE.key): the RoPE it computes
    inv_freq: dict[tuple, torch.Tensor]  # per rotary call: the frequencies at B'
    contrasting: bool = False  # a forward of the two copies is running: the second block gets B'
    # On an LPES curve: the copy's positions in this forward, and its (cos, sin) per (rotary call, layer pair).
    lowered_positions: torch.Tensor | None = None
    lowered: dict = field(default_factory=dict)

    @property
    def identity(self) -> bool:
        return is_identity(self.base_ratio, self.weight)


SLOT = Slot("_pcd_state", "PCD", "pcd")
remove = SLOT.remove  # takes every change off: the model as it was
get_state = SLOT.get


def check_arguments(base_ratio: Any = BASE_RATIO.default, weight: Any = WEIGHT.default) -> tuple[float, float]:
    """What install checks that needs no model (``pcd_hf`` runs it before the model loads)."""
    return BASE_RATIO.check(base_ratio, WHO), WEIGHT.check(weight, WHO)


def is_identity(base_ratio: float, weight: float) -> bool:
    """Whether PCD is the plain model at these settings: no contrast, or a copy that is the model."""
    return weight == WEIGHT.identity or base_ratio == BASE_RATIO.identity


def install(model: nn.Module, base_ratio: Any = BASE_RATIO.default, weight: Any = WEIGHT.default) -> nn.Module:
    """Make the second half of every batch that :func:`forward_logits` runs use RoPE base ``base_ratio`` x theta
    (each layer type's theta). A plain call of the model is left as it is."""
    SLOT.free(model)
    base_ratio, weight = check_arguments(base_ratio, weight)
    parts, layer_ropes = model_checks.check_model(model, WHO, rewrites_attention=False)
    config = rope_anatomy.decoder_config(parts, model)
    ropes = rope_math.distinct(layer_ropes)
    thetas = {r.layer_type: rope_math.rope_theta(config, parts.model_type, r.layer_type) for r in ropes}
    bases = {t: theta * base_ratio for t, theta in thetas.items()}
    inv_freq = {r.key: rope_math.inv_freq_for_base(r.inv_freq, thetas[r.layer_type], bases[r.layer_type]) for r in ropes}
    state = _PCDState(base_ratio, weight, bases, {r.key: r for r in ropes}, inv_freq)

    def lowered_second_block(x, position_ids, output, key):
        if not state.contrasting:
            return None  # a plain call of the model: its own RoPE
        if rope.is_installed(model):  # the curve's hooks would re-rotate this output, both copies at its base
            raise RuntimeError("PCD was installed before the LPES curve now under it: remove PCD (pcd.remove) and "
                               "install it again on the curve, so that its copy is lowered in the curve's frame")
        batch = x.shape[0]
        if batch % 2:
            raise RuntimeError(f"PCD: the batch ({batch} rows) is not 2 copies of the input; call pcd.forward_logits")
        if key not in state.inv_freq:
            raise RuntimeError(f"PCD: a rotary call {key} that the model's layer types did not announce")
        half, (cos, sin) = batch // 2, output
        positions = position_ids.expand(batch, -1)[half:]  # (1, T) when the model made them itself
        low_cos, low_sin = rope_math.cos_sin(positions, state.inv_freq[key].to(positions.device),
                                             state.ropes[key].attention_scaling, x.dtype)
        return (torch.cat([cos.expand(batch, *cos.shape[1:])[:half], low_cos]),
                torch.cat([sin.expand(batch, *sin.shape[1:])[:half], low_sin]))

    if rope.is_installed(model):  # a stack: the curve's hooks came first, the copy is lowered in its frame
        recorder = rope_math.PositionRecorder(parts, replace=_copy_positions(state))
        frames = LayerFrames(model, parts, layer_ropes)
        for index, layer in enumerate(parts.layers):
            hook = layer.register_forward_pre_hook(_lowered_in_layer(state, frames, index), with_kwargs=True)
            state.changes.on_remove(hook.remove)
    else:
        recorder = rope_math.PositionRecorder(parts, replace=lowered_second_block)
    state.changes.on_remove(recorder.remove)
    return SLOT.attach(model, state)


def _copy_positions(state: _PCDState):
    """Rotary hook under a curve: the call's output kept (the curve's hooks look it up), its copy's positions noted."""

    def note(x, position_ids, output, key):
        state.lowered = {}  # a new forward: the last one's (cos, sin) are stale
        if not state.contrasting:
            state.lowered_positions = None
            return None
        if x.shape[0] % 2:
            raise RuntimeError(f"PCD: the batch ({x.shape[0]} rows) is not 2 copies of the input; "
                               "call pcd.forward_logits")
        state.lowered_positions = position_ids.expand(x.shape[0], -1)[x.shape[0] // 2:]
        return None

    return note


def _lowered_in_layer(state: _PCDState, frames: LayerFrames, index: int):
    """Layer pre-hook under a curve: the second row block's (cos, sin) at the lowered base, in the layer's frame."""
    key = frames.ropes[index].key

    def hook(module, args, kwargs):
        if not state.contrasting:
            return None
        cos, sin = kwargs["position_embeddings"]  # the curve's, for the layer's pair: the first copy's
        pair = frames.pair(index)
        if (key, pair) not in state.lowered:  # once per forward for the layers of one call and pair
            state.lowered[key, pair] = frames.cos_sin(index, state.lowered_positions, cos.dtype, state.base_ratio, pair)
        low_cos, low_sin = state.lowered[key, pair]
        batch = 2 * low_cos.shape[0]
        kwargs["position_embeddings"] = (torch.cat([cos.expand(batch, *cos.shape[1:])[:batch // 2], low_cos]),
                                         torch.cat([sin.expand(batch, *sin.shape[1:])[:batch // 2], low_sin]))
        return args, kwargs

    return hook


def settings(model: nn.Module) -> dict:
    """The installed setting, for lm-eval's model info: the ratio, the weight, and the lowered base(s)."""
    state = get_state(model)
    bases = state.bases[None] if list(state.bases) == [None] else state.bases
    return {"base_ratio": state.base_ratio, "weight": state.weight, "lowered_base": bases}


def contrast(weight: float, logits: torch.Tensor) -> torch.Tensor:
    """``(2, ..., V)`` (the model's logits, then the lowered-base copy's) -> ``L + w (L - L')`` in float32."""
    normal, local = logits[0].float(), logits[1].float()
    return normal + weight * (normal - local)


@contextlib.contextmanager
def _two_copies(state: _PCDState):
    state.contrasting = True
    try:
        yield
    finally:
        state.contrasting = False
        state.lowered, state.lowered_positions = {}, None  # no tensor of the forward outlives it


def forward_logits(model: nn.Module, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                   last_only=False):
    """PCD's logits ``(B, T, V)`` (``(B, V)`` with ``last_only``): one forward of the two copies, contrasted;
    at the identity, the plain model's forward (one copy)."""
    state = get_state(model)
    copies = 1 if state.identity else 2
    repeat = lambda t: None if t is None else t.repeat(copies, *([1] * (t.dim() - 1)))  # noqa: E731
    with _two_copies(state) if copies == 2 else contextlib.nullcontext():
        out = model(input_ids=repeat(input_ids), attention_mask=repeat(attention_mask), position_ids=repeat(position_ids),
                    use_cache=past_key_values is not None, **{cache_keyword(model): past_key_values},
                    logits_to_keep=1 if last_only else 0)
    logits = out.logits
    if copies == 2:  # rows B.. are the lowered-base copy
        logits = contrast(state.weight, logits.reshape(2, input_ids.shape[0], *logits.shape[1:]))
    return logits[:, -1] if last_only else logits


def answer_logits(model: nn.Module, input_ids, rows, columns) -> torch.Tensor:
    """PCD's logits ``(n, V)`` at positions ``(rows[i], columns[i])`` of ``input_ids`` ``(B, T)``: one forward
    of the two copies through the decoder, the output layer only at those positions, contrasted."""
    state = get_state(model)
    if state.identity:
        hidden = model.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
        return output_layer(model, hidden[rows, columns])
    with _two_copies(state):
        hidden = model.get_decoder()(input_ids=input_ids.repeat(2, 1), use_cache=False).last_hidden_state
    hidden = hidden.reshape(2, input_ids.shape[0], *hidden.shape[1:])[:, rows, columns]  # (2, n, H)
    return contrast(state.weight, output_layer(model, hidden))


def generate(model: nn.Module, input_ids, attention_mask=None, max_length=None, max_new_tokens=None,
             stopping_criteria=None, pad_token_id=None):
    """Greedy decoding from PCD's logits, one KV cache holding both copies."""
    return decoding.generate_with(forward_logits, model, input_ids, attention_mask, max_length, max_new_tokens,
                                  stopping_criteria, pad_token_id)
