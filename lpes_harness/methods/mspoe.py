"""Multi-scale Positional Encoding (Ms-PoE; Zhang et al., 2024): ``install`` on a model; ``mspoe_hf`` runs it in lm-eval.

    lm_eval --model mspoe_hf --model_args "min_ratio=1.2,max_ratio=1.8" --tasks kv_retrieval

In each chosen layer (default: layers 2..L-1, as the authors' scripts), attention head h
rotates queries and keys as if token i sat at position ``i / r_h``, with the layer's own
RoPE: on Gemma-3, a sliding layer's base-10k RoPE and a full layer's 1M one (each with its
``inv_freq`` and ``attention_scaling``, linear scaling included). The ratios are
``r_j = min + (max - min) * j / H`` for ``j = 0..H-1`` (the reference's formula: the
largest ratio is just below ``max``).

Which head gets which ratio is decided per sample, on the prefill, from the *last* query's
attention computed with pre-RoPE queries and keys: a head's outlier share is the fraction
of visible keys whose weight is above 3x the mean weight. Heads are ranked by that share,
highest first. The order is then fixed for the rest of the generation.

Deliberate choices (see docs/baselines.md):

- **Head order -> ratio.** The paper gives heads that are more position-aware (a high
  outlier share) the *smaller* ratios. We do that: the head ranked k-th gets ``r_k``
  (``head_mapping=rank``, the default). The reference code instead indexes the ratio table
  with the ranking itself (``cos[head_order]``), so head h gets ``r_{order[h]}``, the
  permutation applied rather than its inverse; ``head_mapping=reference`` reproduces that.
- ``head_order=fixed`` skips the statistic: head h gets ``r_{H-1-h}`` for every sample
  (the reference's ``head_type="normal"``, used by its scripts for some answer positions).
- **Grouped-query attention.** The reference (written for multi-head Llama 2) rotates each
  shared key head with the ratio of the first query head of its group, so the other query
  heads of the group see keys at a different scale than their own queries. We keep one
  rotated key per *query* head, each at its query's ratio: exact, at the cost of
  ``num_heads / num_kv_heads`` times the key cache.
- **Padding.** The statistic uses each row's last real query and only its visible keys,
  so a batch gives the same answers as one sample at a time. For ``loglikelihood`` (right
  padding, no mask) ``mspoe_hf`` (``lmeval.method_models.MsPoELM``) tells the layers each row's length.
- The cache holds keys already rotated (per query head), so decoding costs one extra
  rotation of the new key only, not a re-rotation of the whole cache.
- The rewritten attention keeps what the model's own applies before and after RoPE: its
  per-head ``q_norm``/``k_norm`` (Qwen3, Gemma-3), its ``scaling`` (Gemma-3's
  ``query_pre_attn_scalar``) and the mask it is handed, which on Gemma-3 is the layer's own
  (sliding-window or full); the outlier statistic sees the keys that mask leaves visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lpes_harness.core import rope_anatomy, rope_math
from lpes_harness.methods import METHODS, arguments, attention, model_checks
from lpes_harness.methods.arguments import MethodError
from lpes_harness.methods.state import MethodState, Slot

ENTRY = METHODS["mspoe"]
MIN_RATIO, MAX_RATIO = ENTRY.parameters

HEAD_MAPPINGS = ("rank", "reference")
HEAD_ORDERS = ("outlier", "fixed")
OUTLIER_FACTOR = 3.0


@dataclass
class _MsPoEState(MethodState):
    parts: rope_anatomy.RoPEParts
    layers: list[int]
    min_ratio: float
    max_ratio: float
    head_mapping: str
    head_order: str
    recorder: rope_math.PositionRecorder
    # Per layer, per row: each head's ratio, set on the prefill, reused while decoding.
    head_ratios: dict[int, torch.Tensor] = field(default_factory=dict)
    # Set by mspoe_hf (MsPoELM) for right-padded loglikelihood batches: index of each row's last token.
    last_index: torch.Tensor | None = None


SLOT = Slot("_mspoe_state", "Ms-PoE", "mspoe")


def ratio_table(num_heads: int, min_ratio: float, max_ratio: float) -> torch.Tensor:
    """The reference's ratios: ``min + (max - min) * j / H``, ``j = 0..H-1``."""
    j = torch.arange(num_heads, dtype=torch.float32)
    return min_ratio + (max_ratio - min_ratio) * (j / num_heads)


