"""Mutation follows the paper's Equation 4: each point moves within its old neighbours and Mx, My.

    x_k' in [max(P_{k-1}, P_k - Mx), min(P_{k+1}, P_k + Mx)]   (old neighbours; x strictly increasing)
    y_k' in [max(y_min, y_k - My), min(y_max, y_k + My)]

``mutation="joint"`` keeps the earlier, wider draw (x anywhere in [0, L-1] within Mx).
"""

import itertools
import random

import pytest

from lpes_harness.search import GeneticSearch, GenomeSpec, SearchConfig
from lpes_harness.search.genome import initial_genome, make_individual
from lpes_harness.search.operators import build_toolbox, mutate, x_intervals

MX, MY = 2.0, 0.2


def paper_intervals(spec, parent, max_dx=MX, max_dy=MY):
    """Equation 4 in grid cells, written out independently of the operator's code."""
    cells = spec.to_cells(parent)
    sx = 0 if spec.brute_force else int(max_dx / spec.x_step + 1e-9)
    sy = int(max_dy / spec.y_step + 1e-9)
    intervals = []
    for k, (i, j) in enumerate(cells):
        left = cells[k - 1][0] if k > 0 else -1  # the old neighbour, which the new x may not reach
        right = cells[k + 1][0] if k + 1 < len(cells) else spec.x_cells + 1
        x_lo, x_hi = max(left + 1, i - sx), min(right - 1, i + sx)
        y_lo, y_hi = max(0, j - sy), min(spec.y_cells, j + sy)
        intervals.append(((x_lo, x_hi), (y_lo, y_hi)))
    return intervals


def outside(spec, parent, child) -> list[str]:
    problems = []
    for k, (((x_lo, x_hi), (y_lo, y_hi)), (i, j)) in enumerate(zip(paper_intervals(spec, parent), spec.to_cells(child))):
        if not x_lo <= i <= x_hi:
            problems.append(f"point {k}: x cell {i} outside [{x_lo}, {x_hi}]")
        if not y_lo <= j <= y_hi:
            problems.append(f"point {k}: y cell {j} outside [{y_lo}, {y_hi}]")
    return problems


SPECS = {
    "paper-4-points": GenomeSpec(num_layers=30),
    "cpu-profile": GenomeSpec(num_layers=30, y_min=0.6, y_max=1.6, initial_y=1.0),
    "5-points-12-layers": GenomeSpec(num_layers=12, num_points=5, y_min=1.0, y_max=1.3),
    "small-model-crowded": GenomeSpec(num_layers=6, num_points=5, y_min=0.8, y_max=1.2),
    "coarse-x-fine-y": GenomeSpec(num_layers=30, num_points=3, x_step=2.0, y_min=0.95, y_max=1.45, y_step=0.05),
}


def parents(spec, rng, count):
    """Varied valid parents: a random walk of wide joint mutations from the initial genome."""
    walker = make_individual(initial_genome(spec))
    for _ in range(count):
        mutate(walker, spec=spec, rng=rng, max_dx=4, max_dy=0.3, mode="joint")
        yield list(walker)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_ten_thousand_mutants_lie_in_the_papers_intervals(name):
    spec = SPECS[name]
    rng = random.Random(7)
    draws = 0
    moved_far = False
    sx = int(MX / spec.x_step + 1e-9)
    for parent in parents(spec, random.Random(1), 2000):
        for _ in range(5):  # 2000 parents x 5 mutants = 10,000 mutants
            (child,) = mutate(make_individual(parent), spec=spec, rng=rng, max_dx=MX, max_dy=MY)
            draws += 1
            assert outside(spec, parent, child) == [], (parent, list(child))
            assert spec.violations(child) == [], (parent, list(child))
            assert list(child) != parent
            moved_far |= any(abs(a[0] - b[0]) == sx for a, b in zip(spec.to_cells(parent), spec.to_cells(child)))
    assert draws == 10_000
    assert moved_far or name == "small-model-crowded", "the whole Mx range is never used"


