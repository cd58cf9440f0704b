"""Variation and selection operators of the search, registered on a DEAP toolbox.

* ``mutate``: every control point moves in whole grid steps, by at most ``Mx`` in x and
  ``My`` in y. Two modes (``mutation=``):

  - ``"paper"`` (default): the paper's Equation 4. Point ``k``'s new x is drawn from
    ``[max(P_{k-1}, P_k - Mx), min(P_{k+1}, P_k + Mx)]`` with the *old* neighbours
    ``P_{k-1}``, ``P_{k+1}`` (and ``0``, ``L-1`` at the ends); as x must strictly increase,
    on the integer grid the old neighbours themselves are excluded:
    ``x_{k-1}+1 .. x_{k+1}-1``. Its new y is drawn from
    ``[max(y_min, y - My), min(y_max, y + My)]``. Two neighbours may still cross (point k
    moving right while point k+1 moves left), so the draw is repeated until x is strictly
    increasing, as the paper does; ``_draw_xs`` samples that distribution exactly, uniform
    over the valid placements inside the intervals, without the rejection loop.
  - ``"joint"``: wider than the paper: each x is drawn from ``[0, L-1] ∩ [P_k - Mx, P_k + Mx]``
    and the draw is kept if the x order holds, so a point may jump past its neighbour's
    old place when that neighbour moves too (common when points are closer than 2·Mx: two
    thirds of the mutants of crowded 5-point genomes on 12 layers fall outside the paper's
    intervals). The operator of the first releases.

  In both, y moves are independent per point, each redrawn on its own until in bounds
  (uniform over the clipped interval). A mutant equal to its parent is redrawn, so every
  mutant is a new individual.

  A genome of scaling ``both`` is two curves: each half moves as above within its own limits
  (the x steps are shared; the base curve's y by at most ``My_base``, by default as many of
  its y steps as ``My`` is of the position curve's), and the whole mutant is redrawn while it
  equals its parent.
* ``mate``: single-point crossover. A random index ``k`` is drawn and control point ``k`` is
  swapped between the parents (under scaling ``both``: a point of one half, swapped within that half), giving two children; the valid, new ones (not equal to a
  parent) are returned, and the loop evaluates them and keeps the fitter (:func:`fitter`,
  the first child on a tie). Up to ``N_ct`` indices are tried. **Fallback:** when no try gives a valid new child (e.g. the
  parents are identical, or every swap breaks the x order), the child is a mutant of the
  fitter parent, so each crossover slot still yields one new evaluated individual.
* ``select``: the ``N_pa`` fittest individuals (``deap.tools.selBest``; ties keep population order).

All randomness comes from the ``random.Random`` given to :func:`build_toolbox`, never from
the global ``random`` module, so a search is reproducible and resumable from its RNG state.
"""

from __future__ import annotations

import math
import random
from typing import Callable

from deap import base, tools

from lpes_harness.search.genome import GenomeSpec, make_individual

MAX_MUTATION_DRAWS = 100_000
MUTATIONS = ("paper", "joint")


def check_mutation(mode: str) -> str:
    """``mode`` if it is a mutation mode, else ``ValueError`` naming the accepted ones.

    The one check of the mode: the config, the command line's checks and the operators call it."""
    if mode not in MUTATIONS:
        raise ValueError(f"mutation {mode!r} is not one of {', '.join(MUTATIONS)}")
    return mode


def grid_steps(distance: float, step: float) -> int:
    """How many whole grid steps fit in ``distance`` (so a move never exceeds it)."""
    return int(math.floor(distance / step + 1e-9))


def x_intervals(xs: list[int], steps: int, last_cell: int, mode: str = "paper") -> list[range]:
    """Grid cells each point's new x is drawn from (before the x order is enforced).

    ``paper``: Equation 4 with the old neighbours, which the new x may not reach (x strictly
    increases): ``max(x_{k-1} + 1, x_k - steps) .. min(x_{k+1} - 1, x_k + steps)``, with
    ``-1`` and ``last_cell + 1`` as the outer neighbours. ``joint``: ``[0, last_cell]`` only.
    """
    if mode == "joint":  # the mode was checked by the caller (mutate)
        return [range(max(0, x - steps), min(last_cell, x + steps) + 1) for x in xs]
    before, after = [-1, *xs[:-1]], [*xs[1:], last_cell + 1]
    return [range(max(lo + 1, x - steps), min(hi - 1, x + steps) + 1) for lo, x, hi in zip(before, xs, after)]


