"""commands.layer_types: a curve by attention type, and the one-type ablation files (tiny configs, no weights)."""

import json

import pytest
from transformers import Gemma3TextConfig, LlamaConfig

from lpes_harness.evaluation import layer_types as lt
from lpes_harness.commands import layer_types as layer_types_command


@pytest.fixture
def gemma_dir(tmp_path):
    # Six layers, one global layer in every six (Gemma-3's pattern): layer 5 is full attention.
    config = Gemma3TextConfig(num_hidden_layers=6, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=8, vocab_size=64, sliding_window=8)
    config.save_pretrained(tmp_path / "gemma")
    return tmp_path / "gemma"


def test_a_gemma3_config_names_its_sliding_and_global_layers(gemma_dir):
    assert lt.model_layer_types(str(gemma_dir)) == ["sliding_attention"] * 5 + ["full_attention"]


def test_a_model_without_layer_types_is_full_attention_everywhere(tmp_path):
    LlamaConfig(num_hidden_layers=3, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                vocab_size=64).save_pretrained(tmp_path / "llama")
    assert lt.model_layer_types(str(tmp_path / "llama")) == ["full_attention"] * 3


def test_by_type_and_the_ablation_keep_each_layer_where_it_belongs():
    types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    scales = [0.5, 0.7, 1.4, 0.9]
    summary = lt.by_type(scales, types)
    assert summary["full_attention"]["layers"] == [2] and summary["full_attention"]["mean"] == pytest.approx(1.4)
    assert summary["sliding_attention"]["mean"] == pytest.approx(0.7)
    assert summary["sliding_attention"]["mean_abs_change"] == pytest.approx((0.5 + 0.3 + 0.1) / 3)
    assert lt.kept_on(scales, types, "full_attention") == [1.0, 1.0, 1.4, 1.0]
    assert lt.kept_on(scales, types, "sliding_attention") == [0.5, 0.7, 1.0, 0.9]
    with pytest.raises(ValueError, match="3 layers, the model 4"):
        lt.by_type(scales[:3], types)


def test_the_command_writes_the_report_and_one_scales_file_per_type(gemma_dir, tmp_path, capsys):
    scales = tmp_path / "scales.json"
    scales.write_text(json.dumps([0.5, 0.6, 0.7, 0.8, 0.9, 1.5]))
    out = tmp_path / "report"
    assert layer_types_command.main(["--scales", str(scales), "--pretrained", str(gemma_dir), "--output", str(out)]) == 0
    only_full = json.loads((out / "only_full_attention.json").read_text())
    assert only_full["scales"] == [1.0] * 5 + [1.5]
    assert json.loads((out / "only_sliding_attention.json").read_text())["scales"] == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    report = json.loads((out / "layer_types.json").read_text())
    assert report["by_type"]["full_attention"]["layers"] == [5]
    assert (out / "layer_types.png").stat().st_size > 0
    assert "| full_attention | 5 | 1.500 |" in capsys.readouterr().out
    assert only_full["scaling"] == "position"


def test_the_ablation_files_of_a_base_curve_stay_base(gemma_dir, tmp_path):
    from lpes_harness.core.scales_file import write_scales_file

    scales = tmp_path / "scales.json"
    write_scales_file(scales, [2.0, 2.0, 2.0, 2.0, 2.0, 1.5], scaling="base")
    out = tmp_path / "report"
    assert layer_types_command.main(["--scales", str(scales), "--pretrained", str(gemma_dir), "--output", str(out)]) == 0
    for kind in ("full_attention", "sliding_attention"):
        assert json.loads((out / f"only_{kind}.json").read_text())["scaling"] == "base"


def test_scales_for_another_model_stop_with_one_line_and_write_nothing(gemma_dir, tmp_path):
    scales = tmp_path / "scales.json"
    scales.write_text(json.dumps([1.0] * 30))
    out = tmp_path / "report"
    with pytest.raises(SystemExit, match="30 layers, the model 6"):
        layer_types_command.main(["--scales", str(scales), "--pretrained", str(gemma_dir), "--output", str(out)])
    assert not out.exists()
