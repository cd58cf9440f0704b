"""Positional hidden-state scaling (Yu et al., Findings of ACL 2025): ``install`` on a model; ``poshidden_hf`` runs it in lm-eval.

    python -m lpes_harness.commands.poshidden_channel --out results/poshidden/smollm2.json
    lm_eval --model poshidden_hf --model_args setting=results/poshidden/smollm2.json --tasks multi_needle

A few channels of the hidden state rise or fall steadily with position ("positional hidden
states"; found by :mod:`lpes_harness.commands.poshidden_channel`). In each layer of a band of
middle layers, the attention's input (the normed hidden state) has those channels multiplied by
``factor``; the keys of every token and the queries that predict the answer are computed from
it, the values and every other query are the model's own.

Facts from the authors' code (PositionalHidden/PositionalHidden,
``positional_hidden/models/modeling_llama_hidden_scale.py``, ``configs/``,
``experiments/search_dimension/``), and where we chose:

- **Which queries.** The reference recomputes the attention of the last ``last_recompute_tokens``
  queries (1 at inference; ``len(answer) + 1`` when it scores a validation answer) with scaled
  queries and scaled keys, and keeps the plain attention for the others; its KV cache holds the
  scaled keys, so every decoded token uses them. Here the changed queries are the prompt's last
  token and everything after it: in ``generate`` the prompt's last column, then each decoded
  token; in ``loglikelihood`` the positions that predict the continuation (``poshidden_hf`` finds
  them, :class:`~lpes_harness.lmeval.hflm.RightPaddedRowsMixin`). A forward over a whole
  sequence with :func:`answer_queries_from` at the prompt's last token is then cached decoding,
  exactly. A bare ``model(ids)`` changes its last query only, the reference's default.
- **Values** stay the model's (the reference's ``change_value: false`` in every config); its
  ``skip_first`` is 0 in every config and not offered.
- **Layers.** The reference scales layers 10-25 of 32 (7B models); the default band is that
  share of the depth, layers ``floor(10 L / 32) .. floor(26 L / 32) - 1`` (SmolLM2's 30: 9-23;
  Gemma-3-270M's 18: 5-13). A setting file may say otherwise.
- **Factor** 0 is the reference's default (``use_model.py``; the Gemma and Mistral configs); the
  paper picks it from {0.5, 0, -0.5, -1} on a retrieval validation set, which
  ``poshidden_channel --select-task`` does. ``factor=1`` is the plain model, bit for bit.
- **Families.** The rewritten attention is the methods' Llama-style one
  (:mod:`~lpes_harness.methods.model_checks`): Llama, Mistral, Qwen2/3, Gemma, Gemma-3, Granite.
  RoPE is the model's own (cos, sin), so llama3 / YaRN / dynamic RoPE are kept. The paper also
  covers ALiBi models (MPT), which this harness does not load.

Cost: no extra forward. In each band layer, one more query and key projection over the prompt, and a
second attention pass for the queries from the batch's first answer row on (on a prompt, its last
column); a decoded token costs what it costs in the plain model.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lpes_harness.core import rope_anatomy, rope_math
from lpes_harness.methods import METHODS, arguments, attention, model_checks, query_rows
from lpes_harness.methods.arguments import MethodError
from lpes_harness.methods.state import MethodState, Slot

ENTRY = METHODS["poshidden"]
NAME = ENTRY.lm_eval
FACTOR = ENTRY.parameter("factor")
FACTOR_CANDIDATES = ENTRY.grid["factor"]  # the paper's search set
SETTING_FORMAT = "lpes-poshidden/1"
COMMAND = "python -m lpes_harness.commands.poshidden_channel --out FILE"


@dataclass
class _State(MethodState):
    parts: rope_anatomy.RoPEParts
    layers: list[int]
    channels: list[int]
    factor: float
    query_start: torch.Tensor | None = None  # (B,) first answer-predicting column; None: the rule of query_rows


SLOT = Slot("_poshidden_state", NAME, "poshidden")


def default_layers(num_layers: int) -> list[int]:
    """The reference's band, layers 10-25 of 32, as a share of the depth."""
    return list(range(num_layers * 10 // 32, max(num_layers * 26 // 32, num_layers * 10 // 32 + 1)))


def parse_channels(value: Any, hidden_size: int | None = None) -> list[int]:
    """``12`` or ``12;345`` (or a list) -> channel indices, each checked against ``hidden_size``."""
    parts = value if isinstance(value, (list, tuple)) else str(value).replace(",", ";").split(";")
    try:
        numbers = [float(p) for p in parts if str(p).strip()]
    except ValueError:
        raise MethodError(f"{NAME}: channels={value!r} is not understood; give channel indices separated by ';'") from None
    if not numbers or any(not n.is_integer() or n < 0 for n in numbers):
        raise MethodError(f"{NAME}: channels={value!r}: give one or more channel indices >= 0, separated by ';'")
    channels = sorted({int(n) for n in numbers})
    if hidden_size is not None and channels[-1] >= hidden_size:
        raise MethodError(f"{NAME}: channels={value!r}: the model's hidden size is {hidden_size} "
                            f"(channels 0..{hidden_size - 1})")
    return channels


def read_setting(path: str) -> dict:
    """A setting file written by ``poshidden_channel``: its ``channels``, ``layers``, ``factor`` and shape."""
    if not os.path.isfile(path):
        raise MethodError(f"{NAME}: setting file not found: {path}; write one with `{COMMAND}`")
    try:
        with open(path, encoding="utf-8") as handle:
            setting = json.load(handle)
    except (OSError, ValueError) as err:
        raise MethodError(f"{NAME}: setting file {path} is not JSON ({err})") from None
    if not isinstance(setting, dict) or setting.get("format") != SETTING_FORMAT:
        found = setting.get("format") if isinstance(setting, dict) else type(setting).__name__
        raise MethodError(f"{NAME}: {path} has format {found!r}, not {SETTING_FORMAT!r}; write one with `{COMMAND}`")
    missing = [key for key in ("channels", "layers", "factor", "hidden_size", "num_layers") if key not in setting]
    if missing:
        raise MethodError(f"{NAME}: setting file {path} lacks {', '.join(missing)}")
    return setting


def _query_key(attn: nn.Module, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotated ``q (B, Hq, T, D)``, ``k (B, Hkv, T, D)`` as the model's attention makes them."""
    shape = (*hidden_states.shape[:-1], -1, attn.head_dim)
    query, key = attn.q_proj(hidden_states).view(shape), attn.k_proj(hidden_states).view(shape)
    if hasattr(attn, "q_norm"):
        query, key = attn.q_norm(query), attn.k_norm(key)
    query, key = query.transpose(1, 2), key.transpose(1, 2)
    return rope_math.apply_rope(query, cos, sin), rope_math.apply_rope(key, cos, sin)


def _forward(state: _State):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, cache=None,
                **kwargs):
        layer_cache = attention.layer_cache(past_key_values, cache)
        batch, q_len = hidden_states.shape[:2]
        past = layer_cache.get_seq_length(self.layer_idx) if layer_cache is not None else 0
        rows = query_rows.answer_rows(state.query_start, batch, q_len, past, hidden_states.device)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)

        scaled = hidden_states.clone()
        scaled[..., state.channels] *= state.factor
        query, key = _query_key(self, scaled, cos, sin)
        value = self.v_proj(hidden_states).view(batch, q_len, -1, self.head_dim).transpose(1, 2)
        if layer_cache is not None:  # the cache holds the scaled keys, as the reference's
            key, value = layer_cache.update(key, value, self.layer_idx)
        if bool(rows.all()):  # a decoding step: every query is an answer's
            output = attention.attend(self, query, key, value, attention_mask, **kwargs)
        else:  # a prompt: its other queries attend as the plain model's, to the plain keys
            plain_query, plain_key = _query_key(self, hidden_states, cos, sin)
            output = attention.attend(self, plain_query, plain_key, value, attention_mask, **kwargs)
            # At factor 1 the scaled queries and keys are the plain ones (x * 1 == x exactly), so the answer
            # rows' attention is already in ``output``. Computing it again for the sliced rows only rounds
            # differently on some CPUs (AVX2's sdpa on a one-row slice: tiny models' logits 1.6e-7 apart),
            # and factor 1 is the plain model bit for bit.
            if bool(rows.any()) and state.factor != FACTOR.identity:
                output = _with_answer_queries(self, output, rows, query, key, value, attention_mask, **kwargs)
        return self.o_proj(output.reshape(batch, q_len, -1).contiguous()), None

    return forward


def _with_answer_queries(attn, output, rows, query, key, value, attention_mask, **kwargs):
    """``output`` with the answer rows' attention from the scaled queries and keys. Only the columns from
    the batch's first answer row on are computed: on a prompt that is its last column, so a second
    attention over the whole square (what a prompt cost before) is a sliver of one."""
    # The scaled queries were projected for every column and are sliced here. Projecting the slice alone would
    # save a tenth of a band layer's multiply-adds; not done, as the committed rows were scored this way.
    first = query_rows.first_answer_column(rows)
    visible = query_rows.visible_keys(attention_mask, rows.shape[1], key.shape[2], query.device)[..., first:, :]
    if attention_mask is None or attention_mask.dtype != torch.bool:
        # A slice of the queries cannot use sdpa's is_causal (it aligns them at the first key), and
        # eager attention adds its mask: the additive form serves both kernels.
        visible = torch.zeros(visible.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~visible, torch.finfo(query.dtype).min)
    answers = attention.attend(attn, query[:, :, first:], key, value, visible, **kwargs)
    output = output.clone()
    output[:, first:] = torch.where(rows[:, first:, None, None], answers, output[:, first:])
    return output


def install(model: nn.Module, channels: Any, factor: float = 0.0, layers: Any = None) -> nn.Module:
    """Scale ``channels`` of the attention input by ``factor`` in ``layers`` (default: the middle band)."""
    SLOT.free(model)
    factor = FACTOR.check(factor, NAME)
    attention.check_attention_implementation(model, NAME)
    parts, _ = model_checks.check_model(model, NAME, rewrites_attention=True)
    config = rope_anatomy.decoder_config(parts, model)
    chosen_channels = parse_channels(channels, getattr(config, "hidden_size", None))
    n_layers = len(parts.layers)
    chosen = default_layers(n_layers) if layers is None else arguments.parse_layers(layers, n_layers)
    state = _State(parts, chosen, chosen_channels, factor)
    for index in chosen:
        state.changes.forward(parts.layers[index].self_attn, _forward(state))
    return SLOT.attach(model, state)


remove = SLOT.remove  # takes every change off: the model as it was
get_state = SLOT.get


@contextlib.contextmanager
def answer_queries_from(model: nn.Module, query_start):
    """Within the block, a forward over whole sequences changes the queries from column ``query_start``
    on (an int, or one per row): the prompt's last token for cached decoding's equal."""
    state = get_state(model)
    previous = state.query_start
    state.query_start = torch.as_tensor(query_start, dtype=torch.long).reshape(-1)
    try:
        yield model
    finally:
        state.query_start = previous


def resolve_arguments(setting=None, channels=None, factor=None, layers=None) -> dict:
    """The model's arguments from a setting file and the explicit ones (which win), checked before
    the model loads; ``channels`` None means the plain model (only with ``factor`` 1)."""
    found = read_setting(str(setting)) if setting is not None else {}
    factor = FACTOR.check(found.get("factor", FACTOR.default) if factor is None else factor, NAME)
    channels = found.get("channels") if channels is None else channels
    if channels is not None:
        channels = parse_channels(channels)
    elif factor != FACTOR.identity:
        raise MethodError(
            f"{NAME} needs the channel to scale: setting=<file from `{COMMAND}`> or channels=<index>[;<index>...] "
            f"(factor=1 is the plain model)"
        )
    layers = found.get("layers") if layers is None else layers
    if layers is not None:
        arguments.layer_selector(layers)  # its range needs the model
    return {"channels": channels, "factor": factor, "layers": layers,
            "expect": {k: found[k] for k in ("hidden_size", "num_layers") if k in found}, "setting": setting}


def check_setting_shape(model: nn.Module, expect: dict, setting) -> None:
    parts = rope_anatomy.find_rope_parts(model)
    hidden = getattr(rope_anatomy.decoder_config(parts, model), "hidden_size", None)
    found = {"hidden_size": hidden, "num_layers": len(parts.layers)}
    wrong = [f"{k} {expect[k]} (this model: {found[k]})" for k in expect if found.get(k) is not None and expect[k] != found[k]]
    if wrong:
        raise MethodError(f"{NAME}: setting file {setting} was measured on another model: {', '.join(wrong)}")
