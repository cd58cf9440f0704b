"""Mixture of In-Context Experts (MoICE; Lin et al., 2024): ``install`` on a model; ``moice_hf`` runs it in lm-eval.

    python -m lpes_harness.commands.train_moice --out results/moice/smollm2.gates.pt
    lm_eval --model moice_hf --model_args "gates=results/moice/smollm2.gates.pt" --tasks kv_retrieval

In every layer, each attention head computes its attention once per RoPE base in a set of
E bases (the "in-context experts"), and sums the E outputs with weights from a router.
The router is per layer, shared by the heads, and fed each head's query (rotated with the
first base, as the reference does): ``gate_2(act(gate_1(q)) * gate_3(q))``, softmax over
the E bases, the top-k kept and renormalised. Only the routers are trained; the model is
frozen.

Facts taken from the authors' code (p1nksnow/MoICE) and choices made here:

- Default bases: ``[10000, 17500, 18000, 19000, 20000, 22500, 25000]`` for Llama 2
  (``theta = 10000``), so relative to theta ``1.0;1.75;1.8;1.9;2.0;2.25;2.5``. Default
  ``top_k`` = 7 (all bases), as the authors' training script.
- Training loss: LM loss + 0.3 x load-balancing loss (the authors' coefficient). Their
  balancing loss counts expert assignments with the same ``top_k`` as routing; with
  ``top_k = E`` every expert is always selected and that loss is a constant (no gradient).
  Ours counts each (token, head)'s *top-1* base, Switch-Transformer style, so the term
  does balance the router. Padding is left out of both losses.
- KV cache: the reference caches pre-RoPE keys and re-rotates the whole cache E times per
  step. We cache the E rotated keys ``(B, E * kv_heads, T, D)``: same result, E times the
  key memory, no per-step re-rotation.
- Positions come from the model's ``position_ids`` (left padding honoured); the reference
  assumes unpadded rows.
- Without ``gates=`` the routers start from the reference's initialisation (PyTorch's
  ``nn.Linear`` default) under a fixed seed, untrained; a warning says so.
- Only plain RoPE (``rope_type: default``) has a base to change.
- Not on models with a RoPE per layer type (Gemma-3: sliding layers base 10k, full layers
  1M): the routers and the base set are trained per model for one θ, and per-layer-type
  bases and routers are not implemented; refused by name (Ms-PoE and Buckets run there).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lpes_harness.core import rope_anatomy, rope_math
from lpes_harness.core.arg_values import parse_bool
from lpes_harness.methods import METHODS, arguments, attention, model_checks
from lpes_harness.methods.arguments import MethodError
from lpes_harness.methods.state import MethodState, Slot

ENTRY = METHODS["moice"]
# The authors' base set (training/train.sh) relative to Llama 2's theta = 10000.
DEFAULT_RELATIVE_BASES = ENTRY.parameter("bases").default
TOP_K = ENTRY.parameter("top_k")
GATES_FORMAT = "lpes-moice-gates/1"
ROUTER_ATTR = "moice_router"


class MoICERouter(nn.Module):
    """Per-layer router over the RoPE bases, applied to each head's query (head_dim -> E)."""

    def __init__(self, head_dim: int, num_experts: int, hidden_act: str = "silu"):
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_1 = nn.Linear(head_dim, num_experts, bias=False)
        self.gate_3 = nn.Linear(head_dim, num_experts, bias=False)
        self.gate_2 = nn.Linear(num_experts, num_experts, bias=False)
        self.act_fn = ACT2FN[hidden_act]

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.gate_2(self.act_fn(self.gate_1(query)) * self.gate_3(query))


@dataclass
class _MoICEState(MethodState):
    parts: rope_anatomy.RoPEParts
    relative_bases: list[float]
    bases: list[float]
    top_k: int
    inv_freq: torch.Tensor  # (E, D/2)
    recorder: rope_math.PositionRecorder
    # When set (training), each layer appends its router logits (B, H, T, E) here.
    router_logits: list[torch.Tensor] | None = None
    trained_from: str | None = None


SLOT = Slot("_moice_state", "MoICE", "moice")


