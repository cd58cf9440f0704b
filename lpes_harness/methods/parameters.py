"""A method's numeric parameters as data: name, default, the value that makes it the plain model, bounds.

Every entry of the table of methods (:data:`lpes_harness.methods.METHODS`) lists its parameters;
a method's module checks what it is given against them. Cheap to import (no torch), as the
table must be: lm-eval's registry reads it at start-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lpes_harness.core.arg_values import shown


@dataclass(frozen=True)
class Parameter:
    """One numeric parameter of a method.

    ``identity``: the value at which the method is the plain model, bit for bit (None when no
    single value of this parameter alone does it). ``low``/``high``: the accepted range, both
    ends included (None: unbounded), ``low_open``: ``low`` itself excluded (a scale > 0).
    ``integer``: whole numbers only. A value may be a tuple of numbers (Attention Buckets' bases),
    each within the bounds. ``per_layer``: n numbers per decoder layer (LPES's scales: 1, or 2
    under scaling both), the default and identity then meaning that value on every one; 0: as given.
    A default of None is derived from other arguments or the model (STRING's offset, MoICE's top_k).
    """

    name: str
    default: Any
    identity: Any
    low: float | None = None
    high: float | None = None
    integer: bool = False
    help: str = ""
    per_layer: int = 0
    low_open: bool = False

    def values(self, value: Any, num_layers: int) -> Any:
        """``value`` as the method takes it on a model of ``num_layers`` layers: one number, or repeated per layer."""
        return [value] * (self.per_layer * num_layers) if self.per_layer else value

    def within(self, value: Any) -> bool:
        """Whether ``value`` (a number, or each number of a tuple) is inside the bounds."""
        if isinstance(value, (list, tuple)):
            return bool(value) and all(self.within(v) for v in value)
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        return above and (self.high is None or value <= self.high)

    def check(self, value: Any, who: str) -> float | int:
        """``value`` as a number inside the bounds, or a one-line :class:`MethodError` naming them."""
        from lpes_harness.methods.arguments import MethodError  # torch: only when a method runs

        accepted = self.accepted()
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise MethodError(f"{who}: {self.name}={shown(value)} is not a number; give {accepted}") from None
        if isinstance(value, bool) or not math.isfinite(number) or (self.integer and not number.is_integer()):
            raise MethodError(f"{who}: {self.name}={shown(value)} is not allowed; give {accepted}")
        if not self.within(number):
            raise MethodError(f"{who}: {self.name}={shown(value)} is out of range; give {accepted}")
        return int(number) if self.integer else number

    def accepted(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            return f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{kind} <= {self.high:g}"
        return kind
