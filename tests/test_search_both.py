"""Scaling ``both`` outside RoPE: the two-curve genome and its operators, the paired rows (PI, uniform
pairs), the curve plot, the layer-type report and lpes-report's extra curves."""

import json
import random

import pytest
from test_analysis_paired_cli import factors
from test_search_loop import SMALL, synthetic_fitness

from lpes_harness.search import GeneticSearch, GenomeSpec
from lpes_harness.search.genome import initial_genome, make_individual, random_genome
from lpes_harness.search.operators import build_toolbox, crossover, grid_steps, mutate, x_intervals
from lpes_harness.commands import layer_types as layer_types_command

BASE_RANGE = dict(base_y_min=0.5, base_y_max=8.0, base_y_step=0.25)
SPECS = {
    "cpu-ranges": GenomeSpec(num_layers=12, num_points=4, y_min=0.25, y_max=2.5, y_step=0.05, initial_y=1.0, **BASE_RANGE),
    "crowded": GenomeSpec(num_layers=6, num_points=5, y_min=0.8, y_max=1.2, **BASE_RANGE),
    "held": GenomeSpec(num_layers=8, num_points=3, held_layers=(0, 2), base_initial_y=2.0, **BASE_RANGE),
}
# The dict a one-curve spec always had: checkpoints saved before scaling both still resume.
OLD_KEYS = ["num_layers", "num_points", "y_min", "y_max", "x_step", "y_step", "curve", "brute_force", "initial_y",
            "held_layers"]


def test_a_both_spec_is_two_curves_on_their_own_y_grids():
    spec = SPECS["cpu-ranges"]
    assert spec.both and spec.genome_length == 8
    position, base = spec.halves()
    assert (position.y_min, position.y_max, position.y_step, position.both) == (0.25, 2.5, 0.05, False)
    assert (base.y_min, base.y_max, base.y_step, base.initial_y) == (0.5, 8.0, 0.25, 1.0)
    genome = initial_genome(spec)
    assert [y for _, y in genome] == [1.0] * 8 and spec.is_valid(genome)
    assert [x for x, _ in genome] == [0, 4, 7, 11] * 2
    assert spec.scales(genome) == [1.0] * 24
    start = initial_genome(spec.starting_at(1.23, 2.1))  # snapped onto each half's grid
    assert [y for _, y in start] == [1.25] * 4 + [2.0] * 4
    assert spec.starting_at(9.0, 99.0).base_initial_y == 8.0 and spec.starting_at(0.0).initial_y == 0.25
    with pytest.raises(ValueError, match="base_y starts the base curve"):
        GenomeSpec(num_layers=12).starting_at(1.0, 2.0)


def test_uniform_pairs_and_held_layers_in_both_halves():
    spec = SPECS["held"]
    scales = spec.scales(initial_genome(spec))
    assert len(scales) == 16 and scales[0] == scales[2] == scales[8] == scales[10] == 1.0
    assert scales[1] == 1.5 and scales[9] == 2.0
    assert spec.uniform_pair(1.2) == [1, 1.2, 1, 1.2, 1.2, 1.2, 1.2, 1.2] + [1.0] * 8
    assert spec.uniform_pair(base=2) == [1.0] * 8 + [1, 2, 1, 2, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="uniform_pair.position, base."):
        spec.uniform(1.2)
    with pytest.raises(ValueError, match="use uniform.value."):
        GenomeSpec(num_layers=8).uniform_pair(1.2)


def test_to_dict_round_trips_and_a_one_curve_dict_is_unchanged():
    for spec in SPECS.values():
        saved = json.loads(json.dumps(spec.to_dict()))
        assert GenomeSpec(**saved) == spec and saved["base_y_step"] == 0.25
    old = GenomeSpec(num_layers=12, held_layers=(1,)).to_dict()
    assert list(old) == OLD_KEYS
    assert GenomeSpec(**old) == GenomeSpec(num_layers=12, held_layers=(1,))