def mutate(individual, *, spec: GenomeSpec, rng: random.Random, max_dx: float, max_dy: float, mode: str = "paper",
           max_dy_base: float | None = None):
    """DEAP-style in-place mutation; returns ``(individual,)`` with its fitness invalidated.

    ``mode`` is ``"paper"`` (Equation 4: each x stays between its old neighbours) or
    ``"joint"`` (wider: each x anywhere in ``[0, L-1]`` within ``Mx``); see the module docstring.
    ``max_dy_base``: scaling both, the base curve's My (default: as many of its y steps as ``max_dy``
    is of the position curve's).
    """
    check_mutation(mode)
    problems = spec.violations(individual)
    if problems:
        raise ValueError(f"cannot mutate an invalid genome {list(individual)}: {'; '.join(problems)}")
    halves = spec.halves()
    steps_y = [grid_steps(max_dy, spec.y_step)]
    if spec.both:
        steps_y.append(steps_y[0] if max_dy_base is None else grid_steps(max_dy_base, spec.base_y_step))
    shown_dy = [max_dy, max_dy_base if max_dy_base is not None else round(steps_y[-1] * halves[-1].y_step, 10)]
    draws = [_half_draw(half, points, max_dx, sy, mode, shown_dy[n], "base curve: " if n else "")
             for n, (half, points, sy) in enumerate(zip(halves, spec.split(individual), steps_y))]
    parent = [cells for _, cells in draws]
    for _ in range(MAX_MUTATION_DRAWS):
        moved = [draw(rng) for draw, _ in draws]
        if moved != parent:
            break
    else:
        raise RuntimeError(
            f"could not mutate {list(individual)} into a different valid genome in {MAX_MUTATION_DRAWS} draws "
            f"(moves of at most {max_dx} in x and {max_dy} in y, y range [{spec.y_min}, {spec.y_max}]); "
            "widen the mutation steps or the y range"
        )
    individual[:] = [point for half, cells in zip(halves, moved) for point in half.from_cells(cells)]
    del individual.fitness.values
    return (individual,)


def _half_draw(spec: GenomeSpec, points, max_dx: float, sy: int, mode: str, max_dy, label: str):
    """One curve's mutation: ``(draw(rng) -> moved cells, its cells now)``; refuses a curve nothing can move."""
    cells = spec.to_cells(points)
    sx = 0 if spec.brute_force else grid_steps(max_dx, spec.x_step)
    if sx == 0 and sy == 0:
        raise ValueError(
            f"{label}mutation cannot move anything: Mx={max_dx} is below the x step {spec.x_step} (or x is fixed) "
            f"and My={max_dy} is below the y step {spec.y_step}"
        )
    xs = [i for i, _ in cells]
    ranges = x_intervals(xs, sx, spec.x_cells, mode) if sx else [range(x, x + 1) for x in xs]
    ways = _count_placements(ranges)
    if ways[0] and sum(ways[0].values()) == 1 and (sy == 0 or spec.y_cells == 0):
        raise ValueError(
            f"{label}mutation cannot move {list(points)}: no x move of at most {max_dx} keeps x strictly increasing "
            f"({mode} mode) and y cannot move (My={max_dy}, y range [{spec.y_min}, {spec.y_max}], step {spec.y_step})"
        )

    def draw(rng: random.Random) -> list[tuple[int, int]]:
        new_xs = _draw_xs(ranges, ways, rng) if sx else xs
        return list(zip(new_xs, [_draw_y(j, sy, spec.y_cells, rng) for _, j in cells]))

    return draw, cells


def _count_placements(ranges: list[range]) -> list[dict[int, int]]:
    """``ways[k][v]``: the strictly increasing placements of points k.. with point k at cell v."""
    ways = [dict.fromkeys(ranges[-1], 1)]
    for k in range(len(ranges) - 2, -1, -1):
        after = ways[0]
        ways.insert(0, {v: sum(n for w, n in after.items() if w > v) for v in ranges[k]})
    return ways


