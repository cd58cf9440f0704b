"""The methods' error and the parsers of their own arguments (bases, layers).

Booleans and ``;`` number lists are parsed as for ``lpes_hf`` (:mod:`lpes_harness.core.arg_values`).
"""

from __future__ import annotations

import math
from typing import Any

from lpes_harness.core.arg_values import number_list
from lpes_harness.core.rope_anatomy import LPESError


class MethodError(LPESError):
    """Bad input to a method: the message names what was given and what is accepted."""


def parse_float_list(name: str, value: Any, minimum_exclusive: float | None = 0.0) -> list[float]:
    """``1.0;1.3;1.6`` (or a number, or a list) -> floats, each checked."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        values = [float(value)]
    elif isinstance(value, (list, tuple)):
        values = [float(v) for v in value]
    else:
        text = str(value).strip()
        try:
            values = number_list(text, ";,")
        except ValueError:
            raise MethodError(f"{name}={value!r} is not understood; give numbers separated by ';'") from None
    if not values:
        raise MethodError(f"{name}={value!r} is empty; give numbers separated by ';'")
    for v in values:
        if not math.isfinite(v) or (minimum_exclusive is not None and v <= minimum_exclusive):
            raise MethodError(f"{name}={value!r}: every value must be a finite number > {minimum_exclusive:g}")
    return values


def layer_selector(value: Any) -> slice | list[int]:
    """``"2:"`` / ``"2:10"`` -> a slice; ``"2;3;5"`` (or a list) -> sorted indices. The syntax alone, so that a
    method can refuse a malformed ``layers`` before the model loads; :func:`parse_layers` checks the range."""
    text = ";".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value).strip()
    accepted = "a slice like '2:' or '2:10', or indices separated by ';' (e.g. '2;3;5')"
    try:
        if ":" in text:
            start, _, stop = text.partition(":")
            return slice(int(start) if start else None, int(stop) if stop else None)
        return sorted({int(part) for part in text.split(";") if part.strip()})
    except ValueError:
        raise MethodError(f"layers={value!r} is not understood; give {accepted}") from None


def parse_layers(value: Any, n_layers: int, default_start: int = 0) -> list[int]:
    """``None`` -> ``default_start..L-1``; else :func:`layer_selector`'s layers, each in ``0..L-1``."""
    if value is None:
        return list(range(min(default_start, n_layers), n_layers))
    chosen = layer_selector(value)
    layers = list(range(n_layers))[chosen] if isinstance(chosen, slice) else chosen
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad or not layers:
        raise MethodError(f"layers={value!r} selects {bad or 'no layers'}; the model has layers 0..{n_layers - 1}")
    return layers
