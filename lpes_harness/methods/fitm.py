"""Attention calibration, "Found in the Middle" (Hsieh et al., Findings of ACL 2024): ``install`` on a model;
``fitm_hf`` runs it in lm-eval.

    lm_eval --model fitm_hf --model_args "num_spans=10,temperature=5e-5" --tasks multi_needle

The paper models the attention a document at position k receives as relevance plus a positional
bias, ``Attn(x_k, k) = rel(x_k) + bias(k)``, measures the bias with a dummy document placed at
position k, ``rel(x_k) = Attn(x_k, k) - Attn(x_dum, k)`` (its Eq. 4), and redistributes the
attention over the documents so that each one's mean per-token attention is proportional to
``softmax_k(rel(x_k) / t)`` while the documents' total attention stays the same (Eq. 5-6), in the
last half of the layers (16 of 32), every head; ``t = 5e-5``. There is no public code; where
the paper leaves a choice, ours:

- **Spans, not documents.** The harness's tasks have no common document markup (``multi_needle``
  joins its sentences with spaces), so the prompt's ``region`` (default the middle 90 %:
  ``0.05:0.95`` of its tokens, leaving the instructions' head and the question's tail alone) is
  cut into ``num_spans`` spans of equal token count (default 10, the paper's smaller K).
- **The dummy span** is a fixed neutral text (:data:`DUMMY_TEXT`, tiled to the span's length,
  ``dummy=`` to change it): the same at every position, so its relevance is a constant, which is
  all Eq. 4 needs. The span's length, hence every position of the prompt, is unchanged.
- **Measured per sample, per layer, per head, per query, in the same forward.** Dummy copy k
  is the prompt with span k replaced by the dummy; the K copies run beside the real prompt as
  K more rows of one batch (one KV cache holds all K + 1), and at each calibrated layer the
  real row's attention on span k is compared with copy k's attention on its dummy span, at the
  same query, layer and head. Nothing is cached across samples: the bias of Eq. 3 is the
  model's own on this prompt. The dummy copies run the plain model (they measure its bias) and
  decode the real row's tokens, so the bias of each answer token's query is measured too.
- **Fewer copies** (``spans_per_copy``, ours, not the paper's): one copy may replace g spans at once
  (copy j holds the dummy in spans jg..jg+g-1), so ceil(K / g) copies measure every span's bias.
  With g = K one copy holds the dummy in every span: the bias is then measured in a context of
  dummies instead of one among real spans; a cheaper approximation, named as such in any row.
- **Which queries.** The ones that predict the answer (the paper's "when predicting the next
  token"): the prompt's last token and each generated one; in ``loglikelihood`` every position
  that predicts the continuation. The prompt's own tokens attend as in the plain model.
  Cached decoding equals one forward over the whole sequence with ``query_start`` at the
  prompt's last token (:mod:`~lpes_harness.methods.query_rows`).
- ``strength`` mixes the calibrated weights with the plain ones (1, default, the paper's; 0 the
  plain model, what ``fitm_hf`` then runs, bit for bit). Spans the query cannot see (outside a
  sliding window) are left out of the redistribution.

Cost: the ceil(K / g) dummy copies are as many extra forwards per sample (batched with it: with the
paper's g = 1, (K + 1) x the prompt's compute and KV memory) and as many token-forwards per
generated token; the calibrated queries' attention is also computed by hand (float32) in the
calibrated layers. Generation is
greedy, with our decoding loop (:mod:`~lpes_harness.methods.decoding`), since the copies share
one token per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lpes_harness.core import rope_anatomy, rope_math
from lpes_harness.methods import METHODS, arguments, attention, decoding, model_checks, query_rows
from lpes_harness.methods.arguments import MethodError
from lpes_harness.methods.state import MethodState, Slot
from lpes_harness.core.models import cache_keyword, output_layer

ENTRY = METHODS["fitm"]
NAME = ENTRY.lm_eval
STRENGTH, TEMPERATURE, NUM_SPANS, SPANS_PER_COPY = ENTRY.parameters
DEFAULT_REGION = (0.05, 0.95)
DUMMY_TEXT = " This sentence is only a placeholder and carries no information."


@dataclass
class _State(MethodState):
    parts: rope_anatomy.RoPEParts
    layers: list[int]
    num_spans: int
    region: tuple[float, float]
    temperature: float
    strength: float
    dummy_ids: list[int]
    spans_per_copy: int = 1
    # Set by forward_logits while it runs: the real rows (B; the K copies follow, copy-major) and
    # their first calibrated column; the spans (B, K, 2) from the last prompt, kept while decoding.
    batch: int | None = None
    query_start: torch.Tensor | None = None
    spans: torch.Tensor | None = None


SLOT = Slot("_fitm_state", NAME, "fitm")


def parse_region(value: Any) -> tuple[float, float]:
    """``0.05:0.95`` -> the share of the prompt's tokens cut into spans."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        low, high = value
    else:
        low, _, high = str(value).partition(":")
    try:
        low, high = float(low), float(high)
    except ValueError:
        raise MethodError(f"{NAME}: region={value!r} is not understood; give two shares of the prompt "
                            f"like 0.05:0.95") from None
    if not 0.0 <= low < high <= 1.0:
        raise MethodError(f"{NAME}: region={value!r}: need 0 <= start < end <= 1 (shares of the prompt's tokens)")
    return low, high


