"""``fitm_hf``: attention calibration, "Found in the Middle" (Hsieh et al., Findings of ACL 2024), on lm-eval's HFLM.

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
- **Which queries.** The ones that predict the answer (the paper's "when predicting the next
  token"): the prompt's last token and each generated one; in ``loglikelihood`` every position
  that predicts the continuation. The prompt's own tokens attend as in the plain model.
  Cached decoding equals one forward over the whole sequence with ``query_start`` at the
  prompt's last token (:mod:`~lpes_harness.baselines.query_rows`).
- ``strength`` mixes the calibrated weights with the plain ones (1, default, the paper's; 0 the
  plain model, what ``fitm_hf`` then runs, bit for bit). Spans the query cannot see (outside a
  sliding window) are left out of the redistribution.

Cost: the K dummy copies are K extra forwards per sample (batched with it: (K + 1) x the
prompt's compute and KV memory) and K extra token-forwards per generated token; the calibrated
queries' attention is also computed by hand (float32) in the calibrated layers. Generation is
greedy, with our decoding loop (:mod:`~lpes_harness.baselines.decoding`), since the copies share
one token per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils_hf import stop_sequences_criteria
from torch import nn

from lpes_harness import rope_anatomy
from lpes_harness.baselines import arguments, attention, decoding, model_checks, query_rows, rope_math
from lpes_harness.baselines.arguments import BaselineError
from lpes_harness.baselines.parameters import Parameter
from lpes_harness.lmeval.answer_logits import output_layer
from lpes_harness.lmeval.answer_starts import AnswerStartsMixin
from lpes_harness.models import cache_keyword, hflm_model_args

NAME = "fitm_hf"
DESCRIPTION = ("Found in the Middle (Hsieh et al. 2024): each span's attention minus a dummy span's at its position, "
               "redistributed by softmax(rel / t) in the last half of the layers; K dummy copies per sample")
PARAMETERS = (
    Parameter("strength", default=1.0, identity=0.0, low=0.0, high=1.0,
              help="share of the calibrated attention (1: the paper's; 0: the plain model)"),
    Parameter("temperature", default=5e-5, identity=None, low=1e-12, high=None, help="t of softmax(rel / t)"),
    Parameter("num_spans", default=10, identity=None, low=2, high=64, integer=True, help="K, spans of the region"),
)
STRENGTH, TEMPERATURE, NUM_SPANS = PARAMETERS
DEFAULT_REGION = (0.05, 0.95)
DUMMY_TEXT = " This sentence is only a placeholder and carries no information."


@dataclass
class _State:
    parts: rope_anatomy.RoPEParts
    layers: list[int]
    num_spans: int
    region: tuple[float, float]
    temperature: float
    strength: float
    dummy_ids: list[int]
    # Set by forward_logits while it runs: the real rows (B; the K copies follow, copy-major) and
    # their first calibrated column; the spans (B, K, 2) from the last prompt, kept while decoding.
    batch: int | None = None
    query_start: torch.Tensor | None = None
    spans: torch.Tensor | None = None


_STATE_ATTR = "_fitm_state"


def parse_region(value: Any) -> tuple[float, float]:
    """``0.05:0.95`` -> the share of the prompt's tokens cut into spans."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        low, high = value
    else:
        low, _, high = str(value).partition(":")
    try:
        low, high = float(low), float(high)
    except ValueError:
        raise BaselineError(f"{NAME}: region={value!r} is not understood; give two shares of the prompt "
                            f"like 0.05:0.95") from None
    if not 0.0 <= low < high <= 1.0:
        raise BaselineError(f"{NAME}: region={value!r}: need 0 <= start < end <= 1 (shares of the prompt's tokens)")
    return low, high