def test_the_joint_draw_is_wider_than_the_paper_and_still_valid():
    spec = SPECS["5-points-12-layers"]
    rng = random.Random(3)
    wider = 0
    for parent in parents(spec, random.Random(2), 2000):
        (child,) = mutate(make_individual(parent), spec=spec, rng=rng, max_dx=MX, max_dy=MY, mode="joint")
        assert spec.violations(child) == [] and list(child) != parent
        for (i0, j0), (i1, j1) in zip(spec.to_cells(parent), spec.to_cells(child)):
            assert abs(i1 - i0) <= 2 and abs(j1 - j0) <= 2
        wider += bool(outside(spec, parent, child))
    # Crowded points: a point jumps past its neighbour's old place in a good share of mutants.
    assert wider / 2000 > 0.05


def test_paper_x_moves_are_uniform_over_the_increasing_placements_inside_the_intervals():
    # Points at x = 0, 3, 5 of 8 layers, Mx = 2: intervals [0, 2], [1, 4], [4, 7]. Neighbours may
    # still cross (point 0 at 2, point 1 at 1), so such draws are redrawn: uniform over the rest.
    spec = GenomeSpec(num_layers=8, num_points=3, y_min=1.0, y_max=100.0)
    parent = [(0.0, 50.0), (3.0, 50.0), (5.0, 50.0)]
    assert [(r.start, r.stop - 1) for r in x_intervals([0, 3, 5], 2, spec.x_cells)] == [(0, 2), (1, 4), (4, 7)]
    allowed = [xs for xs in itertools.product(range(0, 3), range(1, 5), range(4, 8)) if xs[0] < xs[1] < xs[2]]
    allowed.remove((0, 3, 5))  # My = 0 here: a mutant must move in x
    rng = random.Random(0)
    counts = dict.fromkeys(allowed, 0)
    draws = 20 * 1000
    for _ in range(draws):
        (child,) = mutate(make_individual(parent), spec=spec, rng=rng, max_dx=2, max_dy=0.0)
        counts[tuple(int(x) for x, _ in child)] += 1  # KeyError: a placement outside the intervals
    expected = draws / len(allowed)
    assert all(abs(n - expected) < 0.2 * expected for n in counts.values()), counts


def test_a_genome_that_cannot_move_is_an_error_at_once():
    # Six points on a six-layer model fill the x grid; with My below the y step nothing can move.
    spec = GenomeSpec(num_layers=6, num_points=6)
    genome = make_individual(initial_genome(spec))
    with pytest.raises(ValueError, match="cannot move .* no x move of at most 2 keeps x strictly increasing"):
        mutate(genome, spec=spec, rng=random.Random(0), max_dx=2, max_dy=0.05)


def test_unknown_mutation_is_named():
    spec = GenomeSpec(num_layers=30)
    with pytest.raises(ValueError, match="mutation 'wide' is not one of paper, joint"):
        mutate(make_individual(initial_genome(spec)), spec=spec, rng=random.Random(0), max_dx=2, max_dy=0.2, mode="wide")
    with pytest.raises(ValueError, match="mutation 'wide' is not one of paper, joint"):
        build_toolbox(spec, random.Random(0), mutation="wide")
    with pytest.raises(ValueError, match="mutation 'wide' is not one of paper, joint"):
        SearchConfig(mutation="wide")


def test_the_search_config_picks_the_mutation_and_defaults_to_the_paper():
    assert SearchConfig().mutation == "paper"
    spec = SPECS["5-points-12-layers"]
    for mode in ("paper", "joint"):
        search = GeneticSearch(spec, lambda ind: (0.0, {}), SearchConfig(mutation=mode))
        assert search.toolbox.mutate.keywords["mode"] == mode


def test_a_checkpoint_from_before_the_option_resumes_only_as_joint():
    spec = GenomeSpec(num_layers=12, num_points=3)
    config = SearchConfig(population=4, parents=2, mutants=1, crossovers=1, generations=1)
    state = GeneticSearch(spec, lambda ind: (0.0, {}), config).state_dict()
    del state["config"]["mutation"]  # as written before the option existed (the joint draw)
    with pytest.raises(ValueError, match="mutation: saved 'joint', now 'paper'"):
        GeneticSearch(spec, lambda ind: (0.0, {}), config).load_state_dict(state)
    joint = SearchConfig(**{**config.to_dict(), "mutation": "joint"})
    GeneticSearch(spec, lambda ind: (0.0, {}), joint).load_state_dict(state)
