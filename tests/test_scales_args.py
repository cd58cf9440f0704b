"""lpes_hf's scale arguments are checked without the model: parsing, the layer count from the
config or GGUF header, and the same check from Python's ``simple_evaluate``."""

import json

import pytest

from lpes_harness.core import rope
from lpes_harness.core.models import BUNDLED_GGUF, bundled_model_dir
from lpes_harness.core.scales_args import check_model_args, parse_scales_args
from lpes_harness.core.scales_file import SAVED_SCALES_KEY, ScalesError, gguf_block_count, model_layer_info, read_scales_file


def test_the_bundled_gguf_header_gives_30_layers():
    assert gguf_block_count(f"{bundled_model_dir()}/{BUNDLED_GGUF}") == 30
    info = model_layer_info()  # the default model is the bundled one
    assert info["num_layers"] == 30 and info["saved_scales"] is None


def test_a_config_without_weights_gives_the_layer_count_and_saved_scales(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4, SAVED_SCALES_KEY: [1.0, 1.2, 1.4, 1.6]}))
    assert model_layer_info(str(tmp_path)) == {
        "num_layers": 4, "saved_scales": [1.0, 1.2, 1.4, 1.6], "saved_scaling": None,
        "source": str(tmp_path / "config.json")}
    # pi alone averages the saved scales: not an error for such a model.
    check_model_args({"pretrained": str(tmp_path), "pi": True})
    nested = tmp_path / "nested"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 6}}))
    assert model_layer_info(str(nested))["num_layers"] == 6


@pytest.mark.parametrize("pretrained", ["/nonexistent/model/dir", "some-org/not-in-the-cache", "/nonexistent/model.gguf"])
def test_an_unknown_model_defers_the_count_to_the_load(pretrained):
    assert model_layer_info(pretrained) is None
    check_model_args({"pretrained": pretrained, "scales": "1;1;1"})  # nothing to compare with yet


def test_the_saved_scales_key_is_ropes():
    assert SAVED_SCALES_KEY == rope.CONFIG_KEY


def test_parsed_arguments_and_their_layer_scales():
    args = parse_scales_args(control_points="0:1.5;3:1.0", curve="linear", pi="true")
    assert args.control_points == [(0.0, 1.5), (3.0, 1.0)] and args.curve == "linear" and args.pi
    assert args.layer_scales(4) == pytest.approx([1.25] * 4)
    assert parse_scales_args(scales=2).layer_scales(3) == [2.0] * 3
    assert parse_scales_args().layer_scales(3) is None
    with pytest.raises(ScalesError, match="pi=true has nothing to average"):
        parse_scales_args(pi=True).layer_scales(3)


def test_layer_type_keeps_the_scales_on_that_type_and_pi_averages_over_it():
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    pi = parse_scales_args(scales="1.5;3;1.5;2", pi=True, layer_type="full_attention")
    assert pi.layer_scales(4, layer_types=types) == pytest.approx([1.0, 2.5, 1.0, 2.5])
    assert pi.layer_scales(4) == pytest.approx([2.0] * 4)  # before the load: the types are not known yet
    assert parse_scales_args(scales=2, layer_type="full_attention").layer_scales(4, layer_types=types) == [1.0, 2.0, 1.0, 2.0]
    with pytest.raises(ScalesError, match="layer_type='global': this model's layers are of type.s. sliding_attention, full_attention"):
        parse_scales_args(scales=2, layer_type="global").layer_scales(4, layer_types=types)
    with pytest.raises(ScalesError, match="layer_type='full_attention' restricts .* and none is given"):
        parse_scales_args(layer_type="full_attention")
    with pytest.raises(ScalesError, match="layer_type='' is not an attention type"):
        parse_scales_args(scales=2, layer_type="")


@pytest.mark.parametrize("content, message", [
    ({"scales": {"a": 1}}, "has 'scales' an object"),
    ({"scales": "1.2"}, "has 'scales' a string"),
    ({"scales": None}, "has 'scales' null"),
    (True, "holds a boolean (true)"),
    ({"scales": [1.0, True]}, "scale 1 is True"),
    ({"scales": [1.0, 2.0], "num_layers": "two"}, "'num_layers' is 'two' but 'scales' has 2 entries"),
])
def test_a_malformed_scales_file_is_a_clear_error_not_a_type_error(tmp_path, content, message):
    path = tmp_path / "scales.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ScalesError) as caught:
        read_scales_file(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


def test_simple_evaluate_from_python_raises_before_the_model_loads(monkeypatch):
    """Before the load, not merely soon: HFLM's constructor, which loads the model, is never entered (how long
    the check takes is benchmarks' business, not a unit test's)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    loads = []

    def load(self, *args, **kwargs):
        loads.append(kwargs)
        raise RuntimeError("HFLM.__init__ reached: the model would load before the check")

    monkeypatch.setattr(HFLM, "__init__", load)
    with pytest.raises(ScalesError, match="scales=-1: the scale must be a finite number > 0"):
        lm_eval.simple_evaluate(model="lpes_hf", model_args="scales=-1", tasks=["kv_retrieval_pos0"], limit=1)
    with pytest.raises(ScalesError, match="gives 2 scales but the model has 30 decoder layers"):
        lm_eval.simple_evaluate(model="lpes_hf", model_args={"scales": [1.0, 1.1]}, tasks=["kv_retrieval_pos0"])
    assert loads == []
    # The hook sees HFLM's constructor: the model's own arguments reach it once the checks pass.
    with pytest.raises(RuntimeError, match="HFLM.__init__ reached"):
        lm_eval.simple_evaluate(model="lpes_hf", model_args="scales=1.2", tasks=["kv_retrieval_pos0"], limit=1)
    assert len(loads) == 1