def routing_weights(router_logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Softmax over the bases, keep the top-k, renormalise (the reference's order of operations)."""
    weights = torch.softmax(router_logits.float(), dim=-1)
    if top_k < weights.shape[-1]:
        kept = torch.topk(router_logits, top_k, dim=-1).indices
        mask = torch.zeros_like(weights, dtype=torch.bool).scatter_(-1, kept, True)
        weights = torch.where(mask, weights, torch.zeros_like(weights))
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights


def _moice_forward(state: _MoICEState):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, cache=None,
                **kwargs):
        past_key_values = attention.layer_cache(past_key_values, cache)
        batch, q_len = hidden_states.shape[:2]
        query, key, value = attention.projections(self, hidden_states)
        n_experts, n_kv = len(state.bases), key.shape[1]

        position_ids = state.recorder.position_ids.to(hidden_states.device).expand(batch, -1)
        inv_freq = state.inv_freq.to(hidden_states.device)[:, None, None, :]  # (E, 1, 1, D/2)
        cos, sin = rope_math.cos_sin(position_ids[None], inv_freq, state.parts.rotary_emb.attention_scaling, query.dtype)
        cos, sin = cos[:, :, None], sin[:, :, None]  # (E, B, 1, T, D): broadcast over heads
        queries = rope_math.apply_rope(query[None], cos, sin)  # (E, B, H, T, D)
        keys = rope_math.apply_rope(key[None], cos, sin)  # (E, B, Hkv, T, D)

        router = getattr(self, ROUTER_ATTR)
        logits = router(queries[0].to(router.gate_1.weight.dtype))  # (B, H, T, E)
        if state.router_logits is not None:
            state.router_logits.append(logits)
        weights = routing_weights(logits, state.top_k).to(query.dtype)

        # Cache all E rotated keys of a kv head side by side: (B, E * Hkv, T, D).
        keys = keys.transpose(0, 1).reshape(batch, n_experts * n_kv, q_len, -1)
        if past_key_values is not None:
            keys, value = past_key_values.update(keys, value, self.layer_idx)
        kv_len = keys.shape[2]
        keys = keys.view(batch, n_experts, n_kv, kv_len, -1).transpose(0, 1).reshape(n_experts * batch, n_kv, kv_len, -1)
        values = value[None].expand(n_experts, *value.shape).reshape(n_experts * batch, n_kv, kv_len, -1)
        queries = queries.reshape(n_experts * batch, *query.shape[1:])
        mask = attention_mask
        if mask is not None and mask.shape[0] != 1:
            mask = mask.repeat(n_experts, *([1] * (mask.dim() - 1)))  # expert-major rows, like the queries
        outputs = attention.attend(self, queries, keys, values, mask, **kwargs)  # (E*B, T, H, D)
        outputs = outputs.view(n_experts, batch, q_len, *outputs.shape[2:])
        mixed = (weights.permute(3, 0, 2, 1)[..., None] * outputs).sum(dim=0)  # (B, T, H, D)
        return self.o_proj(mixed.reshape(batch, q_len, -1).contiguous()), None

    return forward


def install(
    model: nn.Module,
    bases: Any = None,
    absolute_bases: bool = False,
    top_k: int | None = None,
    gates: str | None = None,
    seed: int = 0,
) -> nn.Module:
    """Add a router to every layer and mix E RoPE bases per head (MoICE). Returns the same model.

    lm-eval's text arguments are taken too (``absolute_bases="true"``, ``top_k="3"``)."""
    SLOT.free(model)
    listed, saved, top_k = check_arguments(gates, bases, absolute_bases, top_k)
    absolute_bases = parse_bool("absolute_bases", absolute_bases, MethodError)
    attention.check_attention_implementation(model, ENTRY.lm_eval)
    parts, ropes = model_checks.check_model(model, ENTRY.lm_eval, rewrites_attention=True)
    layer_types = [r.layer_type for r in rope_math.distinct(ropes) if r.layer_type is not None]
    if layer_types:
        raise MethodError(
            f"moice_hf cannot run on model type '{parts.model_type}': its layer types "
            f"({', '.join(layer_types)}) each have their own RoPE, and MoICE's routers (the gates file) are "
            f"trained per model for one base set relative to one θ; per-layer-type bases and routers are not "
            f"implemented. Accepted: models with one RoPE for all layers (Llama, SmolLM2, Qwen2, Mistral)"
        )
    theta = rope_math.rope_theta(rope_anatomy.decoder_config(parts, model), parts.model_type)
    absolute = listed if absolute_bases else [theta * b for b in listed]
    relative = [b / theta for b in absolute] if absolute_bases else listed
    n_experts = len(absolute)
    inv_freq = torch.stack([rope_math.inv_freq_for_base(ropes[0].inv_freq, theta, b) for b in absolute])
    state = _MoICEState(parts, relative, absolute, top_k, inv_freq, rope_math.PositionRecorder(parts))
    state.changes.on_remove(state.recorder.remove)

    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # reproducible untrained routers, without touching the caller's RNG
    try:
        for layer in parts.layers:
            attn = layer.self_attn
            router = MoICERouter(attn.head_dim, n_experts, getattr(model.config, "hidden_act", "silu"))
            router.to(device=attn.q_proj.weight.device, dtype=attn.q_proj.weight.dtype)
            state.changes.submodule(attn, ROUTER_ATTR, router)
            state.changes.forward(attn, _moice_forward(state))
    finally:
        torch.random.set_rng_state(generator_state)
    SLOT.attach(model, state)
    if saved is not None:
        load_gates_into(model, saved, gates)
        state.trained_from = str(gates)
    else:
        warnings.warn(
            "moice_hf without gates=: the routers are untrained (seeded random init). Train them with "
            "`python -m lpes_harness.commands.train_moice --out <file>` and pass gates=<file>",
            stacklevel=2,
        )
    return model


remove = SLOT.remove  # takes every change off (the routers too): the model as it was
get_state = SLOT.get


def check_arguments(gates: str | None = None, bases: Any = None, absolute_bases: Any = False, top_k: Any = None,
                    seed: int = 0) -> tuple[list[float], dict | None, int]:
    """What install checks that needs no model (``moice_hf`` runs it before the model loads): returns the bases
    as given (``bases``, else the gates file's relative ones, else the default 7), the gates file's contents
    (None without one) and ``top_k`` (default: the file's, else every base), checked against the bases' count."""
    parse_bool("absolute_bases", absolute_bases, MethodError)
    saved = read_gates(gates) if gates is not None else None
    if bases is not None:
        listed = arguments.parse_float_list("bases", bases)
    else:
        listed = list(saved["relative_bases"] if saved is not None else DEFAULT_RELATIVE_BASES)
    if top_k is None:
        top_k = saved["top_k"] if saved is not None else len(listed)
    top_k = TOP_K.check(top_k, ENTRY.lm_eval)  # a whole number >= 1 (2.5 is refused, not cut to 2)
    if top_k > len(listed):
        raise MethodError(f"top_k={top_k} is out of range; give 1..{len(listed)} (the number of bases)")
    return listed, saved, top_k


def settings(model: nn.Module) -> dict:
    """The installed setting, for lm-eval's model info."""
    state = get_state(model)
    return {"bases": state.bases, "top_k": state.top_k, "gates": state.trained_from}


def routers(model: nn.Module) -> list[MoICERouter]:
    return [getattr(layer.self_attn, ROUTER_ATTR) for layer in get_state(model).parts.layers]


# ----------------------------------------------------------------------------- gates files


def gates_payload(model: nn.Module, **extra) -> dict:
    state = get_state(model)
    first = state.parts.layers[0].self_attn
    return {
        "format": GATES_FORMAT,
        "relative_bases": list(state.relative_bases),
        "top_k": state.top_k,
        "num_layers": len(state.parts.layers),
        "head_dim": first.head_dim,
        "model_type": getattr(model.config, "model_type", None),
        "gates": [{k: v.detach().cpu().clone() for k, v in r.state_dict().items()} for r in routers(model)],
        **extra,
    }


def save_gates(model: nn.Module, path: str, **extra) -> str:
    """Write the routers to ``path`` atomically (a temporary file, then a rename)."""
    payload = gates_payload(model, **extra)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".moice-gates-", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a results file is meant to be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def read_gates(path: str) -> dict:
    if not os.path.isfile(str(path)):
        raise MethodError(f"gates file not found: {path} (train one with `python -m lpes_harness.commands.train_moice --out {path}`)")
    try:
        payload = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file
        raise MethodError(f"gates file {path} could not be read as a MoICE gates file: {err}") from err
    if not isinstance(payload, dict) or payload.get("format") != GATES_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise MethodError(f"gates file {path} has format {found!r}; expected {GATES_FORMAT!r}")
    return payload


def load_gates_into(model: nn.Module, payload: dict, where: str = "gates") -> None:
    state = get_state(model)
    first = state.parts.layers[0].self_attn
    n_layers = len(state.parts.layers)
    if payload["num_layers"] != n_layers or payload["head_dim"] != first.head_dim:
        raise MethodError(
            f"{where} was trained for {payload['num_layers']} layers with head_dim {payload['head_dim']}; "
            f"this model has {n_layers} layers with head_dim {first.head_dim}"
        )
    if len(payload["relative_bases"]) != len(state.bases):
        raise MethodError(
            f"{where} routes over {len(payload['relative_bases'])} bases but bases= gives {len(state.bases)}"
        )
    for router, weights in zip(routers(model), payload["gates"]):
        router.load_state_dict(weights)
