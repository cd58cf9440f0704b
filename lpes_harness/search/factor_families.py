"""Families of per-layer factors the gradient search optimises: free per layer, or a straight line over depth.

A family maps a small tensor of parameters, the *logarithms* of some factors, to the flat list of
per-layer factors a scaling takes (:mod:`lpes_harness.core.scaling`: one block of L numbers per axis).
Adam works on the logarithms: a factor's step is then relative (0.9 -> 1.0 is as far as 1.8 -> 2.0),
and it can never reach 0 or below. After each step :meth:`project` clamps the logarithms into the
bounds; each family's factors stay inside the bounds whenever its parameters do.

- :class:`PerLayer`: every layer's factor free (L numbers per axis), the genome of the GA.
- :class:`Lines`: two numbers per axis, the factors at the first and the last layer; the layers
  between lie on the straight line through them (linear in the factor, over the layer index), as the
  curve that generalised in issue 100 nearly does (position 0.6 -> 1.6, base 0.5 -> 1.0 over depth).
  A convex combination of two factors in [low, high] is in [low, high]: clamping the two ends is enough.
  The same line as the GA's ``--lines`` starts (:func:`lpes_harness.search.genome.ramp_genome`), unsnapped.

``held`` layers (NoPE layers, or Gemma-3's sliding layers in the position half) keep factor 1 in every family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from lpes_harness.core.scaling import SCALINGS, Scaling


@dataclass(frozen=True)
class Bounds:
    """Each factor's range, [low, high] with 0 < low <= high (a search's ``y_min`` and ``y_max``)."""

    low: float
    high: float

    def __post_init__(self):
        if not (0 < self.low <= self.high and math.isfinite(self.high)):
            raise ValueError(f"bounds [{self.low}, {self.high}]: need 0 < low <= high, finite")

    def project(self, log_params: torch.Tensor) -> None:
        """Clamp logarithms of factors into [ln low, ln high], in place (no gradient is recorded)."""
        with torch.no_grad():
            log_params.clamp_(math.log(self.low), math.log(self.high))

    def snap(self, factors: torch.Tensor) -> torch.Tensor:
        """``factors`` clamped into [low, high] in value, with the gradient passed through unchanged.

        After :meth:`project` a factor is off its bounds by float rounding at most (``exp(ln high)`` may come
        out one ulp above ``high``); the value is corrected, but the gradient must not be cut there, or a
        factor that touched a bound would get no gradient and stay on it for good."""
        return factors + (factors.clamp(self.low, self.high) - factors).detach()


@dataclass
class _Family:
    """``bounds``: one :class:`Bounds` for every axis, or one per axis in the scaling's axis order (``both``:
    position, then base; the search's ``--y-min/--y-max`` and ``--base-y-min/--base-y-max``)."""

    scaling: str
    num_layers: int
    bounds: Bounds | Sequence[Bounds]
    held: Sequence[int] | Sequence[Sequence[int]] = ()  # layers kept at 1: one list for every axis, or one per axis
    kind: Scaling = field(init=False)
    axis_bounds: tuple[Bounds, ...] = field(init=False)
    axis_held: tuple[tuple[int, ...], ...] = field(init=False)

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling={self.scaling!r} is not one of {', '.join(SCALINGS)}")
        self.kind = SCALINGS[self.scaling]
        self.axis_bounds = ((self.bounds,) * self.kind.per_layer if isinstance(self.bounds, Bounds)
                            else tuple(self.bounds))
        if len(self.axis_bounds) != self.kind.per_layer or not all(isinstance(b, Bounds) for b in self.axis_bounds):
            raise ValueError(f"{self.scaling!r} takes one Bounds, or one per axis ({', '.join(self.kind.axes)}); "
                             f"got {self.bounds!r}")
        per_axis = bool(self.held) and all(isinstance(h, (list, tuple)) for h in self.held)
        self.axis_held = (tuple(tuple(h) for h in self.held) if per_axis
                          else (tuple(self.held),) * self.kind.per_layer)
        if len(self.axis_held) != self.kind.per_layer:
            raise ValueError(f"{self.scaling!r} takes one list of held layers, or one per axis; got {self.held!r}")
        bad = [h for held in self.axis_held for h in held if not 0 <= h < self.num_layers]
        if bad:
            raise ValueError(f"held layers {bad} are not layers of a {self.num_layers}-layer model")

    def _held_mask(self, dtype) -> torch.Tensor:
        """1 on the layers that move, 0 on the held ones, tiled over the axes."""
        mask = torch.ones(self.kind.per_layer, self.num_layers, dtype=dtype)
        for row, held in zip(mask, self.axis_held):
            row[list(held)] = 0
        return mask.reshape(-1)

    def factors(self, log_params: torch.Tensor) -> torch.Tensor:
        """The flat per-layer factors (the scaling's layout), differentiable in ``log_params``; held layers at 1."""
        # The parameters and the factors are both laid out axis by axis: one row an axis.
        moving = torch.cat([b.snap(row) for b, row in zip(self.axis_bounds, self._moving(log_params).view(
            self.kind.per_layer, -1))])
        mask = self._held_mask(moving.dtype).to(moving.device)
        return moving * mask + (1 - mask)  # held layers: exactly 1 (x * 0 + 1), with no gradient to them

    def _moving(self, log_params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def project(self, log_params: torch.Tensor) -> None:
        """Back into the bounds after a step: each family's factors are inside whenever its parameters are."""
        with torch.no_grad():  # the rows are views of a leaf that requires grad: clamped in place, untracked
            for b, row in zip(self.axis_bounds, log_params.view(self.kind.per_layer, -1)):
                b.project(row)


@dataclass
class PerLayer(_Family):
    """One free factor per layer and axis: the parameters are the flat list's logarithms."""

    def initial(self, factors: Sequence[float] | float = 1.0, dtype=torch.float32) -> torch.Tensor:
        size = self.num_layers * self.kind.per_layer
        values = [float(factors)] * size if isinstance(factors, (int, float)) else [float(v) for v in factors]
        if len(values) != size:
            raise ValueError(f"PerLayer({self.scaling!r}) on {self.num_layers} layers starts from {size} factors, "
                             f"got {len(values)}")
        return torch.tensor(values, dtype=dtype).log()

    def _moving(self, log_params: torch.Tensor) -> torch.Tensor:
        return log_params.exp()


@dataclass
class Lines(_Family):
    """Per axis, a straight line over depth: parameters ``[ln start, ln end]`` per axis, in the scaling's axis order.

    With held layers the line still runs over the model's layer index (0 to L-1); the held ones sit at 1 off it.
    """

    def initial(self, ends: Sequence[Sequence[float]] | None = None, dtype=torch.float32) -> torch.Tensor:
        """``ends``: one ``(start, end)`` per axis; None: every line flat at 1 (the plain model)."""
        ends = [(1.0, 1.0)] * self.kind.per_layer if ends is None else [tuple(map(float, e)) for e in ends]
        if len(ends) != self.kind.per_layer or any(len(e) != 2 for e in ends):
            raise ValueError(f"Lines({self.scaling!r}) takes one (start, end) per axis ({', '.join(self.kind.axes)}), "
                             f"got {ends!r}")
        return torch.tensor([v for e in ends for v in e], dtype=dtype).log()

    def _moving(self, log_params: torch.Tensor) -> torch.Tensor:
        ends = log_params.exp().view(self.kind.per_layer, 2)
        depth = torch.linspace(0, 1, self.num_layers, dtype=ends.dtype, device=ends.device)
        # start + (end - start) * depth; at depth 0 and 1 the ends themselves (to rounding).
        lines = ends[:, :1] + (ends[:, 1:] - ends[:, :1]) * depth
        return lines.reshape(-1)
