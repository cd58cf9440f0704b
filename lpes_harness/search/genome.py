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
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Sequence

from deap import base, creator

from lpes_harness.curves import CURVES, curve_scales

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

    def __post_init__(self):
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int) or self.num_layers < 2:
            raise ValueError(f"num_layers must be an integer >= 2, got {self.num_layers!r}")
        if not (0 < self.y_min <= self.y_max and math.isfinite(self.y_max)):
            raise ValueError(f"y range must satisfy 0 < y_min <= y_max, got [{self.y_min}, {self.y_max}]")
        for name in ("x_step", "y_step"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.curve not in CURVES:
            raise ValueError(f"unknown curve {self.curve!r}; accepted: {', '.join(sorted(CURVES))}")
        held = tuple(self.held_layers)
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_layers for i in held):
            raise ValueError(f"held_layers must be layer indices in [0, {self.num_layers - 1}], got {list(held)}")
        if len(set(held)) == self.num_layers:
            raise ValueError("held_layers holds every layer at 1: the search would have nothing to move")
        object.__setattr__(self, "held_layers", tuple(sorted(set(held))))
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
        return [(round(x / self.x_step), round((y - self.y_min) / self.y_step)) for x, y in genome]

    def from_cells(self, cells: Sequence[tuple[int, int]]) -> Genome:
        return [(self.x_of(i), self.y_of(j)) for i, j in cells]

    # ------------------------------------------------------------------ validity
    def violations(self, genome: Sequence[Sequence[float]]) -> list[str]:
        """Why ``genome`` is not a valid gene (empty list when it is)."""
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
        """Layer scales of a genome: the curve through its control points, or the genes themselves."""
        if self.brute_force:
            scales = [float(y) for _, y in genome]
        else:
            # The slack absorbs grid rounding at the ends of the y range.
            bounds = (self.y_min - 1e-9, self.y_max + 1e-9)
            scales = curve_scales(genome, self.num_layers, self.curve, y_bounds=bounds)
        return [1.0 if layer in self.held_layers else s for layer, s in enumerate(scales)]

    def uniform(self, value: float) -> list[float]:
        """One scale on every layer the search moves (the sweep's uniform points)."""
        return [1.0 if layer in self.held_layers else float(value) for layer in range(self.num_layers)]

    def to_dict(self) -> dict:
        return {**asdict(self), "held_layers": list(self.held_layers)}  # as JSON gives it back


def make_individual(genome: Sequence[Sequence[float]]):
    """Wrap plain ``(x, y)`` pairs into a DEAP individual (fitness not yet set)."""
    return creator.LPESIndividual((float(x), float(y)) for x, y in genome)


def initial_genome(spec: GenomeSpec) -> Genome:
    """The paper's starting individual: P_k = (k(L-1)/d, 1.5), snapped to the grid.

    ``y`` is ``spec.initial_y`` (1.5 by default) clipped into ``[y_min, y_max]``, because the
    paper's 1.5 may fall outside the y range chosen for a model. In brute-force mode every
    layer gets that ``y``.
    """
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


def random_brute_force_genome(spec: GenomeSpec, rng: random.Random) -> Genome:
    """One scale per layer, each drawn uniformly from the y grid, i.e. U(y_min, y_max) on the grid."""
    if not spec.brute_force:
        raise ValueError("random_brute_force_genome needs a brute-force GenomeSpec")
    return spec.from_cells([(layer, rng.randint(0, spec.y_cells)) for layer in range(spec.num_layers)])


def random_genome(spec: GenomeSpec, rng: random.Random) -> Genome:
    """A uniformly random valid genome on the grid: distinct x cells in increasing order, each y any cell.

    Brute-force mode: :func:`random_brute_force_genome` (every layer's y drawn).
    """
    if spec.brute_force:
        return random_brute_force_genome(spec, rng)
    xs = sorted(rng.sample(range(spec.x_cells + 1), spec.num_points))
    return spec.from_cells([(x, rng.randint(0, spec.y_cells)) for x in xs])