def outlier_share(query: torch.Tensor, key: torch.Tensor, visible: torch.Tensor, scaling: float) -> torch.Tensor:
    """Per row and head, the share of visible keys weighted above 3x the mean, for one query each.

    ``query (B, H, D)``, ``key (B, H, T, D)``, ``visible (B, T)`` bool -> ``(B, H)``.
    """
    scores = torch.einsum("bhd,bhtd->bht", query.float(), key.float()) * scaling
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    n_visible = visible.sum(-1, keepdim=True).clamp(min=1).float()  # (B, 1)
    mean = 1.0 / n_visible
    above = (weights > OUTLIER_FACTOR * mean[:, :, None]) & visible[:, None, :]
    return above.float().sum(-1) / n_visible


def ratios_from_shares(shares: torch.Tensor, table: torch.Tensor, head_mapping: str) -> torch.Tensor:
    """``(B, H)`` outlier shares -> ``(B, H)`` ratio of each head."""
    order = torch.argsort(-shares, dim=-1, stable=True)  # order[k] = head ranked k-th (most outliers first)
    return ratios_from_order(order, table, head_mapping)


def ratios_from_order(order: torch.Tensor, table: torch.Tensor, head_mapping: str) -> torch.Tensor:
    """``order (B, H)``, most position-aware head first -> ``(B, H)`` ratio of each head."""
    table = table.to(order.device)
    if head_mapping == "reference":
        return table[order]  # head h gets r[order[h]]: the permutation itself
    ratios = torch.empty(order.shape, dtype=table.dtype, device=order.device)
    ratios.scatter_(-1, order, table.expand(order.shape).contiguous())  # head order[k] gets r[k]
    return ratios


def _visible_keys(attention_mask, batch: int, q_len: int, kv_len: int, query_index: torch.Tensor, device) -> torch.Tensor:
    """``(B, kv_len)`` bool: the keys the query at ``query_index`` (per row) may attend to."""
    rows = torch.arange(batch, device=device)
    if attention_mask is None:
        offset = kv_len - q_len
        keys = torch.arange(kv_len, device=device)
        return keys[None, :] <= (query_index[:, None] + offset)
    mask = attention_mask[:, 0] if attention_mask.dim() == 4 else attention_mask
    mask = mask.expand(batch, q_len, kv_len) if mask.shape[0] == 1 else mask
    row = mask[rows, query_index]
    return row if row.dtype == torch.bool else row == 0


