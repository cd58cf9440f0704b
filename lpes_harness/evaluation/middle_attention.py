"""Attention to the middle: the last token's attention mass on the middle third of the context.

For each uniform scale (1 = vanilla) and each prompt, and for every decoder layer, the share of
the last query's attention (averaged over heads) that falls on tokens ``[n // 3, 2n // 3)`` of
an ``n``-token prompt. The paper's claim: scaling positions raises the mass on the middle,
which is where lost-in-the-middle loses the answer.

Only the one needed row is computed. A forward pre-hook on each layer's ``self_attn`` sees its
``hidden_states`` and its ``(cos, sin)`` (already the LPES-scaled ones when LPES is installed),
re-applies the layer's own ``q_proj`` / ``k_proj`` and the model's ``apply_rotary_pos_emb``, and
takes ``softmax(q_last . K^T / sqrt(d))``: O(n) memory per layer. The model keeps its fast
attention (SDPA / flash); nothing switches it to eager for the whole ``n x n`` matrix.

Assumes full causal attention (Llama, Qwen2; Mistral without a sliding window shorter than the
prompt), and no q/k normalisation layers.

The command is ``python -m lpes_harness.commands.attention``.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.evaluation.inputs import pyplot
from lpes_harness.core.files import save_figure

def middle_third(length: int) -> tuple[int, int]:
    """Token range [start, end) of the middle third of a ``length``-token context."""
    return length // 3, (2 * length) // 3


def last_row_attention(attention_module, hidden_states, position_embeddings):
    """(heads, n) attention probabilities of the last query over all n keys, from the layer's weights."""
    import torch

    apply_rotary = sys.modules[type(attention_module).__module__].apply_rotary_pos_emb
    head_dim = attention_module.head_dim
    batch, length, _ = hidden_states.shape
    query = attention_module.q_proj(hidden_states[:, -1:]).view(batch, 1, -1, head_dim).transpose(1, 2)
    key = attention_module.k_proj(hidden_states).view(batch, length, -1, head_dim).transpose(1, 2)
    cos, sin = position_embeddings
    query, _ = apply_rotary(query, query, cos[:, -1:], sin[:, -1:])
    _, key = apply_rotary(key, key, cos, sin)
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: each kv head serves `groups` q heads
    key = key.repeat_interleave(groups, dim=1)
    scores = (query.float() @ key.float().transpose(-1, -2)) * attention_module.scaling
    return torch.softmax(scores, dim=-1)[0, :, 0, :]


class LastRowRecorder:
    """Hooks every layer's ``self_attn``; after a forward, ``rows[l]`` is layer l's (heads, n) last row."""

    def __init__(self, model):
        from lpes_harness.core.rope_anatomy import find_rope_parts

        self.rows: dict[int, object] = {}
        self.handles = []
        for index, layer in enumerate(find_rope_parts(model).layers):
            self.handles.append(layer.self_attn.register_forward_pre_hook(self._hook(index), with_kwargs=True))

    def _hook(self, index: int):
        def hook(module, args, kwargs):
            import torch

            hidden_states = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            with torch.no_grad():
                self.rows[index] = last_row_attention(module, hidden_states, kwargs["position_embeddings"])

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def middle_mass(model, input_ids) -> list[float]:
    """Per layer: the last token's attention mass on the middle third, averaged over heads."""
    import torch

    recorder = LastRowRecorder(model)
    try:
        with torch.no_grad():
            model(input_ids=input_ids.to(model.device), use_cache=False)
    finally:
        recorder.remove()
    start, end = middle_third(input_ids.shape[1])
    return [float(recorder.rows[i][:, start:end].sum(-1).mean()) for i in sorted(recorder.rows)]


def run(model, inputs: Sequence, uniform_scales: Sequence[float]) -> dict:
    """Scale -> per-layer middle mass (mean and std over prompts); LPES is removed afterwards."""
    from lpes_harness.core import rope

    n_layers = rope.num_layers(model)
    rope.install(model, [1.0] * n_layers)
    results = {"num_layers": n_layers, "num_inputs": len(inputs), "lengths": [int(x.shape[1]) for x in inputs], "scales": {}}
    try:
        for scale in uniform_scales:
            rope.set_scales(model, float(scale))
            per_input = [middle_mass(model, input_ids) for input_ids in inputs]
            by_layer = list(zip(*per_input))
            results["scales"][str(float(scale))] = {
                "mean": [statistics.fmean(v) for v in by_layer],
                "std": [statistics.stdev(v) if len(v) > 1 else 0.0 for v in by_layer],
                "mean_over_layers": statistics.fmean(statistics.fmean(v) for v in by_layer),
            }
    finally:
        rope.remove(model)
    return results


def plot(results: Mapping, path: Path) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6, 3.8))
    for scale, entry in results["scales"].items():
        layers = range(len(entry["mean"]))
        axes.plot(layers, entry["mean"], marker=".", label=f"scale {float(scale):g}")
    axes.axhline(1 / 3, color="grey", linewidth=0.8, linestyle="--", label="uniform attention")
    axes.set_xlabel("layer")
    axes.set_ylabel("last-token attention on middle third")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    save_figure(figure, path)
    plt.close(figure)
