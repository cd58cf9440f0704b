"""The factors :mod:`lpes_harness.core.rope` installs, checked and laid out per layer.

A scaling's factors arrive as one flat list (:mod:`lpes_harness.core.scaling`): one number per decoder
layer (``position``, ``base``), or 2L numbers, the position factors then the base factors
(``both``). Per layer, the hooks read a number or, under ``both``, a ``(p, b)`` pair; the
layer's :data:`IDENTITY` leaves it untouched.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from lpes_harness.core.rope_anatomy import LPESError
from lpes_harness.core.scaling import factors_per_layer, split_both

IDENTITY = {"position": 1.0, "base": 1.0, "both": (1.0, 1.0)}


def validate_scales(scales: Sequence[float] | float, n_layers: int, scaling: str = "position") -> list[float]:
    """Return ``scales`` as a list of ``n_layers`` floats; a single number means uniform.

    ``scaling="both"``: 2 * ``n_layers`` floats, the position factors then the base factors; a
    single number is refused there (a position or a base factor?)."""
    per_layer = factors_per_layer(scaling)
    if isinstance(scales, (int, float)) and not isinstance(scales, bool):
        if per_layer == 2:
            raise LPESError(f"scaling='both' takes 2 factors per layer, the {n_layers} position factors then the "
                            f"{n_layers} base factors ({2 * n_layers} numbers); a single number ({scales!r}) is ambiguous")
        scales = [float(scales)] * n_layers
    if isinstance(scales, torch.Tensor):
        scales = scales.flatten().tolist()
    try:
        values = [float(s) for s in scales]
    except (TypeError, ValueError) as err:
        raise LPESError(f"scales must be numbers, got {scales!r}") from err
    if len(values) != n_layers * per_layer and per_layer == 2:
        raise LPESError(
            f"got {len(values)} factors but scaling='both' takes 2 per decoder layer: the {n_layers} position "
            f"factors, then the {n_layers} base factors ({2 * n_layers} numbers)"
        )
    if len(values) != n_layers * per_layer:
        raise LPESError(
            f"got {len(values)} scales but the model has {n_layers} decoder layers; "
            f"give one scale per layer (or a single number for a uniform scale)"
        )
    for index, value in enumerate(values):
        if not math.isfinite(value) or value <= 0:
            which = f"scale for layer {index}" if per_layer == 1 else \
                f"{('position', 'base')[index // n_layers]} factor for layer {index % n_layers}"
            raise LPESError(f"{which} is {value!r}; every scale must be a finite number > 0")
    return values


def layer_factors(scales: Sequence[float], scaling: str) -> list:
    """Each layer's factor: the numbers themselves, or under ``both`` the pairs ``(p_h, b_h)``."""
    return list(zip(*split_both(scales))) if scaling == "both" else list(scales)