def calibrate(plain: torch.Tensor, dummy: torch.Tensor, member: torch.Tensor, temperature: float,
              strength: float = 1.0, visible: torch.Tensor | None = None) -> torch.Tensor:
    """The paper's Eq. 5 on attention weights.

    ``plain (B, H, n, kv)``: the real row's weights; ``dummy (K, B, H, n, kv)``: copy k's, whose
    span k holds the dummy; ``member (B, K, kv)``: which keys are in span k. Per span,
    ``A_k`` = mean weight of the real row on span k, ``D_k`` = copy k's on it; ``alpha =
    softmax((A - D) / t)`` over the spans the query sees; span k's weights are scaled by
    ``alpha_k / A_k * C``, ``C`` keeping the spans' total. Keys outside every span keep theirs.
    ``visible (B or 1, 1, n, kv)``: the keys each query sees; a span's mean is over those of its
    keys only, so that a sliding window's cache, which holds only the keys it sees, gives the same
    means as a forward over the whole sequence.
    """
    weights = member.to(plain.dtype)
    if visible is None:
        count = weights.sum(-1)[:, None, None, :]  # (B, 1, 1, K)
    else:
        count = torch.einsum("bqj,bkj->bqk", visible[:, 0].expand(len(weights), -1, -1).to(plain.dtype),
                             weights)[:, None]  # (B, 1, n, K)
    mass = torch.einsum("bhqj,bkj->bhqk", plain, weights)
    dummy_mass = torch.einsum("kbhqj,bkj->bhqk", dummy, weights)
    valid = (count > 0) & (mass > 0)
    safe = count.clamp(min=1)
    mean, dummy_mean = mass / safe, dummy_mass / safe
    logits = ((mean - dummy_mean) / temperature).masked_fill(~valid, float("-inf"))
    seen = valid.any(-1, keepdim=True)
    alpha = torch.softmax(logits.masked_fill(~seen, 0.0), dim=-1).masked_fill(~valid, 0.0)
    scale = mass.sum(-1, keepdim=True) / (alpha * count).sum(-1, keepdim=True).clamp(min=torch.finfo(plain.dtype).tiny)
    ratio = torch.where(valid, alpha / mean.clamp(min=torch.finfo(plain.dtype).tiny) * scale, torch.ones_like(mean))
    ratio = torch.where(seen, ratio, torch.ones_like(ratio))
    outside = 1.0 - weights.sum(1)[:, None, None, :]  # keys in no span
    per_key = torch.einsum("bhqk,bkj->bhqj", ratio, weights) + outside
    return plain + strength * (plain * per_key - plain)


def _forward(state: _State):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, cache=None,
                **kwargs):
        layer_cache = attention.layer_cache(past_key_values, cache)
        rows_all, q_len = hidden_states.shape[:2]
        past = layer_cache.get_seq_length(self.layer_idx) if layer_cache is not None else 0
        query, key, value = attention.projections(self, hidden_states)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        query, key = rope_math.apply_rope(query, cos, sin), rope_math.apply_rope(key, cos, sin)
        if layer_cache is not None:
            key, value = layer_cache.update(key, value, self.layer_idx)
        output = attention.attend(self, query, key, value, attention_mask, **kwargs)
        batch = state.batch
        if batch is not None and state.strength > 0:
            rows = query_rows.answer_rows(state.query_start, batch, q_len, past, hidden_states.device)
            if rows.any():
                output[:batch] = _calibrated(self, state, query, key, value, attention_mask, rows, past, output[:batch])
        return self.o_proj(output.reshape(rows_all, q_len, -1).contiguous()), None

    return forward


