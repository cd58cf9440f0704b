"""The gene and its operators: grid, bounds and monotone x hold over thousands of random draws."""

import random

import pytest

from lpes_harness.search.genome import (
    GenomeSpec,
    initial_genome,
    make_individual,
    random_brute_force_genome,
)
from lpes_harness.search.operators import build_toolbox, crossover, fitter, mutate

SPECS = {
    "paper-4-points": GenomeSpec(num_layers=30),
    "2-points": GenomeSpec(num_layers=30, num_points=2),
    "5-points-tight-y": GenomeSpec(num_layers=30, num_points=5, y_min=1.0, y_max=1.3),
    "small-model-crowded": GenomeSpec(num_layers=6, num_points=5, y_min=0.8, y_max=1.2),
    "coarse-x-fine-y": GenomeSpec(num_layers=30, num_points=3, x_step=2.0, y_min=0.95, y_max=1.45, y_step=0.05),
    "linear-curve": GenomeSpec(num_layers=12, num_points=3, curve="linear"),
    "brute-force": GenomeSpec(num_layers=30, brute_force=True),
}


def fitted(genome, fitness):
    individual = make_individual(genome)
    individual.fitness.values = (fitness,)
    return individual


# --------------------------------------------------------------------------- genome


def test_initial_individual_is_the_papers_evenly_spread_flat_curve():
    spec = GenomeSpec(num_layers=31, num_points=4)
    assert initial_genome(spec) == [(0.0, 1.5), (10.0, 1.5), (20.0, 1.5), (30.0, 1.5)]
    # Off-grid k(L-1)/d is snapped to the x grid.
    assert initial_genome(GenomeSpec(num_layers=30)) == [(0.0, 1.5), (10.0, 1.5), (19.0, 1.5), (29.0, 1.5)]


@pytest.mark.parametrize("y_range, expected_y", [((1.0, 1.3), 1.3), ((1.7, 2.5), 1.7), ((0.5, 3.0), 1.5)])
def test_initial_y_is_clipped_into_the_configured_range(y_range, expected_y):
    spec = GenomeSpec(num_layers=30, num_points=3, y_min=y_range[0], y_max=y_range[1])
    genome = initial_genome(spec)
    assert [y for _, y in genome] == [expected_y] * 3
    assert spec.is_valid(genome)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_initial_genome_is_valid(name):
    spec = SPECS[name]
    assert spec.violations(initial_genome(spec)) == []


def test_brute_force_genes_are_uniform_on_the_y_grid():
    spec = GenomeSpec(num_layers=30, brute_force=True, y_min=1.0, y_max=2.0)
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        genome = random_brute_force_genome(spec, rng)
        assert spec.is_valid(genome)
        assert [x for x, _ in genome] == list(range(30))
        assert spec.scales(genome) == [y for _, y in genome]
        seen.update(y for _, y in genome)
    assert seen == {round(1.0 + 0.1 * j, 10) for j in range(11)}  # every grid value, ends included


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_layers=1), "num_layers"),
        (dict(num_layers=30, num_points=1), "num_points"),
        (dict(num_layers=4, num_points=5), "do not fit"),
        (dict(num_layers=30, y_min=2.0, y_max=1.0), "y range"),
        (dict(num_layers=30, y_step=0), "y_step"),
        (dict(num_layers=30, curve="spline"), r"unknown curve 'spline'.*bezier, linear, step"),
        (dict(num_layers=30, brute_force=True, x_step=2.0), "x_step must be 1"),
    ],
)
def test_bad_genome_specs_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenomeSpec(**kwargs)


def test_violations_name_the_problem():
    spec = GenomeSpec(num_layers=30, num_points=3)
    assert "x does not increase" in " ".join(spec.violations([(0, 1.5), (10, 1.5), (10, 1.5)]))
    assert "off the grid" in " ".join(spec.violations([(0, 1.5), (10.5, 1.5), (29, 1.5)]))
    assert "off the grid" in " ".join(spec.violations([(0, 1.55), (10, 1.5), (29, 1.5)]))
    assert "outside" in " ".join(spec.violations([(0, 1.5), (10, 2.1), (29, 1.5)]))
    assert "outside" in " ".join(spec.violations([(0, 1.5), (10, 1.5), (30, 1.5)]))
    assert "expected 3" in " ".join(spec.violations([(0, 1.5), (29, 1.5)]))


# ------------------------------------------------------------------------- mutation