@pytest.mark.parametrize("kwargs, message", [
    (dict(base_y_min=0.5), "needs base_y_min, base_y_max and base_y_step together"),
    (dict(base_initial_y=2.0), "needs base_y_min, base_y_max and base_y_step together"),
    (dict(BASE_RANGE, brute_force=True), "brute-force mode .* .scaling both. search control points"),
    (dict(BASE_RANGE, base_y_min=3.0, base_y_max=2.0), "base_y range must satisfy"),
    (dict(BASE_RANGE, base_y_step=0.0), "base_y_step must be a positive number"),
])
def test_a_bad_both_spec_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenomeSpec(num_layers=12, **kwargs)


def test_violations_name_the_half():
    spec = SPECS["cpu-ranges"]
    genome = initial_genome(spec)
    assert "expected 8 (the position curve's 4, then the base curve's 4)" in spec.violations(genome[:4])[0]
    off_grid = genome[:4] + [(0, 1.1)] + genome[5:]  # 1.1 is on the position grid, not on the base one
    assert spec.violations(off_grid) == [
        "base curve: point 0 (0, 1.1) is off the grid (x step 1.0, y step 0.25 from 0.5)"]
    crossed = genome[:1] + [(0, 1.0)] + genome[2:]
    assert spec.violations(crossed)[0].startswith("position curve: point 1 (0, 1.0): x does not increase")


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("mode", ["paper", "joint"])
@pytest.mark.parametrize("base_my", [None, 1.0])
def test_mutation_moves_each_half_within_its_own_limits(name, mode, base_my):
    spec, rng = SPECS[name], random.Random(7)
    max_dx, max_dy = 2.0, 0.2
    limits = [grid_steps(max_dy, spec.y_step), grid_steps(max_dy if base_my is None else base_my,
                                                          spec.y_step if base_my is None else spec.base_y_step)]
    for _ in range(150):
        parent = make_individual(random_genome(spec, rng))
        (child,) = mutate(make_individual(parent), spec=spec, rng=rng, max_dx=max_dx, max_dy=max_dy, mode=mode,
                          max_dy_base=base_my)
        assert spec.is_valid(child) and child != parent
        for half, old, new, steps in zip(spec.halves(), spec.split(parent), spec.split(child), limits):
            old_cells, new_cells = half.to_cells(old), half.to_cells(new)
            ranges = x_intervals([i for i, _ in old_cells], grid_steps(max_dx, spec.x_step), half.x_cells, mode)
            for (i, j), (new_i, new_j), allowed in zip(old_cells, new_cells, ranges):
                assert new_i in allowed and abs(new_j - j) <= steps and 0 <= new_j <= half.y_cells


def test_a_half_that_cannot_move_is_named():
    spec = SPECS["cpu-ranges"]
    genome = make_individual(initial_genome(spec))
    with pytest.raises(ValueError, match="base curve: mutation cannot move anything: .*My=0.1 is below the y step 0.25"):
        mutate(genome, spec=spec, rng=random.Random(0), max_dx=0.5, max_dy=0.2, max_dy_base=0.1)


def test_crossover_swaps_one_point_within_its_half():
    spec, rng = SPECS["cpu-ranges"], random.Random(3)
    toolbox = build_toolbox(spec, rng, max_dx=3.0, max_dy=0.4, max_dy_base=1.0)
    crossed = 0
    for _ in range(100):
        parents = [make_individual(random_genome(spec, rng)) for _ in range(2)]
        for parent in parents:
            parent.fitness.values = (rng.random(),)
        children = crossover(*parents, spec=spec, rng=rng, mutate_fallback=toolbox.mutate, max_tries=4)
        for child in children:
            assert spec.is_valid(child) and len(spec.scales(child)) == 24
            if child.origin == "crossover":
                crossed += 1
                assert all(point in (a, b) for point, a, b in zip(child, *parents))
                assert min(sum(point != other for point, other in zip(child, parent)) for parent in parents) == 1
    assert crossed >= 100, f"only {crossed} of 200 children came from a crossover: the checks above barely ran"


def test_a_search_runs_on_a_both_genome():
    spec = GenomeSpec(num_layers=12, num_points=3, **BASE_RANGE)
    search = GeneticSearch(spec, synthetic_fitness, SMALL)
    result = search.run()
    assert len(result["best"]["scales"]) == 24 and len(result["best"]["genome"]) == 6
    assert all(spec.is_valid(individual) for individual in search.population)


# ----------------------------------------------------------------------------- rows, plots, reports