def _calibrated(attn, state: _State, query, key, value, attention_mask, rows, past, output):
    """The real rows' attention output with the calibrated queries replaced (``(B, q_len, H, D)``)."""
    batch, q_len, kv_len = rows.shape[0], query.shape[2], key.shape[2]
    first = query_rows.first_answer_column(rows)
    groups = query.shape[1] // key.shape[1]
    keys, values = attention.repeat_heads(key, groups), attention.repeat_heads(value, groups)
    scores = torch.matmul(query[:, :, first:].float(), keys.float().transpose(-1, -2)) * attn.scaling
    visible = query_rows.visible_keys(attention_mask, q_len, kv_len, query.device)[..., first:, :]
    weights = query_rows.masked_softmax(scores, visible)  # (copies * B, H, n, kv)
    weights = weights.view(-1, batch, *weights.shape[1:])
    spans = state.spans.to(query.device)
    copy_of_span = torch.arange(spans.shape[1], device=query.device) // state.spans_per_copy
    columns = torch.arange(kv_len, device=query.device) + (past + q_len - kv_len)  # keys' columns in the sequence
    member = (columns[None, None, :] >= spans[..., :1]) & (columns[None, None, :] < spans[..., 1:])  # (B, K, kv)
    new = calibrate(weights[0], weights[1:][copy_of_span], member, state.temperature, state.strength, visible[:batch])
    new = torch.matmul(new, values[:batch].float()).transpose(1, 2).to(output.dtype)  # (B, n, H, D)
    output = output.clone()
    chosen = rows[:, first:, None, None]
    output[:, first:] = torch.where(chosen, new, output[:, first:])
    return output