def calibrate(plain: torch.Tensor, dummy: torch.Tensor, member: torch.Tensor, temperature: float,
              strength: float = 1.0) -> torch.Tensor:
    """The paper's Eq. 5 on attention weights.

    ``plain (B, H, n, kv)``: the real row's weights; ``dummy (K, B, H, n, kv)``: copy k's, whose
    span k holds the dummy; ``member (B, K, kv)``: which keys are in span k. Per span,
    ``A_k`` = mean weight of the real row on span k, ``D_k`` = copy k's on it; ``alpha =
    softmax((A - D) / t)`` over the spans the query sees; span k's weights are scaled by
    ``alpha_k / A_k * C``, ``C`` keeping the spans' total. Keys outside every span keep theirs.
    """
    weights = member.to(plain.dtype)
    count = weights.sum(-1)[:, None, None, :]  # (B, 1, 1, K)
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
    first = int(rows.any(0).nonzero().min())
    groups = query.shape[1] // key.shape[1]
    keys, values = attention.repeat_heads(key, groups), attention.repeat_heads(value, groups)
    scores = torch.matmul(query[:, :, first:].float(), keys.float().transpose(-1, -2)) * attn.scaling
    visible = query_rows.visible_keys(attention_mask, q_len, kv_len, query.device)[..., first:, :]
    weights = query_rows.masked_softmax(scores, visible)  # (copies * B, H, n, kv)
    weights = weights.view(-1, batch, *weights.shape[1:])
    columns = torch.arange(kv_len, device=query.device) + (past + q_len - kv_len)  # keys' columns in the sequence
    spans = state.spans.to(query.device)
    member = (columns[None, None, :] >= spans[..., :1]) & (columns[None, None, :] < spans[..., 1:])  # (B, K, kv)
    new = calibrate(weights[0], weights[1:], member, state.temperature, state.strength)
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


def dummy_copies(input_ids: torch.Tensor, spans: torch.Tensor, dummy_ids: list[int]) -> torch.Tensor:
    """``((K + 1) B, T)``: the input, then K copies with span k replaced by the dummy tiled to its length."""
    copies = [input_ids]
    dummy = torch.tensor(dummy_ids, dtype=input_ids.dtype, device=input_ids.device)
    for k in range(spans.shape[1]):
        copy = input_ids.clone()
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
    copies = state.num_spans + 1
    past = cache.get_seq_length() if cache is not None else 0
    if query_start is not None:
        query_start = torch.as_tensor(query_start, dtype=torch.long).reshape(-1)
    if past == 0:
        state.spans = prompt_spans(input_ids, attention_mask, query_start, state.num_spans, state.region)
        ids = dummy_copies(input_ids, state.spans, state.dummy_ids)
    elif state.spans is None:
        raise BaselineError(f"{NAME}: a decoding step before any prompt; start with the prompt on an empty cache")
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
    from transformers import DynamicCache

    if max_length is None:
        max_length = input_ids.shape[1] + (max_new_tokens or 20)

    def next_logits(step_ids, mask, positions, cache):
        return forward_logits(model, step_ids, mask, positions, cache, last_only=True)

    return decoding.greedy_generate(next_logits, lambda: DynamicCache(config=model.config), input_ids, attention_mask,
                                    max_length, eos_token_ids=decoding.eos_ids(model), pad_token_id=pad_token_id,
                                    stopping_criteria=stopping_criteria)


