"""The factors :mod:`lpes_harness.core.rope` installs, checked and laid out per layer.

A scaling's factors arrive as one flat list (:mod:`lpes_harness.core.scaling`): one number per decoder
layer (``position``, ``base``), or 2L numbers, the position factors then the base factors
(``both``). Per layer, the hooks read a number or, under ``both``, a ``(p, b)`` pair; the
scaling's ``identity_factor`` leaves a layer untouched.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from lpes_harness.core.rope_anatomy import LPESError
from lpes_harness.core.scaling import DEFAULT, SCALINGS


def validate_scales(scales: Sequence[float] | float, n_layers: int, scaling: str = DEFAULT) -> list[float]:
    """Return ``scales`` as a list of ``n_layers`` floats; a single number means uniform.

    ``scaling="both"``: 2 * ``n_layers`` floats, the position factors then the base factors; a
    single number is refused there (a position or a base factor?)."""
    kind = SCALINGS[scaling]
    per_layer = kind.per_layer
    if isinstance(scales, (int, float)) and not isinstance(scales, bool):
        if kind.paired:
            raise LPESError(f"scaling={scaling!r} takes {per_layer} factors per layer, {_layout(kind, n_layers, ' ')} "
                            f"({per_layer * n_layers} numbers); a single number ({scales!r}) is ambiguous")
        scales = [float(scales)] * n_layers
    if isinstance(scales, torch.Tensor):
        scales = scales.flatten().tolist()
    try:
        values = [float(s) for s in scales]
    except (TypeError, ValueError) as err:
        raise LPESError(f"scales must be numbers, got {scales!r}") from err
    if len(values) != n_layers * per_layer and kind.paired:
        raise LPESError(
            f"got {len(values)} factors but scaling={scaling!r} takes {per_layer} per decoder layer: "
            f"{_layout(kind, n_layers, ', ')} ({per_layer * n_layers} numbers)"
        )
    if len(values) != n_layers * per_layer:
        raise LPESError(
            f"got {len(values)} scales but the model has {n_layers} decoder layers; "
            f"give one scale per layer (or a single number for a uniform scale)"
        )
    for index, value in enumerate(values):
        if not math.isfinite(value) or value <= 0:
            which = f"scale for layer {index}" if per_layer == 1 else \
                f"{kind.axes[index // n_layers]} factor for layer {index % n_layers}"
            raise LPESError(f"{which} is {value!r}; every scale must be a finite number > 0")
    return values


def _layout(kind, n_layers: int, joint: str) -> str:
    """``the 4 position factors then the 4 base factors``: a paired list's blocks, in order."""
    return f"{joint}then ".join(f"the {n_layers} {axis} factors" for axis in kind.axes)