def _draw_xs(ranges: list[range], ways: list[dict[int, int]], rng: random.Random) -> list[int]:
    """Uniform draw over the strictly increasing x placements with point k in ``ranges[k]``.

    That is the distribution "redraw until valid" samples from, computed exactly: plain
    rejection gets slow when points are crowded (5 points on 6 layers accept ~1 draw in 1000).
    ``ways`` is :func:`_count_placements` of ``ranges``.
    """
    moved, previous = [], -1
    for k in range(len(ranges)):
        choices = [(v, n) for v, n in ways[k].items() if v > previous and n > 0]
        pick = rng.randrange(sum(n for _, n in choices))
        for v, n in choices:
            if pick < n:
                break
            pick -= n
        moved.append(v)
        previous = v
    return moved


def _draw_y(j: int, steps: int, last_cell: int, rng: random.Random) -> int:
    while True:  # terminates: the zero move is always inside the bounds
        moved = j + rng.randint(-steps, steps)
        if 0 <= moved <= last_cell:
            return moved


def crossover(parent1, parent2, *, spec: GenomeSpec, rng: random.Random, mutate_fallback: Callable, max_tries: int):
    """Single-point crossover; returns the children (one or two), not yet evaluated.

    They are the valid new ones of the two a swap gives, each with ``origin`` ``"crossover"``;
    or, when no try gives one, a mutant of the fitter parent (``origin`` ``"crossover_fallback"``).
    The caller evaluates them and keeps the fitter (:func:`fitter`).
    """
    for _ in range(max_tries):
        k = rng.randrange(len(parent1))
        child1, child2 = make_individual(parent1), make_individual(parent2)
        child1[k], child2[k] = parent2[k], parent1[k]
        children = tuple(
            child for child in (child1, child2) if child != parent1 and child != parent2 and spec.is_valid(child)
        )
        if children:
            for child in children:
                child.origin = "crossover"  # read by the loop's history records
            return children
    (child,) = mutate_fallback(make_individual(fitter((parent1, parent2))))
    child.origin = "crossover_fallback"
    return (child,)


def fitter(individuals):
    """The fittest of evaluated ``individuals``; the first on a tie."""
    best = individuals[0]
    for individual in individuals[1:]:
        if individual.fitness.values[0] > best.fitness.values[0]:
            best = individual
    return best


def build_toolbox(
    spec: GenomeSpec,
    rng: random.Random,
    *,
    max_dx: float = 2.0,
    max_dy: float = 0.2,
    crossover_tries: int = 4,
    num_parents: int = 12,
    mutation: str = "paper",
    max_dy_base: float | None = None,
) -> base.Toolbox:
    """A DEAP toolbox with ``clone``, ``mutate``, ``mate`` and ``select`` bound to one search.

    The operators only vary (as in DEAP's ``eaSimple``): ``toolbox.mutate(toolbox.clone(parent))``
    returns ``(mutant,)`` and ``toolbox.mate(p1, p2)`` the children (see :func:`crossover`), none
    of them evaluated. The loop registers ``evaluate`` (a pure function of the layer scales) and
    assigns the fitness itself. ``max_dy_base``: the base curve's My under scaling both (:func:`mutate`).
    """
    if crossover_tries < 1:
        raise ValueError(f"crossover_tries (N_ct) must be >= 1, got {crossover_tries}")
    if max_dx < 0 or max_dy < 0 or (max_dy_base is not None and max_dy_base < 0):
        raise ValueError(f"mutation steps must be >= 0, got Mx={max_dx}, My={max_dy}"
                         + ("" if max_dy_base is None else f", My_base={max_dy_base}"))
    check_mutation(mutation)  # now, not at the first mutant
    toolbox = base.Toolbox()
    toolbox.register("clone", make_individual)
    toolbox.register("mutate", mutate, spec=spec, rng=rng, max_dx=max_dx, max_dy=max_dy, mode=mutation,
                     max_dy_base=max_dy_base)
    toolbox.register("mate", crossover, spec=spec, rng=rng, mutate_fallback=toolbox.mutate, max_tries=crossover_tries)
    toolbox.register("select", tools.selBest, k=num_parents)
    return toolbox
