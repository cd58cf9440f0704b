"""A method's tunable parameters as data: name, default, the value that makes it the plain model, bounds.

The rivals of issue #45 (:mod:`~lpes_harness.baselines.poshidden`, :mod:`~lpes_harness.baselines.fitm`,
:mod:`~lpes_harness.baselines.string_shift`) each list theirs as ``PARAMETERS``, beside ``NAME``,
``DESCRIPTION``, ``install`` and ``remove``, so a later table of methods can read them as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lpes_harness.arg_values import shown
from lpes_harness.baselines.arguments import BaselineError


@dataclass(frozen=True)
class Parameter:
    """One numeric parameter of a method.

    ``identity``: the value at which the method is the plain model, bit for bit (None when no
    single value of this parameter alone does it). ``low``/``high``: the accepted range, both
    ends included (None: unbounded). ``integer``: whole numbers only.
    """

    name: str
    default: Any
    identity: Any
    low: float | None = None
    high: float | None = None
    integer: bool = False
    help: str = ""

    def check(self, value: Any, who: str) -> float | int:
        """``value`` as a number inside the bounds, or a one-line :class:`BaselineError` naming them."""
        accepted = self.accepted()
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise BaselineError(f"{who}: {self.name}={shown(value)} is not a number; give {accepted}") from None
        if isinstance(value, bool) or not math.isfinite(number) or (self.integer and not number.is_integer()):
            raise BaselineError(f"{who}: {self.name}={shown(value)} is not allowed; give {accepted}")
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            raise BaselineError(f"{who}: {self.name}={shown(value)} is out of range; give {accepted}")
        return int(number) if self.integer else number

    def accepted(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            return f"{kind} in [{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"{kind} >= {self.low:g}"
        if self.high is not None:
            return f"{kind} <= {self.high:g}"
        return kind
