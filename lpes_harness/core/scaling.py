"""THE table of scalings: what a layer's factor multiplies (``lpes_hf scaling=``, ``lpes-search --scaling``).

- ``position``, the paper's LPES: layer h reads position i as i / s_h;
- ``base``: layer h's RoPE base becomes s_h x theta (its layer type's theta), at the true positions;
- ``both``: layer h has a pair (p_h, b_h): base b_h x theta at positions i / p_h.

A scaling's factors travel as one flat list: one block of L numbers (one per decoder layer) per
axis it moves, in the order of its :attr:`Scaling.axes`. A ``both`` list is ``[p_0, ..., p_{L-1},
b_0, ..., b_{L-1}]``, the L position factors then the L base factors. All ones is the plain model
under every scaling.

Like transformers' ``ROPE_INIT_FUNCTIONS``, :data:`SCALINGS` maps a name to everything the name
means: the factors' layout, their identity, how a layer's RoPE takes them (:meth:`Scaling.rope_pair`,
read by :mod:`lpes_harness.core.rope`), how a scales file splits them, the parsers' choices, the rows
the scorers name. A new scaling is one entry here; no other module compares a scaling's name
(``tests/test_scaling_table.py`` holds every other module to it).

A leaf: imports nothing of the package, so torch-free modules and ``rope`` share it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

# What a factor can multiply: a layer's positions (it reads position i as i / p) or its RoPE base (b x theta).
AXES = ("position", "base")
DEFAULT = "position"  # the paper's; an absent scaling means it (configs, scales files, runs from before the others)
_AXIS_LABELS = {"position": "position scale s", "base": "RoPE base factor s (base s·θ)"}


@dataclass(frozen=True)
class Scaling:
    """One scaling: its name, the axes its factors move, in the order of its flat list, and what it does, in words."""

    name: str
    axes: tuple[str, ...]
    description: str
    # Derived once (read on every layer's call, so not a property): the factor that leaves a layer as it is.
    identity_factor: float | tuple[float, ...] = field(init=False)

    def __post_init__(self):
        if not self.axes or len(set(self.axes)) != len(self.axes) or not set(self.axes) <= set(AXES):
            raise ValueError(f"scaling {self.name!r}: axes {self.axes} must be distinct ones of {AXES}")
        object.__setattr__(self, "identity_factor", 1.0 if len(self.axes) == 1 else (1.0,) * len(self.axes))

    # ------------------------------------------------------------------ what it moves
    @property
    def per_layer(self) -> int:
        """How many numbers it takes per decoder layer (2 for ``both``)."""
        return len(self.axes)

    @property
    def paired(self) -> bool:
        """Whether a layer has several factors (``both``): curves, sweeps and uniform rows then come per axis."""
        return len(self.axes) > 1

    @property
    def moves_positions(self) -> bool:
        return "position" in self.axes

    @property
    def moves_base(self) -> bool:
        return "base" in self.axes

    @property
    def shares_position_keys(self) -> bool:
        """Whether its factors' :meth:`canonical` form never states another model than a position curve of the
        same numbers would (its first axis is positions): score caches keyed by factors may then mix the two."""
        return self.axes[0] == "position"

    # ------------------------------------------------------------------ the flat list
    def identity(self, num_layers: int) -> list[float]:
        """The factors that leave the model as it is: ones, :attr:`per_layer` per layer."""
        return [1.0] * (num_layers * self.per_layer)

    def halves(self, flat) -> list[list[float]]:
        """The factors as curves over the layers, one per axis: ``[flat]``, or ``[positions, bases]`` for ``both``."""
        values = [float(v) for v in flat]
        if len(values) % self.per_layer:
            parts = ", then ".join(f"the {axis} factors" for axis in self.axes)
            count = "an even count" if self.per_layer == 2 else f"a multiple of {self.per_layer}"
            raise ValueError(f"a {self.name!r} list holds {self.per_layer} factors per layer ({parts}), so {count}; "
                             f"got {len(values)}")
        size = len(values) // self.per_layer
        return [values[k * size:(k + 1) * size] for k in range(self.per_layer)]

    def join(self, *curves) -> list[float]:
        """One curve per axis -> the flat list (``both``: ``[p_0..p_{L-1}, b_0..b_{L-1}]``)."""
        curves = [[float(v) for v in curve] for curve in curves]
        if len(curves) != self.per_layer:
            raise ValueError(f"scaling {self.name!r} takes {self.per_layer} curve(s) ({', '.join(self.axes)}), "
                             f"got {len(curves)}")
        if len({len(curve) for curve in curves}) > 1:
            counts = " but ".join(f"{len(curve)} {axis} factors" for curve, axis in zip(curves, self.axes))
            raise ValueError(f"{counts}; give one of each per layer")
        return [v for curve in curves for v in curve]

    def layer_factors(self, flat) -> list:
        """Each layer's factor: the numbers themselves, or for several axes the tuples (``both``: ``(p_h, b_h)``)."""
        return list(zip(*self.halves(flat))) if self.paired else list(flat)

    def rope_pair(self, factor) -> tuple[float, float]:
        """A layer factor as what RoPE does with it: ``(p, b)``, base b x theta at positions i / p."""
        moved = dict(zip(self.axes, factor if self.paired else (factor,)))
        return moved.get("position", 1.0), moved.get("base", 1.0)

    def held_per_half(self, held_layers=(), position_held_layers=()) -> list[set[int]]:
        """The layers each half keeps at 1: ``held_layers`` in every half, and with several axes also
        ``position_held_layers`` in the position half (``--position-layer-type``: Gemma-3's sliding-window
        layers break under any position factor, while a base factor helps them)."""
        held = set(held_layers)
        if not self.paired:
            if position_held_layers:
                raise ValueError(f"layers held in the position half alone need scaling {_paired_name()} (two halves)")
            return [held]
        return [held | set(position_held_layers) if axis == "position" else held for axis in self.axes]

    def uniform_factor(self, flat, held_layers=(), position_held_layers=()):
        """The one factor every layer outside ``held_layers`` has (a tuple, one per axis, for several axes,
        each half outside its own held layers: :meth:`held_per_half`), or None for a per-layer curve: a
        "curve" that is one factor everywhere is PI, not LPES."""
        values = []
        for curve, held in zip(self.halves(flat), self.held_per_half(held_layers, position_held_layers)):
            moved = {round(float(s), 9) for layer, s in enumerate(curve) if layer not in held}
            if len(moved) != 1:
                return None
            values.append(moved.pop())
        return tuple(values) if self.paired else values[0]

    # ------------------------------------------------------------------ between scalings
    def restate(self, flat, target: "Scaling") -> list[float]:
        """These factors as ``target``'s list that does the same (a position curve as ``both``: its base factors 1);
        each half alone is exactly its own scaling, so the other axes at 1 change nothing."""
        if not set(self.axes) <= set(target.axes):
            raise ValueError(f"scaling {target.name!r} cannot state factors of scaling {self.name!r}")
        curves = dict(zip(self.axes, self.halves(flat)))
        size = len(next(iter(curves.values())))
        return target.join(*(curves.get(axis, [1.0] * size) for axis in target.axes))

    def canonical(self, flat) -> list[float]:
        """The shortest statement of the same factors, for keys that must match across scalings: a list whose
        halves after the first are all ones is its first half (a ``both`` list with base factors 1 is its
        position curve, bit for bit the same model)."""
        values = [float(v) for v in flat]
        if not self.paired or len(values) % self.per_layer:
            return values
        first, *rest = self.halves(values)
        return first if all(v == 1.0 for curve in rest for v in curve) else values

    def narrowed(self, flat) -> tuple[str, list[float]]:
        """The one-axis scaling and factors these factors are when every half but one is all ones (``both``
        with base factors 1 is a position run, with position factors 1 a base run; all ones: the first
        axis's); else this scaling's own."""
        curves = self.halves(flat)
        if self.paired:
            for index, (axis, curve) in enumerate(zip(self.axes, curves)):
                if all(v == 1.0 for k, other in enumerate(curves) if k != index for v in other):
                    return with_axes(axis).name, curve
        return self.name, [v for curve in curves for v in curve]