def test_pi_and_uniform_rows_of_a_both_curve():
    from lpes_harness.evaluation.paired import lpes_methods, parse_uniform, several_lpes_methods

    curve = [1.0, 2.0, 1.0, 3.0] + [2.0, 4.0, 2.0, 6.0]
    methods = factors(lpes_methods(curve, [(1.2, 1.0), (1.0, 2.0)], scaling="both"))
    assert list(methods) == ["vanilla", "PI", "LPES", "uniform 1.2:1", "uniform 1:2"]
    assert methods["vanilla"] == [1.0] * 8 and methods["PI"] == [1.75] * 4 + [3.5] * 4
    assert methods["uniform 1:2"] == [1.0] * 4 + [2.0] * 4
    held = factors(lpes_methods(curve, [(1.2, 2.0)], held_layers=(0, 2), scaling="both"))
    assert held["PI"] == [1, 2.5, 1, 2.5, 1, 5, 1, 5] and held["uniform 1.2:2"] == [1, 1.2, 1, 1.2, 1, 2, 1, 2]
    several = factors(several_lpes_methods({"a": curve, "b": [1.0, 2.0, 1.0, 2.0] + [1.0, 3.0, 1.0, 3.0],
                                            "c": [1.0] * 4 + [2.0] * 4}, uniform=[(1.0, 2.0)], scaling="both"))
    assert list(several) == ["vanilla", "PI a", "LPES a", "PI b", "LPES b", "uniform 1:2 (PI) c", "uniform 1:2"]
    assert several["PI b"] == [1.5] * 4 + [2.0] * 4  # a search that kept a uniform pair is named for it, not LPES
    assert several["vanilla"] == [1.0] * 8
    with pytest.raises(ValueError, match="a uniform row of scaling both is a .position, base. pair"):
        lpes_methods(curve, [1.2], scaling="both")
    assert parse_uniform("1.2:1, 1:2", "both") == [(1.2, 1.0), (1.0, 2.0)]
    assert parse_uniform("0.8,1.2") == [0.8, 1.2]
    with pytest.raises(ValueError, match="--uniform '1.2': give P:B pairs"):
        parse_uniform("1.2", "both")
    with pytest.raises(ValueError, match="every factor must be > 0"):
        parse_uniform("1:-2", "both")


def test_the_curve_plot_of_a_both_genome(tmp_path):
    from lpes_harness.search.curve_plot import plot_curve

    spec = SPECS["cpu-ranges"]
    genome = random_genome(spec, random.Random(1))
    plot_curve(tmp_path / "both.png", spec, genome, spec.scales(genome), title="best", scaling="both")
    one = GenomeSpec(num_layers=12)
    plot_curve(tmp_path / "one.png", one, initial_genome(one), one.scales(initial_genome(one)), scaling="base")
    assert (tmp_path / "both.png").stat().st_size > 0 and (tmp_path / "one.png").stat().st_size > 0


def test_layer_types_and_report_split_a_both_file(tmp_path, capsys):
    from transformers import Gemma3TextConfig

    from lpes_harness.evaluation import layer_types as lt
    from lpes_harness.evaluation.report import read_scales_argument
    from lpes_harness.core.scales_file import read_scales_and_scaling, write_scales_file

    Gemma3TextConfig(num_hidden_layers=6, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=8, vocab_size=64, sliding_window=8).save_pretrained(tmp_path / "g")
    scales = tmp_path / "scales.json"
    write_scales_file(scales, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5] + [2.0] * 5 + [4.0], scaling="both")
    assert layer_types_command.main(["--scales", str(scales), "--pretrained", str(tmp_path / "g"), "--output", str(tmp_path / "out")]) == 0
    only_full = read_scales_and_scaling(tmp_path / "out" / "only_full_attention.json")
    assert only_full == ([1.0] * 5 + [1.5] + [1.0] * 5 + [4.0], "both")
    report = json.loads((tmp_path / "out" / "layer_types.json").read_text())
    assert report["by_type"]["full_attention"]["mean"] == 1.5 and report["by_type_base"]["full_attention"]["mean"] == 4.0
    assert "## Base factors" in capsys.readouterr().out
    assert read_scales_argument(f"run={scales}") == [("run position", [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]),
                                                     ("run base", [2.0] * 5 + [4.0])]