def _mspoe_forward(state: _MsPoEState, layer_rope: rope_math.LayerRoPE):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, cache=None,
                **kwargs):
        past_key_values = attention.layer_cache(past_key_values, cache)
        batch, q_len = hidden_states.shape[:2]
        query, key, value = attention.projections(self, hidden_states)
        n_heads, n_kv = query.shape[1], key.shape[1]
        key = attention.repeat_heads(key, n_heads // n_kv)  # one key per query head: each gets its own ratio
        past = past_key_values.get_seq_length(self.layer_idx) if past_key_values is not None else 0

        if state.head_order == "fixed":
            # The reference's head_type="normal": head h gets r[H-1-h], the same sample after sample.
            table = ratio_table(n_heads, state.min_ratio, state.max_ratio).to(query.device)
            state.head_ratios[self.layer_idx] = table.flip(0).expand(batch, n_heads)
        elif past == 0 or self.layer_idx not in state.head_ratios:
            if state.last_index is not None:
                query_index = state.last_index.to(hidden_states.device)
            else:
                query_index = torch.full((batch,), q_len - 1, device=hidden_states.device, dtype=torch.long)
            visible = _visible_keys(attention_mask, batch, q_len, q_len, query_index, hidden_states.device)
            last_query = query[torch.arange(batch, device=query.device), :, query_index]
            shares = outlier_share(last_query, key, visible, self.scaling)
            table = ratio_table(n_heads, state.min_ratio, state.max_ratio)
            state.head_ratios[self.layer_idx] = ratios_from_shares(shares, table, state.head_mapping)
        ratios = state.head_ratios[self.layer_idx]  # (B, H)

        position_ids = state.recorder.position_ids.to(hidden_states.device)  # (B, T)
        scaled = position_ids[:, None, :].float() / ratios[:, :, None]  # (B, H, T)
        cos, sin = rope_math.cos_sin(scaled, layer_rope.inv_freq, layer_rope.attention_scaling, query.dtype)
        query, key = rope_math.apply_rope(query, cos, sin), rope_math.apply_rope(key, cos, sin)

        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
        output = attention.attend(self, query, key, value, attention_mask, **kwargs)
        return self.o_proj(output.reshape(batch, q_len, -1).contiguous()), None

    return forward


def install(
    model: nn.Module,
    min_ratio: float = MIN_RATIO.default,
    max_ratio: float = MAX_RATIO.default,
    layers: Any = None,
    head_mapping: str = "rank",
    head_order: str = "outlier",
) -> nn.Module:
    """Give each head of the chosen layers its own position ratio (Ms-PoE). Returns the same model."""
    SLOT.free(model)
    min_ratio, max_ratio = float(min_ratio), float(max_ratio)
    check_arguments(min_ratio, max_ratio, layers, head_mapping, head_order)
    attention.check_attention_implementation(model, ENTRY.lm_eval)
    parts, ropes = model_checks.check_model(model, ENTRY.lm_eval, rewrites_attention=True)
    chosen = arguments.parse_layers(layers, len(parts.layers), default_start=2)
    state = _MsPoEState(parts, chosen, min_ratio, max_ratio, head_mapping, head_order, rope_math.PositionRecorder(parts))
    state.changes.on_remove(state.recorder.remove)
    for index in chosen:
        state.changes.forward(parts.layers[index].self_attn, _mspoe_forward(state, ropes[index]))
    return SLOT.attach(model, state)


remove = SLOT.remove  # takes every change off: the model as it was
get_state = SLOT.get


def settings(model: nn.Module) -> dict:
    """The installed setting, for lm-eval's model info."""
    state = get_state(model)
    return {"min_ratio": state.min_ratio, "max_ratio": state.max_ratio, "layers": state.layers,
            "head_mapping": state.head_mapping, "head_order": state.head_order}


def check_arguments(min_ratio: Any = MIN_RATIO.default, max_ratio: Any = MAX_RATIO.default, layers: Any = None,
                    head_mapping: str = "rank", head_order: str = "outlier") -> None:
    """What install checks that needs no model (``mspoe_hf`` runs it before the model loads)."""
    # A one-line MethodError for a value that is not a positive number (not float()'s traceback from lm_eval).
    min_ratio, max_ratio = MIN_RATIO.check(min_ratio, ENTRY.lm_eval), MAX_RATIO.check(max_ratio, ENTRY.lm_eval)
    if not min_ratio <= max_ratio:
        raise MethodError(
            f"min_ratio={min_ratio:g}, max_ratio={max_ratio:g}: need 0 < min_ratio <= max_ratio (the paper: 1.2 and 1.8)"
        )
    if layers is not None:
        arguments.layer_selector(layers)  # its range needs the model
    if head_mapping not in HEAD_MAPPINGS:
        raise MethodError(f"head_mapping={head_mapping!r} is not one of {', '.join(HEAD_MAPPINGS)}")
    if head_order not in HEAD_ORDERS:
        raise MethodError(f"head_order={head_order!r} is not one of {', '.join(HEAD_ORDERS)}")