def with_axes(*axes: str) -> Scaling:
    """The scaling that moves exactly ``axes``, in that order."""
    for scaling in SCALINGS.values():
        if scaling.axes == tuple(axes):
            return scaling
    raise KeyError(f"no scaling moves {axes}; the scalings: {', '.join(SCALINGS)}")


def _paired_name() -> str:
    return with_axes(*AXES).name


SCALINGS: dict[str, Scaling] = {s.name: s for s in (
    Scaling("position", ("position",), "position (the paper's: layer h reads position i as i / s_h)"),
    Scaling("base", ("base",), "base (layer h's RoPE base becomes s_h x theta)"),
    Scaling("both", ("position", "base"), "both (layer h has a pair: RoPE base b_h x theta at positions i / p_h; "
                                          "2L numbers, the L position factors then the L base factors)"),
)}


def scaling_of(name: str | None) -> Scaling:
    """The entry of ``name``; None (absent) is :data:`DEFAULT`. Unknown names: a ValueError naming the accepted."""
    try:
        return SCALINGS[name or DEFAULT]
    except KeyError:
        raise ValueError(f"scaling={name!r} is not one of {', '.join(SCALINGS)}") from None


def common_scaling(names: Iterable[str]) -> str:
    """One scaling that states factors of every one of ``names``: theirs when they agree, else the one that moves
    every axis, into which each list is :meth:`Scaling.restate`-d (one loaded model scores them all)."""
    names = set(names)
    return names.pop() if len(names) == 1 else _paired_name()


def cache_scaling(name: str) -> str | None:
    """What a score cache's identity records of a scaling: nothing where its keys are those of position curves
    (:attr:`Scaling.shares_position_keys`), else its name, which keeps its scores apart."""
    scaling = SCALINGS.get(name)
    return None if scaling is not None and scaling.shares_position_keys else name


def axis_label(axis: str) -> str:
    """An axis's factor, for a plot's y label."""
    return _AXIS_LABELS[axis]
