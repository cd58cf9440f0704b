"""--position-layer-type: under scaling both, the position curve moves one attention type only (Gemma-3's
global layers) while the base curve moves every layer. On Gemma-3-270M at 480 sentences a position curve
on the global layers gained and no base curve did (results/robust_gemma3_heldout), and position factors
break its sliding-window layers while base factors help them, so the two halves need their own layers."""

import json
import random
import sys

import pytest
from test_analysis_paired_cli import factors
from test_search_cli import GA, ga_args, history, run
from test_search_layer_type import gemma_checkpoint  # noqa: F401  (the tiny Gemma-3 fixture)

from lpes_harness.evaluation.paired import lpes_methods, several_lpes_methods
from lpes_harness.core.scaling import SCALINGS
from lpes_harness.search.selection import candidates
from lpes_harness.search.genome import GenomeSpec, initial_genome, random_genome

BASE_RANGE = dict(base_y_min=0.5, base_y_max=8.0, base_y_step=0.25)
SPEC = GenomeSpec(num_layers=6, num_points=3, y_min=1.0, y_max=4.0, initial_y=2.0, base_initial_y=3.0,
                  position_held_layers=(0, 2, 3, 4), **BASE_RANGE)


def test_the_position_curve_stays_at_1_where_the_base_curve_moves():
    position, base = SPEC.halves()
    assert position.held_layers == (0, 2, 3, 4) and base.held_layers == ()
    rng = random.Random(0)
    for genome in [initial_genome(SPEC)] + [random_genome(SPEC, rng) for _ in range(20)]:
        scales = SPEC.scales(genome)
        assert [scales[i] for i in (0, 2, 3, 4)] == [1.0] * 4
    start = SPEC.scales(initial_genome(SPEC))
    assert start[1] == start[5] == pytest.approx(2.0) and start[6:] == [3.0] * 6  # base on every layer
    assert SPEC.uniform_pair(2.0) == [1, 2, 1, 1, 1, 2] + [1.0] * 6
    assert SPEC.uniform_pair(base=2.0) == [1.0] * 6 + [2.0] * 6
    # held_layers still hold both halves; the position half holds the union
    both_held = GenomeSpec(num_layers=6, num_points=3, held_layers=(5,), position_held_layers=(0,), **BASE_RANGE)
    assert [half.held_layers for half in both_held.halves()] == [(0, 5), (5,)]
    assert both_held.uniform_pair(1.5, 2.0) == [1, 1.5, 1.5, 1.5, 1.5, 1] + [2, 2, 2, 2, 2, 1]


def test_it_round_trips_and_is_refused_where_it_means_nothing():
    assert GenomeSpec(**json.loads(json.dumps(SPEC.to_dict()))) == SPEC
    assert "position_held_layers" not in GenomeSpec(num_layers=6).to_dict()  # one-curve dicts are unchanged
    with pytest.raises(ValueError, match="a one-curve search has held_layers"):
        GenomeSpec(num_layers=6, position_held_layers=(0,))
    with pytest.raises(ValueError, match="nothing to move"):
        GenomeSpec(num_layers=3, num_points=2, held_layers=(0,), position_held_layers=(1, 2), **BASE_RANGE)
    with pytest.raises(ValueError, match=r"in \[0, 2\]"):
        GenomeSpec(num_layers=3, num_points=2, position_held_layers=(3,), **BASE_RANGE)
    with pytest.raises(ValueError, match="need scaling both"):
        SCALINGS["position"].held_per_half((), (1,))


