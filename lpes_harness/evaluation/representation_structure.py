"""Representational-structure deviation: how far a set of layer scales moves the model's geometry.

For each prompt, the last token's hidden state after every decoder layer gives a layer x layer
cosine-similarity matrix (:func:`layer_similarity`); matrices are averaged over prompts
(:func:`similarity_matrix`). The deviation of a set of scales is the mean absolute difference
between its matrix and vanilla's, all scales 1 (:func:`deviation`).

The paper's claim: the searched, smooth Bezier scales keep the structure close to vanilla,
while perturbed versions of them move it further. :func:`scale_variants` makes them from the
searched scales: ``bezier`` (the scales themselves), ``uniform`` (their mean on every layer),
and, one run per seed, ``noisy`` (each layer plus U(-noise, +noise)), ``shuffled`` (the same
values in a random layer order) and ``random`` (every layer U(y_min, y_max)). The command is
``python -m lpes_harness.commands.rsm``.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.evaluation.inputs import pyplot
from lpes_harness.core.files import save_figure

SEEDED_VARIANTS = ("noisy", "shuffled", "random")
VARIANTS = ("bezier", "uniform", *SEEDED_VARIANTS)


def last_token_states(model, input_ids):
    """(layers, hidden) hidden states of the last token after each decoder layer."""
    import torch

    with torch.no_grad():
        output = model(input_ids=input_ids.to(model.device), output_hidden_states=True, use_cache=False)
    # hidden_states[0] is the embedding output; [1:] one per decoder layer.
    return torch.stack([state[0, -1].float() for state in output.hidden_states[1:]])


def layer_similarity(states):
    """Cosine similarity between every pair of layers' states: (layers, layers)."""
    import torch

    unit = torch.nn.functional.normalize(states, dim=-1)
    return unit @ unit.T


def similarity_matrix(model, inputs: Sequence):
    """Layer x layer similarity averaged over the prompts."""
    total = None
    for input_ids in inputs:
        matrix = layer_similarity(last_token_states(model, input_ids))
        total = matrix if total is None else total + matrix
    return total / len(inputs)


def deviation(matrix, reference) -> float:
    return float((matrix - reference).abs().mean())


def scale_variants(
    base: Sequence[float], seeds: Sequence[int], y_min: float, y_max: float, noise: float = 0.1
) -> dict[str, list[list[float]]]:
    """Variant name -> one list of layer scales per run (one run for the unseeded ones)."""
    base = [float(s) for s in base]
    mean = sum(base) / len(base)
    variants: dict[str, list[list[float]]] = {"bezier": [base], "uniform": [[mean] * len(base)]}
    for name in SEEDED_VARIANTS:
        variants[name] = []
        for seed in seeds:
            rng = random.Random(f"rsm/{name}/{seed}")
            if name == "noisy":
                # Keep scales positive: a scale <= 0 has no meaning for RoPE.
                scales = [max(1e-3, s + rng.uniform(-noise, noise)) for s in base]
            elif name == "shuffled":
                scales = list(base)
                rng.shuffle(scales)
            else:
                scales = [rng.uniform(y_min, y_max) for _ in base]
            variants[name].append(scales)
    return variants


def run(model, inputs: Sequence, variants: Mapping[str, Sequence[Sequence[float]]]) -> dict:
    """Vanilla's matrix, then every variant's deviation from it; LPES is removed afterwards."""
    from lpes_harness.core import rope

    n_layers = rope.num_layers(model)
    rope.install(model, [1.0] * n_layers)
    try:
        vanilla = similarity_matrix(model, inputs)
        results = {"num_layers": n_layers, "num_inputs": len(inputs), "vanilla": vanilla.tolist(), "variants": {}}
        for name, runs in variants.items():
            deviations, first_matrix = [], None
            for scales in runs:
                rope.set_scales(model, scales)
                matrix = similarity_matrix(model, inputs)
                first_matrix = matrix if first_matrix is None else first_matrix
                deviations.append(deviation(matrix, vanilla))
            results["variants"][name] = {
                "scales": [list(s) for s in runs],
                "deviations": deviations,
                "mean": statistics.fmean(deviations),
                "std": statistics.stdev(deviations) if len(deviations) > 1 else 0.0,
                "difference_of_first": (first_matrix - vanilla).abs().tolist(),
            }
    finally:
        rope.remove(model)
    return results


def plot(results: Mapping, path: Path) -> None:
    plt = pyplot()
    names = list(results["variants"])
    figure, (bars, vanilla_axes, diff_axes) = plt.subplots(1, 3, figsize=(15, 4.2), layout="constrained")
    means = [results["variants"][n]["mean"] for n in names]
    stds = [results["variants"][n]["std"] for n in names]
    bars.bar(names, means, yerr=stds, capsize=4, color=["tab:green", "tab:blue", "tab:orange", "tab:purple", "tab:red"][: len(names)])
    bars.set_ylabel("mean |S - S_vanilla|")
    bars.set_title("representational-structure deviation")
    image = vanilla_axes.imshow(results["vanilla"], vmin=-1, vmax=1, cmap="coolwarm")
    vanilla_axes.set_title("vanilla: layer x layer cosine")
    figure.colorbar(image, ax=vanilla_axes, fraction=0.046)
    if "bezier" in results["variants"]:
        image = diff_axes.imshow(results["variants"]["bezier"]["difference_of_first"], cmap="viridis")
        diff_axes.set_title("|S_bezier - S_vanilla|")
        figure.colorbar(image, ax=diff_axes, fraction=0.046)
    for axes in (vanilla_axes, diff_axes):
        axes.set_xlabel("layer")
        axes.set_ylabel("layer")
    save_figure(figure, path)
    plt.close(figure)
