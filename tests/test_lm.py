"""`lpes_hf`: argument forms, save/load, and registration with lm-eval (tiny local checkpoints)."""

import json
import subprocess
import sys

import pytest
from lm_eval.api.instance import Instance
from tiny_models import save_tiny_checkpoint

from lpes_harness.core import curves, rope
from lpes_harness.lmeval.lpes_lm import LPESLM
from lpes_harness.core.scales_args import parse_scales
from lpes_harness.core.scales_file import ScalesError, ScalesFileError, write_scales_file

REQUESTS = [("The quick brown", " fox jumps"), ("Lost in the", " middle of it"), ("abc", "def")]


def loglikelihoods(lm):
    instances = [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(REQUESTS)]
    return [ll for ll, _ in lm.loglikelihood(instances, disable_tqdm=True)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"), "llama")


def test_scale_one_is_vanilla_hflm_and_other_scales_differ(checkpoint):
    from lm_eval.models.huggingface import HFLM

    vanilla = loglikelihoods(HFLM(pretrained=checkpoint, device="cpu"))
    assert loglikelihoods(LPESLM(pretrained=checkpoint, scales=1.0, device="cpu")) == vanilla
    scaled = loglikelihoods(LPESLM(pretrained=checkpoint, scales=2.0, device="cpu"))
    assert scaled != pytest.approx(vanilla, abs=1e-3)


def test_scales_forms_number_list_and_file(checkpoint, tmp_path):
    assert LPESLM(pretrained=checkpoint, scales="1.5", device="cpu").scales == [1.5] * 4
    listed = LPESLM(pretrained=checkpoint, scales="1.0;1.2;1.4;1.6", device="cpu")
    assert listed.scales == [1.0, 1.2, 1.4, 1.6]
    path = tmp_path / "scales.json"
    write_scales_file(path, [1.1, 1.3, 0.9, 1.0], curve="bezier")
    from_file = LPESLM(pretrained=checkpoint, scales=str(path), device="cpu")
    assert from_file.scales == [1.1, 1.3, 0.9, 1.0]
    assert json.loads(path.read_text())["format"] == "lpes-scales/1"


def test_device_defaults_to_what_the_machine_has(checkpoint):
    import torch

    lm = LPESLM(pretrained=checkpoint, scales=1.5)
    assert lm.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_pi_uses_the_mean_of_the_scales(checkpoint):
    lm = LPESLM(pretrained=checkpoint, scales="1.0;1.2;1.4;1.6", pi=True, device="cpu")
    assert lm.scales == pytest.approx([1.3] * 4)


@pytest.mark.parametrize("curve", ["bezier", "linear", "step"])
def test_control_points_follow_the_curve(checkpoint, curve):
    lm = LPESLM(pretrained=checkpoint, control_points="0:1.5;1:1.2;3:1.8", curve=curve, device="cpu")
    assert lm.scales == pytest.approx(curves.curve_scales([(0, 1.5), (1, 1.2), (3, 1.8)], 4, curve=curve))


def test_saved_model_reloads_with_its_scales(checkpoint, tmp_path):
    lm = LPESLM(pretrained=checkpoint, scales="1.0;1.7;0.8;2.5", device="cpu")
    expected = loglikelihoods(lm)
    lm.save_pretrained(str(tmp_path / "saved"))
    assert json.loads((tmp_path / "saved" / "config.json").read_text())[rope.CONFIG_KEY] == [1.0, 1.7, 0.8, 2.5]
    reloaded = LPESLM(pretrained=str(tmp_path / "saved"), device="cpu")
    assert reloaded.scales == [1.0, 1.7, 0.8, 2.5]
    assert loglikelihoods(reloaded) == pytest.approx(expected, abs=1e-5)


def test_set_scales_in_place_matches_a_fresh_model(checkpoint):
    lm = LPESLM(pretrained=checkpoint, device="cpu")
    model_id = id(lm.model)
    lm.set_scales([1.0, 1.7, 0.8, 2.5])
    assert id(lm.model) == model_id
    fresh = LPESLM(pretrained=checkpoint, scales="1.0;1.7;0.8;2.5", device="cpu")
    assert loglikelihoods(lm) == pytest.approx(loglikelihoods(fresh), abs=1e-6)


def test_bad_scales_fail_before_the_model_loads(tmp_path):
    # No checkpoint exists at this path: the scales error must come first.
    missing_model = str(tmp_path / "no_model_here")
    with pytest.raises(ScalesError, match="scales='fast' is not understood"):
        LPESLM(pretrained=missing_model, scales="fast")
    with pytest.raises(ScalesFileError, match="scales=nowhere/scales.json: scales file not found"):
        LPESLM(pretrained=missing_model, scales="nowhere/scales.json")
    with pytest.raises(ScalesError, match="both given; give either, not both"):
        LPESLM(pretrained=missing_model, scales=1.2, control_points="0:1;3:1")
    with pytest.raises(ScalesError, match="curve='spline' is not a curve; accepted: bezier, linear, step"):
        LPESLM(pretrained=missing_model, control_points="0:1;3:1", curve="spline")
    with pytest.raises(ScalesError, match="control_points='0:1;3:1;2:1': control point 2"):
        LPESLM(pretrained=missing_model, control_points="0:1;3:1;2:1")
    with pytest.raises(ScalesError, match="pi=maybe|pi='maybe' is not allowed; give true or false"):
        LPESLM(pretrained=missing_model, scales=1.2, pi="maybe")


def test_wrong_scale_count_names_both_numbers(checkpoint):
    with pytest.raises(ScalesError, match="scales='1;1;1' gives 3 scales but the model has 4 decoder layers"):
        LPESLM(pretrained=checkpoint, scales="1;1;1", device="cpu")


def test_pi_alone_averages_the_saved_scales_and_is_an_error_without_any(checkpoint, tmp_path):
    with pytest.raises(ScalesError, match="pi=true has nothing to average"):
        LPESLM(pretrained=checkpoint, pi=True, device="cpu")
    LPESLM(pretrained=checkpoint, scales="1.0;1.2;1.4;1.6", device="cpu").save_pretrained(str(tmp_path / "saved"))
    assert LPESLM(pretrained=str(tmp_path / "saved"), pi=True, device="cpu").scales == pytest.approx([1.3] * 4)


def test_malformed_scales_file_reports_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"scales": [1.0,\n 1.2,,]}')
    with pytest.raises(ScalesFileError, match=r"bad.json:2"):
        parse_scales(str(path))