def test_a_uniform_start_is_named_pi_and_pi_moves_each_halfs_own_layers():
    held = {"scaling": "both", "position_held_layers": (0, 2, 3, 4)}
    start = SPEC.uniform_pair(2.0)
    assert SCALINGS["both"].uniform_factor(start, position_held_layers=held["position_held_layers"]) == (2.0, 1.0)
    assert SCALINGS["both"].uniform_factor(start) is None  # without the position-held layers it looks like a curve
    curve = [1.0, 2.0, 1.0, 1.0, 1.0, 3.0] + [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    methods = factors(lpes_methods(curve, [(1.5, 2.0)], **held))
    assert methods["PI"] == [1, 2.5, 1, 1, 1, 2.5] + [3.5] * 6
    assert methods["uniform 1.5:2"] == [1, 1.5, 1, 1, 1, 1.5] + [2.0] * 6
    several = several_lpes_methods({"curve": curve, "start": start}, **held)
    assert "uniform 2:1 (PI) start" in several and "LPES start" not in several and "LPES curve" in several
    # the search's own candidates name a kept uniform start for what it is
    records = [{"index": 0, "scales": start, "fitness": 0.9, "genome": None},
               {"index": 1, "scales": curve, "fitness": 0.8, "genome": None}]
    pool = candidates(records, [], SPEC, "both", top=2)
    assert [(c.label, c.kind) for c in pool] == [("uniform position 2", "uniform"), ("LPES #1", "curve")]


def test_a_search_moves_positions_on_the_global_layers_and_bases_everywhere(gemma_checkpoint, tmp_path):  # noqa: F811
    output = tmp_path / "split"
    args = ga_args(gemma_checkpoint, output, generations=2)
    args[args.index("--sweep") + 1] = "1,2"
    args[args.index("--heldout-samples") + 1] = "2"
    done = run([sys.executable, GA, *args, "--scaling", "both", "--position-layer-type", "full_attention",
                "--base-sweep", "2", "--y-max", "4", "--my", "0.6", "--base-y-max", "4"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--position-layer-type full_attention: the position curve moves layers 1, 3; the other 2 stay at 1" in done.stdout
    records = history(output)
    assert len(records) >= 4
    for record in records:  # 4 layers: positions [0:4], bases [4:8]; sliding layers 0 and 2
        assert record["scales"][0] == record["scales"][2] == 1.0, record
    assert any(r["scales"][4] != 1.0 or r["scales"][6] != 1.0 for r in records)  # bases moved on sliding layers
    config = json.loads((output / "config.json").read_text())
    assert config["genome"]["position_held_layers"] == [0, 2] and config["genome"]["held_layers"] == []
    methods = json.loads((output / "heldout.json").read_text())["scored"]["methods"]
    assert all(row[0] == row[2] == 1.0 for name, row in methods.items())
    # a resume with the flag given differently is refused; with none it keeps the run's own
    again = run([sys.executable, GA, "--resume", "--output", str(output), "--position-layer-type", "sliding_attention"])
    assert again.returncode == 2 and "position_layer_type" in again.stderr, again.stderr[-2000:]


def test_without_scaling_both_it_is_one_line_before_anything_is_written(gemma_checkpoint, tmp_path):  # noqa: F811
    output = tmp_path / "bad"
    done = run([sys.executable, GA, *ga_args(gemma_checkpoint, output), "--position-layer-type", "full_attention"])
    assert done.returncode == 2
    assert "--position-layer-type full_attention: it holds the position curve of --scaling both" in done.stderr
    assert "Traceback" not in done.stderr and not output.exists()


def test_a_type_the_model_lacks_names_the_flag_that_asked(gemma_checkpoint, tmp_path):  # noqa: F811
    from lpes_harness.evaluation.paired import held_layers_of

    output = tmp_path / "bad_type"
    done = run([sys.executable, GA, *ga_args(gemma_checkpoint, output), "--scaling", "both",
                "--position-layer-type", "global"])
    assert done.returncode != 0
    assert "--position-layer-type 'global': this model's layers are of type(s) sliding_attention, full_attention" in done.stderr
    assert "Traceback" not in done.stderr and not output.exists()
    with pytest.raises(ValueError, match="--position-layer-type 'global': this model's layers"):
        held_layers_of(gemma_checkpoint, "global", "--position-layer-type")
