"""The gene of the search: control points on a grid (or, for the ablation, one scale per layer).

A genome is a list of ``(x, y)`` control points, as DEAP individuals (``list`` subclasses).

* ``x`` lives on the grid ``0, x_step, 2*x_step, ...`` inside ``[0, L-1]`` and strictly increases;
* ``y`` lives on the grid ``y_min, y_min + y_step, ...`` inside ``[y_min, y_max]``.

The operators work on integer grid cells ``(i, j)`` (``x = i*x_step``, ``y = y_min + j*y_step``)
so that repeated moves never drift off the grid through floating-point error; genomes
hold floats rounded to 10 decimals, so equal cells give equal (and hashable) genomes.

Brute-force mode (the paper's ablation without the Bézier constraint) uses one gene per
layer: ``L`` points with ``x = 0..L-1`` fixed and only ``y`` evolving; its layer scales are
the ``y`` values themselves.

``held_layers`` keeps some layers at scale 1 (plain RoPE) whatever the genes say: a search
that moves one attention type only (``--layer-type``). Gemma-3's sliding-window layers break
under any scale while its three global layers do not (results/gemma3_layer_type_probe), and a
smooth curve over depth cannot stay at 1 on five layers of every six while it moves the sixth.

Scaling ``both`` (``base_y_min``/``base_y_max``/``base_y_step`` given) has two curves in one
genome: the position curve's ``num_points`` control points, then the base curve's, each half on
the same x grid and obeying the same rules, with its own y range (useful base factors, 0.5..8,
are not useful position factors). Its scales are the flat 2L list of :mod:`lpes_harness.core.scaling`,
positions first; :meth:`GenomeSpec.halves` gives each half as a one-curve spec.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, replace
from typing import Sequence

from deap import base, creator

from lpes_harness.core.curves import CURVES, curve_scales
from lpes_harness.core.scaling import AXES, with_axes

Genome = list[tuple[float, float]]
_DECIMALS = 10

# DEAP keeps its classes on the global `creator` module; names are ours to avoid clashes.
if not hasattr(creator, "LPESFitness"):
    creator.create("LPESFitness", base.Fitness, weights=(1.0,))
if not hasattr(creator, "LPESIndividual"):
    creator.create("LPESIndividual", list, fitness=creator.LPESFitness)


@dataclass(frozen=True)
class GenomeSpec:
    """Where genes may live. ``num_points`` is the number of control points (degree + 1).

    With ``brute_force=True``, ``num_points`` becomes ``num_layers`` (one gene per layer) and
    ``curve`` is not used: the genes are the scales.
    """

    num_layers: int
    num_points: int = 4
    y_min: float = 1.0
    y_max: float = 2.0
    x_step: float = 1.0
    y_step: float = 0.1
    curve: str = "bezier"
    brute_force: bool = False
    initial_y: float = 1.5
    held_layers: tuple[int, ...] = ()
    # Scaling "both": the base curve's y grid and start (None: one curve, position or base).
    base_y_min: float | None = None
    base_y_max: float | None = None
    base_y_step: float | None = None
    base_initial_y: float | None = None
    # Scaling "both": layers whose position factor stays 1 while their base factor moves
    # (--position-layer-type), on top of held_layers, which hold both halves.
    position_held_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int) or self.num_layers < 2:
            raise ValueError(f"num_layers must be an integer >= 2, got {self.num_layers!r}")
        base_range = (self.base_y_min, self.base_y_max, self.base_y_step)
        if any(v is None for v in base_range) and not all(v is None for v in (*base_range, self.base_initial_y)):
            raise ValueError(f"the base curve (scaling both) needs base_y_min, base_y_max and base_y_step together, "
                             f"got {base_range} (and base_initial_y {self.base_initial_y})")
        if self.both and self.brute_force:
            raise ValueError("brute-force mode has one gene per layer for one scaling; with a base curve "
                             "(scaling both) search control points instead")
        if self.both and self.base_initial_y is None:
            object.__setattr__(self, "base_initial_y", 1.0)
        prefixes = ("", "base_") if self.both else ("",)
        for prefix in prefixes:
            low, high = getattr(self, f"{prefix}y_min"), getattr(self, f"{prefix}y_max")
            if not (0 < low <= high and math.isfinite(high)):
                raise ValueError(f"{prefix}y range must satisfy 0 < {prefix}y_min <= {prefix}y_max, got [{low}, {high}]")
        for name in ("x_step", *(f"{prefix}y_step" for prefix in prefixes)):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.curve not in CURVES:
            raise ValueError(f"unknown curve {self.curve!r}; accepted: {', '.join(sorted(CURVES))}")
        held = self._layer_indices("held_layers", self.held_layers)
        if len(held) == self.num_layers:
            raise ValueError("held_layers holds every layer at 1: the search would have nothing to move")
        object.__setattr__(self, "held_layers", held)
        position_held = self._layer_indices("position_held_layers", self.position_held_layers)
        if position_held and not self.both:
            raise ValueError("position_held_layers hold the position curve of scaling both at 1 on some layers; "
                             "a one-curve search has held_layers (--layer-type) for that")
        if len(set(held) | set(position_held)) == self.num_layers:
            raise ValueError("held_layers and position_held_layers hold every layer's position factor at 1: "
                             "the position curve would have nothing to move")
        object.__setattr__(self, "position_held_layers", position_held)
        if self.brute_force:
            if self.x_step != 1:
                raise ValueError(f"brute-force mode has one gene per layer, so x_step must be 1, got {self.x_step}")
            object.__setattr__(self, "num_points", self.num_layers)
        elif isinstance(self.num_points, bool) or not isinstance(self.num_points, int) or self.num_points < 2:
            raise ValueError(f"num_points (control points) must be an integer >= 2, got {self.num_points!r}")
        elif self.num_points > self.x_cells + 1:
            raise ValueError(
                f"{self.num_points} control points with strictly increasing x do not fit on the x grid "
                f"(step {self.x_step}) of a {self.num_layers}-layer model, which has {self.x_cells + 1} positions"
            )

    def _layer_indices(self, name: str, layers) -> tuple[int, ...]:
        """``layers`` as sorted distinct layer indices, or a ValueError naming ``name``."""
        layers = tuple(layers)
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_layers for i in layers):
            raise ValueError(f"{name} must be layer indices in [0, {self.num_layers - 1}], got {list(layers)}")
        return tuple(sorted(set(layers)))

    # ------------------------------------------------------------------ the halves
    @property
    def both(self) -> bool:
        """Two curves in one genome (scaling both): position factors, then base factors."""
        return self.base_y_min is not None

    @property
    def genome_length(self) -> int:
        """Control points in a genome: ``num_points``, twice over for scaling both."""
        return self.num_points * (2 if self.both else 1)

    def halves(self) -> tuple["GenomeSpec", ...]:
        """One-curve specs of the genome's halves: ``(self,)``, or for scaling both ``(position, base)``,
        each with its own y range and start, everything else shared."""
        if not self.both:
            return (self,)
        position_held, base_held = with_axes(*AXES).held_per_half(self.held_layers, self.position_held_layers)
        one_curve = dict(base_y_min=None, base_y_max=None, base_y_step=None, base_initial_y=None, position_held_layers=())
        position = replace(self, **one_curve, held_layers=tuple(position_held))
        base = replace(self, **one_curve, held_layers=tuple(base_held), y_min=self.base_y_min, y_max=self.base_y_max,
                       y_step=self.base_y_step, initial_y=self.base_initial_y)
        return position, base

    def split(self, genome: Sequence) -> list[list]:
        """The genome's halves (one list, or the position curve's points and the base curve's)."""
        k = self.num_points
        return [list(genome)] if not self.both else [list(genome[:k]), list(genome[k:])]

    def starting_at(self, position_y: float | None = None, base_y: float | None = None) -> "GenomeSpec":
        """This spec with the initial genome at ``position_y`` (the ``initial_y``) and, for scaling both,
        ``base_y`` (the ``base_initial_y``), each snapped onto its half's y grid (a sweep's best start)."""
        changes = {}
        if position_y is not None:
            changes["initial_y"] = self.halves()[0].snap_y(position_y)
        if base_y is not None:
            if not self.both:
                raise ValueError("base_y starts the base curve, which only a spec of scaling both has")
            changes["base_initial_y"] = self.halves()[1].snap_y(base_y)
        return replace(self, **changes)

    def snap_y(self, y: float) -> float:
        """``y`` clipped into ``[y_min, y_max]`` and rounded onto the y grid."""
        j = round((min(max(y, self.y_min), self.y_max) - self.y_min) / self.y_step)
        return self.y_of(min(max(j, 0), self.y_cells))

    # ------------------------------------------------------------------- the grid
    @property
    def x_cells(self) -> int:
        """Largest x cell index: x = i * x_step for i in 0..x_cells."""
        return int(math.floor((self.num_layers - 1) / self.x_step + 1e-9))

    @property
    def y_cells(self) -> int:
        """Largest y cell index: y = y_min + j * y_step for j in 0..y_cells."""
        return int(math.floor((self.y_max - self.y_min) / self.y_step + 1e-9))

    def x_of(self, i: int) -> float:
        return round(i * self.x_step, _DECIMALS)

    def y_of(self, j: int) -> float:
        return round(self.y_min + j * self.y_step, _DECIMALS)

    def to_cells(self, genome: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
        """Grid cells of the points (each half on its own y grid)."""
        return [(round(x / half.x_step), round((y - half.y_min) / half.y_step))
                for half, points in zip(self.halves(), self.split(genome)) for x, y in points]

    def from_cells(self, cells: Sequence[tuple[int, int]]) -> Genome:
        return [(half.x_of(i), half.y_of(j)) for half, part in zip(self.halves(), self.split(cells)) for i, j in part]

    # ------------------------------------------------------------------ validity
    def violations(self, genome: Sequence[Sequence[float]]) -> list[str]:
        """Why ``genome`` is not a valid gene (empty list when it is); scaling both: each half's, named."""
        if self.both:
            if len(genome) != self.genome_length:
                return [f"has {len(genome)} points, expected {self.genome_length} (the position curve's "
                        f"{self.num_points}, then the base curve's {self.num_points})"]
            return [f"{name} curve: {problem}" for name, half, points in zip(AXES, self.halves(),
                                                                             self.split(genome))
                    for problem in half.violations(points)]
        problems = []
        if len(genome) != self.num_points:
            problems.append(f"has {len(genome)} points, expected {self.num_points}")
        for index, (x, y) in enumerate(genome):
            i, j = round(x / self.x_step), round((y - self.y_min) / self.y_step)
            if abs(x - self.x_of(i)) > 1e-9 or abs(y - self.y_of(j)) > 1e-9:
                problems.append(f"point {index} ({x}, {y}) is off the grid (x step {self.x_step}, y step {self.y_step} from {self.y_min})")
            if not (0 <= x <= self.num_layers - 1 and self.y_min - 1e-9 <= y <= self.y_max + 1e-9):
                problems.append(f"point {index} ({x}, {y}) is outside [0, {self.num_layers - 1}] x [{self.y_min}, {self.y_max}]")
            if index and x <= genome[index - 1][0]:
                problems.append(f"point {index} ({x}, {y}): x does not increase")
            if self.brute_force and x != index:
                problems.append(f"point {index} ({x}, {y}): brute-force genes sit at x = layer index")
        return problems

    def is_valid(self, genome: Sequence[Sequence[float]]) -> bool:
        return not self.violations(genome)

    # ---------------------------------------------------------------- phenotype
    def scales(self, genome: Sequence[Sequence[float]]) -> list[float]:
        """Layer scales of a genome: the curve through its control points, or the genes themselves.

        Scaling both: 2L, the position curve's scales then the base curve's."""
        if self.both:
            return [s for half, points in zip(self.halves(), self.split(genome)) for s in half.scales(points)]
        if self.brute_force:
            scales = [float(y) for _, y in genome]
        else:
            # The slack absorbs grid rounding at the ends of the y range.
            bounds = (self.y_min - 1e-9, self.y_max + 1e-9)
            scales = curve_scales(genome, self.num_layers, self.curve, y_bounds=bounds)
        return [1.0 if layer in self.held_layers else s for layer, s in enumerate(scales)]

    def uniform(self, value: float) -> list[float]:
        """One scale on every layer the search moves (the sweep's uniform points)."""
        if self.both:
            raise ValueError("a uniform point of scaling both is a pair: uniform_pair(position, base)")
        return [1.0 if layer in self.held_layers else float(value) for layer in range(self.num_layers)]

    def uniform_pair(self, position: float = 1.0, base: float = 1.0) -> list[float]:
        """Scaling both: ``position`` on every moved layer's position factor and ``base`` on its base
        factor (held layers at 1 in both halves, position-held layers in the position half); the flat 2L list. ``uniform_pair(s)``: position
        factor s with base 1, ``uniform_pair(base=b)``: base factor b at the true positions."""
        if not self.both:
            raise ValueError("uniform_pair is for a spec of scaling both; use uniform(value)")
        return [float(value) if layer not in half.held_layers else 1.0
                for value, half in zip((position, base), self.halves()) for layer in range(self.num_layers)]

    def to_dict(self) -> dict:
        """As JSON gives it back; a one-curve spec's has no ``base_*`` keys (the dict it always had)."""
        fields = asdict(self)
        if not self.both:
            for name in ("base_y_min", "base_y_max", "base_y_step", "base_initial_y", "position_held_layers"):
                del fields[name]
        else:
            fields["position_held_layers"] = list(self.position_held_layers)
        return {**fields, "held_layers": list(self.held_layers)}


def make_individual(genome: Sequence[Sequence[float]]):
    """Wrap plain ``(x, y)`` pairs into a DEAP individual (fitness not yet set)."""
    return creator.LPESIndividual((float(x), float(y)) for x, y in genome)


def initial_genome(spec: GenomeSpec) -> Genome:
    """The paper's starting individual: P_k = (k(L-1)/d, 1.5), snapped to the grid.

    ``y`` is ``spec.initial_y`` (1.5 by default) clipped into ``[y_min, y_max]``, because the
    paper's 1.5 may fall outside the y range chosen for a model. In brute-force mode every
    layer gets that ``y``. Scaling both: each half's own start (``initial_y``, ``base_initial_y``),
    the position curve's points then the base curve's (:meth:`GenomeSpec.starting_at` moves them).
    """
    if spec.both:
        return [point for half in spec.halves() for point in initial_genome(half)]
    y = min(max(spec.initial_y, spec.y_min), spec.y_max)
    j = round((y - spec.y_min) / spec.y_step)
    j = min(max(j, 0), spec.y_cells)
    if spec.brute_force:
        return spec.from_cells([(layer, j) for layer in range(spec.num_layers)])
    d = spec.num_points - 1
    cells = []
    for k in range(spec.num_points):
        i = round(k * (spec.num_layers - 1) / d / spec.x_step)
        i = min(max(i, cells[-1][0] + 1 if cells else 0), spec.x_cells)
        cells.append((i, j))
    # Snapping can squeeze points against the right end on a coarse grid; spread them back.
    for k in range(spec.num_points - 2, -1, -1):
        if cells[k][0] >= cells[k + 1][0]:
            cells[k] = (cells[k + 1][0] - 1, j)
    return spec.from_cells(cells)


def ramp_genome(spec: GenomeSpec, first_y: float, last_y: float) -> Genome:
    """A straight line from ``first_y`` at layer 0 to ``last_y`` at the last layer, as a genome: the
    start's control points (:func:`initial_genome`, evenly spaced in x) with each y on that line,
    snapped to the grid. A Bézier curve through evenly spaced collinear points is that line, so
    the curve's scales follow it up to the grid's rounding. ``first_y == last_y`` is the uniform start."""
    if spec.both or spec.brute_force:
        raise ValueError("ramp_genome draws one Bézier curve's control points; a spec of scaling both or a "
                         "brute-force spec has another genome")
    last_layer = spec.num_layers - 1
    return [(x, spec.snap_y(first_y + (last_y - first_y) * x / last_layer)) for x, _ in initial_genome(spec)]


def random_brute_force_genome(spec: GenomeSpec, rng: random.Random) -> Genome:
    """One scale per layer, each drawn uniformly from the y grid, i.e. U(y_min, y_max) on the grid."""
    if not spec.brute_force:
        raise ValueError("random_brute_force_genome needs a brute-force GenomeSpec")
    return spec.from_cells([(layer, rng.randint(0, spec.y_cells)) for layer in range(spec.num_layers)])


def random_genome(spec: GenomeSpec, rng: random.Random) -> Genome:
    """A uniformly random valid genome on the grid: distinct x cells in increasing order, each y any cell.

    Brute-force mode: :func:`random_brute_force_genome` (every layer's y drawn). Scaling both: each half drawn so.
    """
    if spec.both:
        return [point for half in spec.halves() for point in random_genome(half, rng)]
    if spec.brute_force:
        return random_brute_force_genome(spec, rng)
    xs = sorted(rng.sample(range(spec.x_cells + 1), spec.num_points))
    return spec.from_cells([(x, rng.randint(0, spec.y_cells)) for x in xs])
