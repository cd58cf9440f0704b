"""STRING, shifted rotary position ids (An et al., "Why does the effective context length of LLMs fall
short?", ICLR 2025): ``install`` on a model; ``string_hf`` runs it in lm-eval.

    lm_eval --model string_hf --tasks multi_needle                                  # S = 0.33 x 8192: no shift on 1k prompts
    lm_eval --model string_hf --model_args "shifted_offset=256,local_window=64" --tasks multi_needle

Large relative distances were rarely trained. In every layer, a query at distance ``d`` from a
key keeps ``d`` when ``d < S`` (``shifted_offset``) and reads ``d - S + W`` otherwise
(``W``: ``local_window``): the far keys are seen at well-trained distances from ``W`` on, the near
ones as before. Done by rotating each query twice, at its position ``i`` and at ``i - S + W``,
and taking, per key, the score of the rotation its distance calls for; the keys (and the KV
cache) keep their true positions, so cached decoding is the same computation as a full forward.

Facts from the authors' code (HKUNLP/STRING, ``string_for_llama.py``, ``README.md``,
``ruler/test_ruler_llama.py``) and our choices:

- **Defaults.** ``S = shifted_ratio x L`` with ``shifted_ratio`` 0.33 (the README: 0.25-0.4) and
  ``L`` the model's trained context, ``max_position_embeddings`` (the README's
  ``L = config.max_position_embeddings``; the RULER script uses its test length), ``W = 128``.
  On SmolLM2 (8192) that is ``S = 2703``: a 1k-token prompt has no distance that large, so the
  shift changes nothing there; ``shifted_offset=256,local_window=64`` (about a third of such a
  prompt) would. Gemma-3-270M: 32768, ``S = 10813``.
- **Attention factor.** The reference multiplies its cos/sin cache, hence queries and keys, by
  ``1 + 0.1 ln 2`` ("STRING makes the attention map smooth ... similar with YaRN"), so every
  attention logit by its square (1.143), near keys too. Kept as ``attention_factor`` (default
  that value; 1 turns it off). So at the default S a short prompt still sees sharper attention.
- **Off.** ``shifted_offset=0`` (or ``shifted_ratio=0``) is the plain model, bit for bit: the
  reference does not patch the model then (``if shifted_offset > 1``), factor included.
- **The boundary.** The reference's prefill counts the key at distance exactly ``S`` in both
  parts (its window is ``[0, S]`` inclusive, its shifted part ``>= S``), its decoding in the
  shifted part only; we follow the paper and the decoding path: ``d >= S`` is shifted.
- Every layer, every head, as the reference. Its flash-attention merge of two kernels (by
  log-sum-exp) is one softmax here over scores chosen per key: the same numbers.
- **Families.** The rewritten attention is the methods' Llama-style one (Llama, Mistral,
  Qwen2/3, Gemma, Gemma-3, Granite; the reference patches Llama, Mistral, Qwen2); the second
  rotation uses each layer's own RoPE (Gemma-3's per layer type, llama3 / dynamic NTK as the
  model's call chose them).
- **On an LPES curve** (installed first: ``string_hf lpes_scales=``, the stack ``lpes+string``) S and W
  stay distances in tokens, chosen by the true distance; the far query is rotated in the layer's frame
  as the near one is, at ``(i - S + W) / p_h`` with base ``b_h x theta`` (:mod:`~.under_lpes`).

Cost: no extra forward; per layer a second query rotation, and the attention computed by hand in
float32 instead of the model's fused kernel, in blocks of queries over the causal triangle (each key
scored once, by the rotation its distance calls for, but in a band as wide as a block where both are
computed). ``benchmarks/string_blocks.py`` times both ways side by side: on Gemma-3-270M, one 2,611-token
prompt, bfloat16, a 2-core Xeon with AMX, the prefill took 5.97x the plain model's in one block (both
rotations against nearly every key, as before the blocks) and 2.32x in blocks of 256.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lpes_harness.core import rope_anatomy, rope_math
from lpes_harness.methods import METHODS, attention, model_checks, query_rows
from lpes_harness.methods.arguments import MethodError
from lpes_harness.methods.parameters import Parameter
from lpes_harness.methods.state import MethodState, Slot
from lpes_harness.methods.under_lpes import LayerFrames

ENTRY = METHODS["string"]
NAME = ENTRY.lm_eval
SHIFTED_OFFSET, SHIFTED_RATIO, LOCAL_WINDOW, ATTENTION_FACTOR = ENTRY.parameters
REFERENCE_ATTENTION_FACTOR = ATTENTION_FACTOR.default
TRAINED_LENGTH = Parameter("trained_length", None, None, low=1, integer=True)


@dataclass
class _State(MethodState):
    parts: rope_anatomy.RoPEParts
    shifted_offset: int
    local_window: int
    attention_factor: float
    recorder: rope_math.PositionRecorder | None = None


SLOT = Slot("_string_state", NAME, "string_shift")


def resolve_offset(shifted_offset: Any, shifted_ratio: Any, local_window: Any, trained_length: int | None) -> tuple[int, int]:
    """``(S, W)``: S given, or ``shifted_ratio x trained_length``; checked (``S = 0``, or ``S >= W``)."""
    window = LOCAL_WINDOW.check(local_window, NAME)
    if shifted_offset is None:
        ratio = SHIFTED_RATIO.check(shifted_ratio, NAME)
        if ratio and not trained_length:
            raise MethodError(f"{NAME}: the model's config has no max_position_embeddings; give shifted_offset=<tokens>")
        offset = int(ratio * trained_length) if ratio else 0
    else:
        offset = SHIFTED_OFFSET.check(shifted_offset, NAME)
    if offset and offset < window:
        raise MethodError(f"{NAME}: shifted_offset={offset} is below local_window={window}; the shift is S - W, "
                            f"so give shifted_offset >= local_window (or 0: the plain model)")
    return offset, window


# Queries per block of the attention: a block's keys end at its last query (causal), so the
# blocks together cover the causal triangle, not the square, and a block's scores stay small.
QUERY_BLOCK = 256


def _block_scores(near, far, keys, first, last, shifted_offset):
    """Scores of query rows ``first..last-1`` against the keys they may see (causal: up to the last
    row's own key), each key with the rotation its distance calls for. The keys split in three: those
    at distance >= S from every row of the block (the far rotation alone), those under S from every
    row (the near one alone), and between them a band as wide as the block where the rows disagree.
    Each score is one product of one query and one key, as with full matrices."""
    past = keys.shape[2] - near.shape[2]  # keys before the first query of this forward (a cache)
    end = last + past
    far_end = min(end, max(0, last - 1 + past - shifted_offset + 1))  # keys shifted for the block's last row
    near_start = min(far_end, max(0, first + past - shifted_offset + 1))  # keys shifted for its first row
    rows = slice(first, last)
    distance = (torch.arange(first, last, device=near.device)[:, None] + past
                - torch.arange(near_start, far_end, device=near.device)[None, :])
    band = distance >= shifted_offset
    parts = (far[:, :, rows] @ keys[:, :, :near_start].transpose(-1, -2),
             torch.where(band, far[:, :, rows] @ keys[:, :, near_start:far_end].transpose(-1, -2),
                         near[:, :, rows] @ keys[:, :, near_start:far_end].transpose(-1, -2)),
             near[:, :, rows] @ keys[:, :, far_end:end].transpose(-1, -2))
    return torch.cat(parts, dim=-1)


def _forward(state: _State, frames: LayerFrames, index: int):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, cache=None,
                **kwargs):
        layer_cache = attention.layer_cache(past_key_values, cache)
        batch, q_len = hidden_states.shape[:2]
        query, key, value = attention.projections(self, hidden_states)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        near, key = rope_math.apply_rope(query, cos, sin), rope_math.apply_rope(key, cos, sin)
        positions = state.recorder.position_ids.to(hidden_states.device)
        shifted_positions = positions - state.shifted_offset + state.local_window
        # The far rotation in the layer's frame: under an LPES curve, (i - S + W) / p_h at its base b_h x theta,
        # as the near one (the layer's own (cos, sin), which the curve replaced); without one, the layer's RoPE.
        cos2, sin2 = frames.cos_sin(index, shifted_positions, query.dtype)
        far = rope_math.apply_rope(query, cos2.unsqueeze(1), sin2.unsqueeze(1))
        if layer_cache is not None:
            key, value = layer_cache.update(key, value, self.layer_idx)
        groups = query.shape[1] // key.shape[1]
        keys, values = attention.repeat_heads(key, groups).float(), attention.repeat_heads(value, groups).float()
        near, far, kv_len = near.float(), far.float(), keys.shape[2]
        visible = query_rows.visible_keys(attention_mask, q_len, kv_len, query.device)
        blocks = []
        for first in range(0, q_len, QUERY_BLOCK):
            last = min(first + QUERY_BLOCK, q_len)
            scores = _block_scores(near, far, keys, first, last, state.shifted_offset)
            scores = scores * (self.scaling * state.attention_factor**2)
            seen = scores.shape[-1]
            if seen < kv_len and visible[..., first:last, seen:].any():
                raise RuntimeError(f"{NAME} computes causal attention: this layer's mask lets a query see a later key")
            weights = query_rows.masked_softmax(scores, visible[..., first:last, :seen])
            blocks.append(torch.matmul(weights, values[:, :, :seen]))
        output = torch.cat(blocks, dim=2).to(value.dtype).transpose(1, 2)
        return self.o_proj(output.reshape(batch, q_len, -1).contiguous()), None

    return forward


def install(model: nn.Module, shifted_offset: Any = None, local_window: Any = 128,
            attention_factor: Any = REFERENCE_ATTENTION_FACTOR, shifted_ratio: Any = 0.33,
            trained_length: Any = None) -> nn.Module:
    """Shift every layer's far distances (``S`` = ``shifted_offset``, or ``shifted_ratio`` x
    ``trained_length``, default the config's ``max_position_embeddings``). ``S = 0`` changes nothing."""
    SLOT.free(model)
    factor, length = check_arguments(shifted_offset, local_window, attention_factor, shifted_ratio, trained_length)
    attention.check_attention_implementation(model, NAME)
    parts, ropes = model_checks.check_model(model, NAME, rewrites_attention=True)
    config = rope_anatomy.decoder_config(parts, model)
    offset, window = resolve_offset(shifted_offset, shifted_ratio, local_window,
                                    length or getattr(config, "max_position_embeddings", None))
    state = _State(parts, offset, window, factor)
    if offset:
        state.recorder = rope_math.PositionRecorder(parts)
        state.changes.on_remove(state.recorder.remove)
        frames = LayerFrames(model, parts, ropes)
        for index, layer in enumerate(parts.layers):
            state.changes.forward(layer.self_attn, _forward(state, frames, index))
    return SLOT.attach(model, state)


remove = SLOT.remove  # takes every change off: the model as it was
get_state = SLOT.get


def check_arguments(shifted_offset: Any = None, local_window: Any = 128, attention_factor: Any = REFERENCE_ATTENTION_FACTOR,
                    shifted_ratio: Any = 0.33, trained_length: Any = None) -> tuple[float, int | None]:
    """What install checks that needs no model (``string_hf`` runs it before the model loads):
    returns ``(attention_factor, trained_length)`` as numbers."""
    factor = ATTENTION_FACTOR.check(attention_factor, NAME)
    length = None if trained_length is None else TRAINED_LENGTH.check(trained_length, NAME)
    resolve_offset(shifted_offset, shifted_ratio, local_window, length or 1)
    return factor, length


def settings(model: nn.Module) -> dict:
    """The installed setting, for lm-eval's model info (S = 0: the plain model, factor included)."""
    state = get_state(model)
    return {"shifted_offset": state.shifted_offset, "local_window": state.local_window,
            "attention_factor": state.attention_factor if state.shifted_offset else 1.0}