def install(model: nn.Module, strength: float = 1.0, temperature: float = 5e-5, num_spans: int = 10, region: Any = None,
            layers: Any = None, dummy_ids: list[int] | None = None) -> nn.Module:
    """Calibrate the attention of ``layers`` (default: the last half). ``dummy_ids``: the dummy span's tokens."""
    if getattr(model, _STATE_ATTR, None) is not None:
        raise BaselineError(f"{NAME} is already installed on this model; call fitm.remove(model) first")
    strength, temperature = STRENGTH.check(strength, NAME), TEMPERATURE.check(temperature, NAME)
    num_spans = NUM_SPANS.check(num_spans, NAME)
    region = DEFAULT_REGION if region is None else parse_region(region)
    if not dummy_ids:
        raise BaselineError(f"{NAME}: dummy_ids is empty; give the dummy span's token ids (fitm_hf tokenizes DUMMY_TEXT)")
    attention.check_attention_implementation(model, NAME)
    parts, _ = model_checks.check_model(model, NAME, rewrites_attention=True)
    n_layers = len(parts.layers)
    chosen = list(range(n_layers // 2, n_layers)) if layers is None else arguments.parse_layers(layers, n_layers)
    state = _State(parts, chosen, num_spans, region, temperature, strength, [int(t) for t in dummy_ids])
    for index in chosen:
        attention.replace_attention_forward(parts.layers[index].self_attn, _forward(state))
    setattr(model, _STATE_ATTR, state)
    return model


def remove(model: nn.Module) -> nn.Module:
    state = getattr(model, _STATE_ATTR, None)
    if state is not None:
        for index in state.layers:
            attention.restore_attention_forward(state.parts.layers[index].self_attn)
        delattr(model, _STATE_ATTR)
    return model


def get_state(model: nn.Module) -> _State:
    state = getattr(model, _STATE_ATTR, None)
    if state is None:
        raise BaselineError(f"{NAME} is not installed on this model; call fitm.install(model, ...) first")
    return state


@register_model(NAME)
class FitMLM(AnswerStartsMixin, HFLM):
    """HFLM with Found-in-the-Middle attention calibration.

    ``--model_args``: ``strength`` (default 1; 0 is the plain model), ``temperature`` (5e-5),
    ``num_spans`` (10), ``region`` (``0.05:0.95``), ``layers`` (default: the last half), ``dummy``
    (the dummy span's text); every HFLM argument.
    """

    def __init__(self, pretrained: Any = None, strength: Any = 1.0, temperature: Any = 5e-5, num_spans: Any = 10,
                 region: Any = None, layers: Any = None, dummy: str = DUMMY_TEXT, gguf_file: str | None = None,
                 device: str | None = None, **kwargs) -> None:
        model_args = hflm_model_args(pretrained, gguf_file, device)
        strength, temperature = STRENGTH.check(strength, NAME), TEMPERATURE.check(temperature, NAME)
        num_spans = NUM_SPANS.check(num_spans, NAME)  # all checked before the (slow) model load
        region = DEFAULT_REGION if region is None else parse_region(region)
        if not str(dummy).strip():
            raise BaselineError(f"{NAME}: dummy={dummy!r} is empty; give the dummy span's text")
        super().__init__(**model_args, **kwargs)
        self._fitm = {"strength": strength, "temperature": temperature, "num_spans": num_spans, "region": region,
                      "layers": layers, "dummy": dummy}
        if strength != STRENGTH.identity:
            dummy_ids = self.tokenizer(str(dummy), add_special_tokens=False)["input_ids"]
            install(self.model, strength, temperature, num_spans, region, layers, dummy_ids)

    def _installed(self) -> bool:
        return getattr(self.model, _STATE_ATTR, None) is not None

    def _model_call(self, inps, attn_mask=None, labels=None):
        if not self._installed():
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        with torch.no_grad():
            return forward_logits(self.model, inps, query_start=self._answer_starts(inps))

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        if not self._installed():
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        if generation_kwargs.get("do_sample") or generation_kwargs.get("num_beams", 1) != 1:
            raise BaselineError(
                f"{NAME} decodes greedily; got do_sample={generation_kwargs.get('do_sample')!r}, "
                f"num_beams={generation_kwargs.get('num_beams', 1)!r}. Accepted: do_sample=false, num_beams=1"
            )
        criteria = stop_sequences_criteria(self.tokenizer, stop, context.shape[1], context.shape[0])
        with torch.no_grad():
            return generate(self.model, context, attention_mask=generation_kwargs.get("attention_mask"),
                            max_length=max_length, stopping_criteria=criteria, pad_token_id=self.tokenizer.pad_token_id)

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info["fitm"] = dict(self._fitm, region=list(self._fitm["region"]))
        return info
