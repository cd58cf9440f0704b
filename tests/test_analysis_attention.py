"""Attention to the middle: the hook-computed last-token row equals the model's own attention."""

import pytest
import torch
from tiny_models import random_ids, tiny_model

from lpes_harness.core import rope
from lpes_harness.commands import attention
from lpes_harness.evaluation import middle_attention


def _eager_last_rows(model, ids):
    with torch.no_grad():
        output = model(input_ids=ids, output_attentions=True, use_cache=False)
    return [layer[0, :, -1, :] for layer in output.attentions]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_hook_row_matches_eager_attention_with_and_without_lpes(arch, scale):
    # Reference: the same weights run with eager attention, which returns full matrices.
    model = tiny_model(arch, attn_implementation="eager")
    ids = random_ids(60)
    rope.install(model, scale)
    expected = _eager_last_rows(model, ids)
    recorder = middle_attention.LastRowRecorder(model)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    recorder.remove()
    rope.remove(model)
    assert len(recorder.rows) == len(expected)
    for layer, row in recorder.rows.items():
        torch.testing.assert_close(row, expected[layer].float(), atol=1e-5, rtol=1e-4)


def test_middle_mass_is_the_share_on_the_middle_third():
    model = tiny_model("llama", attn_implementation="eager")
    ids = random_ids(61)
    start, end = middle_attention.middle_third(61)
    assert (start, end) == (20, 40)
    expected = [float(row[:, start:end].sum(-1).mean()) for row in _eager_last_rows(model, ids)]
    assert middle_attention.middle_mass(model, ids) == pytest.approx(expected, abs=1e-5)


def test_run_compares_uniform_scales_and_leaves_model_clean():
    model = tiny_model("llama")  # SDPA: the analysis must not need eager attention
    inputs = [random_ids(48, seed=s) for s in (1, 2)]
    results = middle_attention.run(model, inputs, [1.0, 4.0])
    assert not rope.is_installed(model)
    assert set(results["scales"]) == {"1.0", "4.0"}
    vanilla, scaled = results["scales"]["1.0"]["mean"], results["scales"]["4.0"]["mean"]
    assert len(vanilla) == 4 and all(0.0 <= v <= 1.0 for v in vanilla + scaled)
    assert vanilla != pytest.approx(scaled)  # scaling positions changes where the last token looks


def test_scale_list_errors_name_the_input():
    assert attention.parse_scale_list("1, 1.5;2") == [1.0, 1.5, 2.0]
    with pytest.raises(ValueError, match="'1,x'"):
        attention.parse_scale_list("1,x")