@pytest.mark.parametrize("name", sorted(SPECS))
def test_mutation_keeps_grid_bounds_and_monotone_x_over_thousands_of_draws(name):
    spec = SPECS[name]
    rng = random.Random(hash(name) % 1000)
    max_dx, max_dy = 2.0, 0.2
    steps_x = 0 if spec.brute_force else int(max_dx / spec.x_step + 1e-9)
    steps_y = int(max_dy / spec.y_step + 1e-9)
    individual = make_individual(initial_genome(spec))
    largest_dx = largest_dy = 0
    for draw in range(3000):
        parent = list(individual)
        (individual,) = mutate(individual, spec=spec, rng=rng, max_dx=max_dx, max_dy=max_dy)
        assert spec.violations(individual) == [], (draw, parent, list(individual))
        assert list(individual) != parent  # a mutant is a new individual
        assert not individual.fitness.valid  # must be re-evaluated
        cells_before, cells_after = spec.to_cells(parent), spec.to_cells(individual)
        for (i0, j0), (i1, j1) in zip(cells_before, cells_after):
            assert abs(i1 - i0) <= steps_x and abs(j1 - j0) <= steps_y
            largest_dx, largest_dy = max(largest_dx, abs(i1 - i0)), max(largest_dy, abs(j1 - j0))
        if draw % 20 == 0:  # the curve is costlier than the rest; its hull property is tested in test_curves
            scales = spec.scales(individual)
            assert min(scales) >= spec.y_min - 1e-9 and max(scales) <= spec.y_max + 1e-9
    # The full move range is used (a mutation that never moves far would pass the checks above);
    # in x a point can move no further than the number of free grid cells.
    free_x_cells = spec.x_cells + 1 - spec.num_points
    assert largest_dx == min(steps_x, free_x_cells) and largest_dy == steps_y


def test_mutation_moves_are_uniform_over_the_allowed_steps():
    spec = GenomeSpec(num_layers=100, num_points=2, y_min=1.0, y_max=100.0)  # far from every bound
    rng = random.Random(0)
    counts = {}
    for _ in range(4000):
        individual = make_individual([(40.0, 50.0), (60.0, 50.0)])
        mutate(individual, spec=spec, rng=rng, max_dx=2, max_dy=0.2)
        dy = round((individual[0][1] - 50.0) / 0.1)
        counts[dy] = counts.get(dy, 0) + 1
    assert sorted(counts) == [-2, -1, 0, 1, 2]
    assert max(counts.values()) < 1.25 * min(counts.values())


def test_brute_force_mutation_never_moves_x():
    spec = SPECS["brute-force"]
    rng = random.Random(3)
    individual = make_individual(random_brute_force_genome(spec, rng))
    for _ in range(500):
        mutate(individual, spec=spec, rng=rng, max_dx=2, max_dy=0.2)
        assert [x for x, _ in individual] == list(range(30))


def test_mutation_that_cannot_move_is_an_error():
    spec = GenomeSpec(num_layers=30)
    with pytest.raises(ValueError, match="cannot move"):
        mutate(make_individual(initial_genome(spec)), spec=spec, rng=random.Random(0), max_dx=0.5, max_dy=0.05)


# ------------------------------------------------------------------------ crossover


def random_valid_genome(spec, rng, moves=5):
    individual = make_individual(initial_genome(spec))
    for _ in range(moves):
        mutate(individual, spec=spec, rng=rng, max_dx=4, max_dy=0.3)
    return list(individual)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_crossover_children_swap_one_point_and_stay_valid(name):
    spec = SPECS[name]
    rng = random.Random(7)
    for _ in range(1000):
        p1 = fitted(random_valid_genome(spec, rng), rng.random())
        p2 = fitted(random_valid_genome(spec, rng), rng.random())
        children = crossover(p1, p2, spec=spec, rng=rng, max_tries=10,
                             mutate_fallback=lambda ind: mutate(ind, spec=spec, rng=rng, max_dx=2, max_dy=0.2))
        assert 1 <= len(children) <= 2
        for child in children:
            assert spec.violations(child) == []
            assert not child.fitness.valid  # the loop evaluates, the operator only varies
            if child.origin == "crossover":
                # Every point comes from a parent at the same index, exactly one from the other parent.
                from_p1 = [a == c for a, c in zip(p1, child)]
                from_p2 = [b == c for b, c in zip(p2, child)]
                assert all(a or b for a, b in zip(from_p1, from_p2))
                assert list(child) not in (list(p1), list(p2))
            else:
                assert child.origin == "crossover_fallback" and len(children) == 1


def test_fitter_keeps_the_fittest_and_the_first_on_a_tie():
    first, second = fitted([(0.0, 1.0), (29.0, 1.0)], 0.3), fitted([(0.0, 2.0), (29.0, 2.0)], 0.3)
    assert fitter((first, second)) is first
    better = fitted([(0.0, 1.5), (29.0, 1.5)], 0.9)
    assert fitter((first, better)) is better and fitter((better, first)) is better


