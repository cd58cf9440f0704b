"""--layer-type: a search that moves one attention type only (Gemma-3's global layers), the others held at 1."""

import json
import sys

import pytest
from test_analysis_paired_cli import factors
from test_search_cli import GA, ga_args, history, run
from tiny_models import FAMILY_COMMON, tiny_tokenizer

from lpes_harness.evaluation.layer_types import layers_not_of
from lpes_harness.search.genome import GenomeSpec, initial_genome, random_genome

TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def test_held_layers_stay_at_1_whatever_the_genes_say():
    spec = GenomeSpec(num_layers=6, num_points=3, y_min=1.0, y_max=4.0, initial_y=2.0, held_layers=(0, 2, 3, 4))
    import random

    rng = random.Random(0)
    for genome in [initial_genome(spec)] + [random_genome(spec, rng) for _ in range(20)]:
        scales = spec.scales(genome)
        assert [scales[i] for i in (0, 2, 3, 4)] == [1.0] * 4
    assert spec.scales(initial_genome(spec))[1] == pytest.approx(2.0)
    assert spec.uniform(3.0) == [1.0, 3.0, 1.0, 1.0, 1.0, 3.0]
    assert GenomeSpec(num_layers=3, num_points=3).uniform(0.5) == [0.5] * 3  # no held layers: every layer
    brute = GenomeSpec(num_layers=3, brute_force=True, held_layers=(1,))
    assert brute.scales([(0, 1.5), (1, 1.5), (2, 1.2)]) == [1.5, 1.0, 1.2]


@pytest.mark.parametrize("held, match", [((0, 1, 2), "every layer"), ((3,), r"in \[0, 2\]"), ((True,), "indices")])
def test_bad_held_layers_are_refused(held, match):
    with pytest.raises(ValueError, match=match):
        GenomeSpec(num_layers=3, num_points=3, held_layers=held)


def test_a_type_the_model_lacks_names_the_types_it_has():
    assert layers_not_of(TYPES, "full_attention") == (0, 2)
    with pytest.raises(ValueError, match="--layer-type 'global'.*sliding_attention, full_attention"):
        layers_not_of(TYPES, "global")