def prompt_spans(input_ids, attention_mask, query_start, num_spans: int, region) -> torch.Tensor:
    """``(B, K, 2)`` [start, end) columns: each row's prompt (its real tokens up to ``query_start``,
    or the last column) cut, within ``region``, into ``num_spans`` spans of equal token count."""
    batch, width = input_ids.shape
    spans = torch.zeros(batch, num_spans, 2, dtype=torch.long)
    for row in range(batch):
        first = 0 if attention_mask is None else int(attention_mask[row].long().argmax())
        last = width - 1 if query_start is None else int(query_start[row])
        length = last - first + 1
        low, high = first + int(region[0] * length), first + int(region[1] * length)
        bounds = [low + (high - low) * k // num_spans for k in range(num_spans + 1)]
        spans[row] = torch.tensor([[bounds[k], bounds[k + 1]] for k in range(num_spans)])
    return spans


def copy_count(num_spans: int, spans_per_copy: int) -> int:
    """How many dummy copies measure ``num_spans`` spans, ``spans_per_copy`` to a copy."""
    return -(-num_spans // spans_per_copy)


def dummy_copies(input_ids: torch.Tensor, spans: torch.Tensor, dummy_ids: list[int], spans_per_copy: int = 1
                 ) -> torch.Tensor:
    """``((C + 1) B, T)``: the input, then C = ceil(K / g) copies, copy j with spans jg..jg+g-1 replaced
    by the dummy tiled to each one's length (g = ``spans_per_copy``; 1: copy k replaces span k)."""
    copies = [input_ids]
    dummy = torch.tensor(dummy_ids, dtype=input_ids.dtype, device=input_ids.device)
    num_spans = spans.shape[1]
    for j in range(copy_count(num_spans, spans_per_copy)):
        copy = input_ids.clone()
        for k in range(j * spans_per_copy, min((j + 1) * spans_per_copy, num_spans)):
            for row in range(input_ids.shape[0]):
                start, end = (int(v) for v in spans[row, k])
                if end > start:
                    copy[row, start:end] = dummy.repeat((end - start) // len(dummy) + 1)[: end - start]
        copies.append(copy)
    return torch.cat(copies)


def forward_logits(model: nn.Module, input_ids, attention_mask=None, position_ids=None, cache=None, query_start=None,
                   last_only: bool = False) -> torch.Tensor:
    """The real rows' logits ``(B, T, V)`` (``(B, V)`` with ``last_only``), calibrated, with the K
    dummy copies run beside them. On an empty cache (or none) the input is the prompt: its spans are
    cut there and kept for the decoding steps that continue the cache."""
    state = get_state(model)
    copies = copy_count(state.num_spans, state.spans_per_copy) + 1
    past = cache.get_seq_length() if cache is not None else 0
    if query_start is not None:
        query_start = torch.as_tensor(query_start, dtype=torch.long).reshape(-1)
    if past == 0:
        state.spans = prompt_spans(input_ids, attention_mask, query_start, state.num_spans, state.region)
        ids = dummy_copies(input_ids, state.spans, state.dummy_ids, state.spans_per_copy)
    elif state.spans is None:
        raise MethodError(f"{NAME}: a decoding step before any prompt; start with the prompt on an empty cache")
    else:
        ids = input_ids.repeat(copies, 1)
    repeat = lambda t: None if t is None else t.repeat(copies, *([1] * (t.dim() - 1)))  # noqa: E731
    decoder = model.get_decoder()
    state.batch, state.query_start = input_ids.shape[0], query_start
    try:
        hidden = decoder(input_ids=ids, attention_mask=repeat(attention_mask), position_ids=repeat(position_ids),
                         use_cache=cache is not None, **{cache_keyword(decoder): cache}).last_hidden_state
    finally:
        state.batch, state.query_start = None, None
    hidden = hidden[: input_ids.shape[0]]
    return output_layer(model, hidden[:, -1] if last_only else hidden)


def generate(model: nn.Module, input_ids, attention_mask=None, max_length=None, max_new_tokens=None,
             stopping_criteria=None, pad_token_id=None):
    """Greedy decoding, the dummy copies decoding the real rows' tokens, one KV cache for all."""
    return decoding.generate_with(forward_logits, model, input_ids, attention_mask, max_length, max_new_tokens,
                                  stopping_criteria, pad_token_id)


def install(model: nn.Module, strength: float = 1.0, temperature: float = 5e-5, num_spans: int = 10, region: Any = None,
            layers: Any = None, dummy_ids: list[int] | None = None, spans_per_copy: int = 1) -> nn.Module:
    """Calibrate the attention of ``layers`` (default: the last half). ``dummy_ids``: the dummy span's tokens."""
    SLOT.free(model)
    strength, temperature, num_spans, region, spans_per_copy = check_arguments(strength, temperature, num_spans,
                                                                               region, spans_per_copy)
    if not dummy_ids:
        raise MethodError(f"{NAME}: dummy_ids is empty; give the dummy span's token ids (fitm_hf tokenizes DUMMY_TEXT)")
    attention.check_attention_implementation(model, NAME)
    parts, _ = model_checks.check_model(model, NAME, rewrites_attention=True)
    n_layers = len(parts.layers)
    chosen = list(range(n_layers // 2, n_layers)) if layers is None else arguments.parse_layers(layers, n_layers)
    state = _State(parts, chosen, num_spans, region, temperature, strength, [int(t) for t in dummy_ids],
                   min(spans_per_copy, num_spans))
    for index in chosen:
        state.changes.forward(parts.layers[index].self_attn, _forward(state))
    return SLOT.attach(model, state)


remove = SLOT.remove  # takes every change off: the model as it was
get_state = SLOT.get


def check_arguments(strength: Any = 1.0, temperature: Any = 5e-5, num_spans: Any = 10, region: Any = None,
                    spans_per_copy: Any = 1, layers: Any = None):
    """``(strength, temperature, num_spans, region, spans_per_copy)`` checked, as numbers (``fitm_hf`` and
    ``benchmarks/latency.py --setting`` run it before the model loads); ``layers`` only for its syntax."""
    if layers is not None:
        arguments.layer_selector(layers)  # its range needs the model
    strength, temperature = STRENGTH.check(strength, NAME), TEMPERATURE.check(temperature, NAME)
    num_spans, spans_per_copy = NUM_SPANS.check(num_spans, NAME), SPANS_PER_COPY.check(spans_per_copy, NAME)
    return strength, temperature, num_spans, DEFAULT_REGION if region is None else parse_region(region), spans_per_copy
