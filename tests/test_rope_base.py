"""``scaling="base"``: layer h rotates with RoPE base s_h * theta (its layer type's theta), at the true positions.

All factors 1 reproducing the logits exactly is test_rope.py's test, for both scalings."""

import pytest
import torch
from tiny_models import ARCHITECTURES, assert_same_greedy_steps, logits, random_ids, tiny_gemma3, tiny_model

from lpes_harness.core import rope
from lpes_harness.core.rope_anatomy import LPESError


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("factor", [0.5, 2.0, 8.0])
def test_uniform_factor_equals_the_model_built_with_that_base(arch, factor):
    model = tiny_model(arch)
    rebased = tiny_model(arch, rope_parameters={"rope_theta": 10000.0 * factor})
    rebased.load_state_dict(model.state_dict())
    ids = random_ids(64)
    vanilla = logits(model, ids)
    rope.install(model, factor, scaling="base")
    ours = logits(model, ids)
    torch.testing.assert_close(ours, logits(rebased, ids), rtol=1e-4, atol=1e-4)
    assert (ours - vanilla).abs().max() > 1e-2, "the base factor must actually change the logits"


def test_a_base_factor_is_not_a_position_scale():
    """Position scale s slows every frequency by s; base factor s leaves the fastest as it is."""
    model = tiny_model("llama")
    ids = random_ids(64)
    rope.install(model, 4.0, scaling="base")
    by_base = logits(model, ids)
    rope.remove(model)
    rope.install(model, 4.0)
    assert (logits(model, ids) - by_base).abs().max() > 1e-2


def test_gemma3_each_layer_type_keeps_its_own_theta():
    """Uniform factor 1.7 on Gemma-3 = the model built with 1.7 x 10k on sliding and 1.7 x 1M on full layers."""
    model = tiny_gemma3()
    twin = tiny_gemma3(theta_factor=1.7)
    twin.load_state_dict(model.state_dict())
    ids = random_ids(40)
    rope.install(model, 1.7, scaling="base")
    torch.testing.assert_close(logits(model, ids), logits(twin, ids), rtol=1e-4, atol=1e-4)


def test_per_layer_factors_touch_only_their_layer():
    """Factor on one layer only: equal to the model built with that base, whose other layers' RoPE is unchanged.

    Layers 0 and 2 of the tiny Gemma-3 are sliding; scaling layer 1 (full) by 1.7 matches the twin whose
    full layers have 1.7x theta only when layer 3 (also full) is scaled too; so compare [1, 1.7, 1, 1.7].
    """
    model = tiny_gemma3()
    twin = tiny_gemma3()
    twin.load_state_dict(model.state_dict())
    twin.config.rope_parameters["full_attention"]["rope_theta"] *= 1.7
    twin.model.rotary_emb = type(twin.model.rotary_emb)(twin.config)
    ids = random_ids(40)
    rope.install(model, [1.0, 1.7, 1.0, 1.7], scaling="base")
    torch.testing.assert_close(logits(model, ids), logits(twin, ids), rtol=1e-4, atol=1e-4)
    rope.set_scales(model, [1.0, 1.7, 1.0, 1.0])
    assert (logits(model, ids) - logits(twin, ids)).abs().max() > 1e-3


def test_cached_generation_equals_full_recomputation():
    model = tiny_model("llama")
    rope.install(model, [1.0, 2.0, 4.0, 0.5], scaling="base")
    ids = random_ids(20)
    steps = dict(max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = model.generate(ids, use_cache=True, **steps)
        full = model.generate(ids, use_cache=False, **steps)
    assert_same_greedy_steps(cached.sequences, full.sequences, torch.stack(cached.logits), torch.stack(full.logits))


def test_scaling_is_saved_in_the_config_and_removed_with_the_hooks():
    model = tiny_model("llama")
    rope.install(model, 2.0, scaling="base")
    assert rope.get_scaling(model) == "base"
    assert rope.saved_scaling(model.config) == "base"
    rope.remove(model)
    assert rope.saved_scaling(model.config) == "position"
    assert not hasattr(model.config, rope.CONFIG_SCALING_KEY)


def test_refusals_install_nothing():
    model = tiny_model("llama")
    with pytest.raises(LPESError, match="scaling='bass' is not one of position, base"):
        rope.install(model, 2.0, scaling="bass")
    linear = tiny_model("llama", rope_parameters={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(LPESError, match="scaling='base'.*defined only for plain RoPE.*rope_type='linear'"):
        rope.install(linear, 2.0, scaling="base")
    assert not rope.is_installed(linear)
    rope.install(model, 2.0)
    with pytest.raises(LPESError, match="installed on this model with scaling='position'"):
        rope.install(model, 2.0, scaling="base")