def test_crossover_with_one_invalid_child_keeps_the_valid_one():
    spec = GenomeSpec(num_layers=30, num_points=3)
    # Swapping point 0 or 2 leaves exactly one child with increasing x; swapping point 1 leaves none.
    p1 = fitted([(0.0, 1.0), (5.0, 1.0), (10.0, 1.0)], 0.9)
    p2 = fitted([(8.0, 2.0), (20.0, 2.0), (29.0, 2.0)], 0.1)
    for seed in range(30):
        children = crossover(p1, p2, spec=spec, rng=random.Random(seed), max_tries=10,
                             mutate_fallback=lambda ind: mutate(ind, spec=spec, rng=random.Random(0), max_dx=2, max_dy=0.2))
        assert [child.origin for child in children] == ["crossover"]
        assert spec.is_valid(children[0])


def test_crossover_fallback_is_a_mutant_of_the_fitter_parent():
    spec = GenomeSpec(num_layers=30, num_points=3)
    same = [(0.0, 1.5), (14.0, 1.5), (29.0, 1.5)]
    weak, strong = fitted(same, 0.2), fitted(same, 0.7)  # identical parents: no swap gives a new child
    strong_but_different = fitted([(0.0, 1.5), (15.0, 1.5), (29.0, 1.5)], 0.7)
    rng = random.Random(0)
    (child,) = crossover(weak, strong, spec=spec, rng=rng, max_tries=5,
                         mutate_fallback=lambda ind: mutate(ind, spec=spec, rng=rng, max_dx=2, max_dy=0.2))
    assert child.origin == "crossover_fallback"
    assert list(child) != same and spec.is_valid(child)
    # Parents differing only at the swapped point also give no new child; the fallback mutates the fitter one.
    (child,) = crossover(weak, strong_but_different, spec=spec, rng=rng, max_tries=50,
                         mutate_fallback=lambda ind: (ind,))  # identity, to see which parent it got
    assert child.origin == "crossover_fallback"
    assert list(child) == list(strong_but_different)


# ------------------------------------------------------------------------- toolbox


def test_toolbox_select_takes_the_top_parents():
    spec = GenomeSpec(num_layers=30, num_points=2)
    rng = random.Random(0)
    toolbox = build_toolbox(spec, rng, num_parents=3)
    population = [fitted([(0.0, 1.0 + 0.1 * k), (29.0, 1.0)], f) for k, f in enumerate([0.3, 0.9, 0.1, 0.7, 0.5])]
    assert [ind.fitness.values[0] for ind in toolbox.select(population)] == [0.9, 0.7, 0.5]


def test_toolbox_rejects_bad_operator_settings():
    spec = GenomeSpec(num_layers=30)
    with pytest.raises(ValueError, match="N_ct"):
        build_toolbox(spec, random.Random(0), crossover_tries=0)
    with pytest.raises(ValueError, match="mutation steps"):
        build_toolbox(spec, random.Random(0), max_dx=-1)


@pytest.mark.parametrize("mode, valid_pairs", [
    # Joint: Mx=2 lets point 0 reach x=1 when point 1 moves away: (0,1), (0,2), (1,2).
    ("joint", [(0.0, 1.0), (0.0, 2.0), (1.0, 2.0)]),
    # Paper (Eq. 4): point 0 stays below point 1's old x=1, so only (0,1), (0,2).
    ("paper", [(0.0, 1.0), (0.0, 2.0)]),
])
def test_x_moves_are_uniform_over_the_valid_placements_when_points_are_crowded(mode, valid_pairs):
    # Two points at x=0,1 on a 3-layer model with Mx=2. "Resample until valid" picks each valid
    # pair with the same probability (a greedy point-by-point draw would not).
    spec = GenomeSpec(num_layers=3, num_points=2, y_min=1.0, y_max=100.0)
    rng = random.Random(0)
    counts = {}
    draws = 6000
    for _ in range(draws):
        individual = make_individual([(0.0, 50.0), (1.0, 50.0)])
        mutate(individual, spec=spec, rng=rng, max_dx=2, max_dy=0.2, mode=mode)
        xs = (individual[0][0], individual[1][0])
        counts[xs] = counts.get(xs, 0) + 1
    assert sorted(counts) == valid_pairs
    for n in counts.values():
        assert abs(n / draws - 1 / len(valid_pairs)) < 0.03


def test_mutating_an_invalid_genome_is_an_error_naming_the_problem():
    spec = GenomeSpec(num_layers=30, num_points=3)
    with pytest.raises(ValueError, match="cannot mutate an invalid genome.*outside"):
        mutate(make_individual([(0, 1.5), (10, 2.5), (29, 1.5)]), spec=spec, rng=random.Random(0), max_dx=2, max_dy=0.2)