@pytest.fixture(scope="module")
def gemma_checkpoint(tmp_path_factory):
    import torch
    import transformers

    config = transformers.Gemma3TextConfig(**dict(
        FAMILY_COMMON, head_dim=16, sliding_window=8, query_pre_attn_scalar=16, layer_types=TYPES,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}))
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny_gemma3")
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def test_a_search_on_the_global_layers_never_moves_a_sliding_one(gemma_checkpoint, tmp_path):
    output = tmp_path / "global_only"
    args = ga_args(gemma_checkpoint, output, generations=2)
    args[args.index("--sweep") + 1] = "1,2"
    args[args.index("--heldout-samples") + 1] = "2"
    done = run([sys.executable, GA, *args, "--layer-type", "full_attention", "--y-max", "4", "--my", "0.6"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the search moves layers 1, 3; the other 2 stay at 1" in done.stdout
    records = history(output)
    assert len(records) >= 4
    for record in records:
        assert record["scales"][0] == record["scales"][2] == 1.0, record
    assert any(r["scales"][1] != 1.0 for r in records)  # the global layers did move
    assert json.loads((output / "scales.json").read_text())["scales"][0::2] == [1.0, 1.0]
    # The held-out table's PI and uniform rows move the same layers as the search.
    methods = json.loads((output / "heldout.json").read_text())["scored"]["methods"]
    assert methods["uniform 2"] == [1.0, 2.0, 1.0, 2.0] and methods["PI"][0::2] == [1.0, 1.0]
    assert json.loads((output / "config.json").read_text())["genome"]["held_layers"] == [0, 2]


def test_a_layer_type_the_model_lacks_is_one_line_before_any_search(gemma_checkpoint, tmp_path):
    output = tmp_path / "bad"
    done = run([sys.executable, GA, *ga_args(gemma_checkpoint, output), "--layer-type", "global"])
    assert done.returncode != 0
    assert "--layer-type 'global': this model's layers are of type(s) sliding_attention, full_attention" in done.stderr
    assert "Traceback" not in done.stderr
    assert not output.exists()  # nothing written, not even the run folder


def test_pi_and_uniform_rows_move_only_the_layers_a_layer_type_search_moves():
    """PI is the curve's mean over the moved layers, put on those layers: the held 1s would drag a
    Gemma-3 curve's mean towards 1 and its PI row would scale the sliding layers, which break."""
    from lpes_harness.evaluation.paired import lpes_methods, several_lpes_methods

    curve = [1.0, 3.0, 1.0, 2.0]
    methods = factors(lpes_methods(curve, [4.0], held_layers=(0, 2)))
    assert methods["PI"] == [1.0, 2.5, 1.0, 2.5] and methods["uniform 4"] == [1.0, 4.0, 1.0, 4.0]
    assert factors(lpes_methods(curve))["PI"] == [1.75] * 4  # no held layers: the paper's PI
    several = factors(several_lpes_methods({"a": curve, "b": [1.0, 1.5, 1.0, 2.5], "c": [1.0, 1.5, 1.0, 1.5]},
                                           uniform=[2.0], held_layers=(0, 2)))
    assert several["PI a"] == [1.0, 2.5, 1.0, 2.5] and several["PI b"] == [1.0, 2.0, 1.0, 2.0]
    # one factor on every moved layer is PI by another name: the row says so, whatever the held layers hold
    assert several["uniform 1.5 (PI) c"] == [1.0, 1.5, 1.0, 1.5] and "LPES c" not in several
    assert several["uniform 2"] == [1.0, 2.0, 1.0, 2.0] and several["LPES a"] == curve
    with pytest.raises(ValueError, match="nothing is left to scale"):
        lpes_methods(curve, held_layers=(0, 1, 2, 3))
    with pytest.raises(ValueError, match="not all among the curves' 4 layers"):
        several_lpes_methods({"a": curve}, held_layers=(4,))


def test_tuned_pi_and_the_paired_table_take_the_layer_type(gemma_checkpoint, tmp_path):
    """`python -m lpes_harness.commands.tune --uniform --layer-type` scores each scale on the global layers only, and the
    held-out command it suggests carries the flag; `commands.paired --layer-type` builds PI and
    uniform rows the same way and says so under its table."""
    from lpes_harness.core.scales_file import write_scales_file

    common = ["--pretrained", gemma_checkpoint, "--task", "kv_retrieval", "--metadata", '{"num_pairs": 3}',
              "--num-samples", "1", "--threads", "1"]
    tune = tmp_path / "pi"
    done = run([sys.executable, "-m", "lpes_harness.commands.tune", "--uniform", "2",
                "--layer-type", "full_attention", *common, "--dtype", "float32", "--output", str(tune)])
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tune / "tuning.json").read_text())
    assert saved["held_layers"] == [0, 2] and saved["use"].endswith('--uniform "2" --layer-type full_attention --output DIR')
    blocks = json.loads((tune / "scores.cache.json").read_text())["blocks"]
    assert any(key.startswith("[1.0, 2.0, 1.0, 2.0]@") for key in blocks), list(blocks)
    assert not any(key.startswith("[2.0, 2.0, 2.0, 2.0]@") for key in blocks)
    assert "layers 0, 2 stay at 1" in (tune / "tuning.md").read_text()

    curve = tmp_path / "curve.json"
    write_scales_file(curve, [1.0, 3.0, 1.0, 2.0])
    out = tmp_path / "paired"
    done = run([sys.executable, "-m", "lpes_harness.commands.paired", "--scales", str(curve), "--uniform", "2",
                "--layer-type", "full_attention", *common, "--dtype", "float32", "--output", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    methods = json.loads((out / "heldout.json").read_text())["scored"]["methods"]
    assert methods["PI"] == [1.0, 2.5, 1.0, 2.5] and methods["uniform 2"] == [1.0, 2.0, 1.0, 2.0]
    assert "PI and uniform rows scale only the full_attention layers" in (out / "heldout.md").read_text()

    bad = run([sys.executable, "-m", "lpes_harness.commands.paired", "--scales", str(curve),
               "--layer-type", "global", *common, "--output", str(tmp_path / "bad")])
    assert bad.returncode == 2 and "--layer-type 'global'" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_lpes_hf_layer_type_scales_one_type_and_its_pi_averages_over_it(gemma_checkpoint, tmp_path):
    """`layer_type=full_attention` through lm-eval's model args: a curve's PI row as a user runs it
    with plain lm_eval, the mean of the global layers on the global layers, the sliding ones at 1."""
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.core.scales_file import write_scales_file

    curve = tmp_path / "curve.json"
    write_scales_file(curve, [1.0, 3.0, 1.0, 2.0])
    common = dict(pretrained=gemma_checkpoint, device="cpu", dtype="float32")
    pi = LPESLM(**common, scales=str(curve), pi=True, layer_type="full_attention")
    assert pi.scales == pytest.approx([1.0, 2.5, 1.0, 2.5])
    assert LPESLM(**common, scales=str(curve), pi=True).scales == pytest.approx([1.75] * 4)  # the paper's PI
    assert LPESLM(**common, scales=2.0, layer_type="full_attention").scales == pytest.approx([1.0, 2.0, 1.0, 2.0])
    kept = LPESLM(**common, scales="1.5;3;1.5;2", layer_type="full_attention")  # a curve kept on one type
    assert kept.scales == pytest.approx([1.0, 3.0, 1.0, 2.0])
    from lpes_harness.core.scales_file import ScalesError

    with pytest.raises(ScalesError, match="layer_type='global': this model's layers are of type.s. "
                                          "sliding_attention, full_attention"):
        LPESLM(**common, scales=2.0, layer_type="global")


def test_a_base_scaling_search_records_its_scaling_and_resumes_only_as_one(gemma_checkpoint, tmp_path):
    """--scaling base: the factors multiply each layer's RoPE base; scales.json says so (lpes_hf applies it),
    the held-out cache says so, and the checkpoint refuses to resume as a position search."""
    from lpes_harness.lmeval.lpes_lm import LPESLM

    output = tmp_path / "base"
    args = ga_args(gemma_checkpoint, output, generations=1)
    args[args.index("--sweep") + 1] = "1,2"
    args[args.index("--heldout-samples") + 1] = "2"
    done = run([sys.executable, GA, *args, "--scaling", "base", "--y-max", "4"])
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads((output / "scales.json").read_text())
    assert written["scaling"] == "base"
    assert LPESLM(pretrained=gemma_checkpoint, scales=str(output / "scales.json"), device="cpu").scaling == "base"
    assert json.loads((output / "scores.cache.json").read_text())["identity"]["scaling"] == "base"
    again = run([sys.executable, GA, *args, "--resume", "--generations", "2", "--scaling", "position"])
    assert again.returncode != 0 and "scaling" in again.stderr, again.stderr[-2000:]