def test_start_up_hook_registers_lpes_hf_without_importing_torch():
    code = (
        "import sys; assert 'torch' not in sys.modules and 'lm_eval' not in sys.modules, 'heavy import at start-up';"
        "from lm_eval.api.registry import get_model; print(get_model('lpes_hf').__module__, get_model('hf').__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # lm-eval's own models must stay available next to ours.
    assert out.stdout.strip() == "lpes_harness.lmeval.lpes_lm HFLM"


def test_position_tasks_are_found_without_include_path():
    code = (
        "from lm_eval.tasks import TaskManager; tm = TaskManager();"
        "print(' '.join(t for t in ('kv_retrieval', 'kv_retrieval_pos40', 'mdqa', 'mdqa_pos50') if t in tm.all_tasks))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["kv_retrieval", "kv_retrieval_pos40", "mdqa", "mdqa_pos50"]


def test_scaling_base_multiplies_the_rope_base(checkpoint, tmp_path):
    """``scaling=base``: factor 2 on every layer is the checkpoint rebuilt with twice its theta."""
    from lm_eval.models.huggingface import HFLM

    config_path = tmp_path / "twice_theta"
    import shutil

    shutil.copytree(checkpoint, config_path)
    config = json.loads((config_path / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] *= 2
    (config_path / "config.json").write_text(json.dumps(config))
    twice = loglikelihoods(HFLM(pretrained=str(config_path), device="cpu"))
    based = LPESLM(pretrained=checkpoint, scales=2.0, scaling="base", device="cpu")
    assert based.scaling == "base" and based.get_model_info()["lpes_scaling"] == "base"
    assert loglikelihoods(based) == pytest.approx(twice, abs=1e-4)
    assert loglikelihoods(LPESLM(pretrained=checkpoint, scales=2.0, device="cpu")) != pytest.approx(twice, abs=1e-3)


def test_a_scales_file_says_what_its_factors_scale(checkpoint, tmp_path):
    path = tmp_path / "scales.json"
    write_scales_file(path, [1.0, 2.0, 2.0, 4.0], scaling="base")
    assert LPESLM(pretrained=checkpoint, scales=str(path), device="cpu").scaling == "base"
    assert LPESLM(pretrained=checkpoint, scales=str(path), scaling="base", pi=True, device="cpu").scales == [2.25] * 4
    with pytest.raises(ScalesError, match="scaling='position' but scales=.* holds factors of scaling 'base'"):
        LPESLM(pretrained=checkpoint, scales=str(path), scaling="position", device="cpu")
    plain = tmp_path / "plain.json"
    write_scales_file(plain, [1.0, 2.0, 2.0, 4.0])  # no scaling key: positions, as every file before it
    assert LPESLM(pretrained=checkpoint, scales=str(plain), device="cpu").scaling == "position"
    bad = tmp_path / "bad.json"
    write_scales_file(bad, [1.0, 2.0, 2.0, 4.0], scaling="theta")
    with pytest.raises(ScalesFileError, match="'scaling' is 'theta'; accepted: position, base"):
        LPESLM(pretrained=checkpoint, scales=str(bad), device="cpu")
    with pytest.raises(ScalesError, match="scaling='ntk' is not understood; accepted: position"):
        LPESLM(pretrained=checkpoint, scales=2.0, scaling="ntk", device="cpu")


def test_saved_base_scales_load_with_their_scaling(checkpoint, tmp_path):
    lm = LPESLM(pretrained=checkpoint, scales="1;2;2;4", scaling="base", device="cpu")
    expected = loglikelihoods(lm)
    lm.save_pretrained(str(tmp_path / "saved"))
    reloaded = LPESLM(pretrained=str(tmp_path / "saved"), device="cpu")
    assert (reloaded.scales, reloaded.scaling) == ([1.0, 2.0, 2.0, 4.0], "base")
    assert loglikelihoods(reloaded) == pytest.approx(expected, abs=1e-6)
