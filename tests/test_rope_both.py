"""``scaling="both"``: layer h has a pair (p_h, b_h) and rotates with base b_h * theta at positions i / p_h.

The factors travel as one flat list, ``[p_0..p_{L-1}, b_0..b_{L-1}]``. All ones is the plain model
bit for bit, each half alone is its own scaling, and a pair is the model rebuilt with base b * theta
read at positions i / p. Also: the scales file, ``lpes_hf``'s arguments and the model's saved config.
"""

import json

import pytest
import torch
from test_rope import count_rotary_computations
from tiny_models import (
    ARCHITECTURES,
    GEMMA3_TYPES,
    assert_same_greedy_steps,
    logits,
    random_ids,
    save_tiny_checkpoint,
    tiny_family_model,
    tiny_gemma3,
    tiny_model,
)

from lpes_harness.core import rope
from lpes_harness.core.rope_anatomy import LPESError
from lpes_harness.core.scales_args import check_model_args, parse_scales_args
from lpes_harness.core.scales_file import ScalesError, ScalesFileError, read_scales_and_scaling, write_scales_file
from lpes_harness.core.scaling import SCALINGS

BOTH = SCALINGS["both"]

POSITIONS = [1.0, 1.7, 0.8, 2.5]  # one per tiny layer; a 1.0 layer and a < 1 layer
BASES = [1.0, 2.0, 8.0, 0.5]
PAIRS = BOTH.join([1.0, 1.7, 1.0, 0.8], [1.0, 1.0, 4.0, 2.0])  # (1, 1), position only, base only, both


def gemma3_twin(position: float, base: float):
    """Tiny Gemma-3 built with base x theta on each layer type, read at positions i / position (linear RoPE)."""
    rope_parameters = {kind: {"rope_type": "linear", "factor": position, "rope_theta": theta * base}
                       for kind, theta in (("sliding_attention", 1e4), ("full_attention", 1e6))}
    return tiny_family_model("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=16, sliding_window=8,
                             query_pre_attn_scalar=24, layer_types=GEMMA3_TYPES, rope_parameters=rope_parameters)


@pytest.mark.parametrize("arch", [*ARCHITECTURES, "gemma3"])
def test_all_ones_reproduces_logits_exactly(arch):
    model = tiny_gemma3() if arch == "gemma3" else tiny_model(arch)
    ids = random_ids(48)
    before = logits(model, ids)
    rope.install(model, BOTH.identity(4), scaling="both")
    assert torch.equal(logits(model, ids), before)
    rope.set_scales(model, PAIRS)
    rope.set_scales(model, [1.0] * 8)
    assert torch.equal(logits(model, ids), before)


@pytest.mark.parametrize("arch", [*ARCHITECTURES, "gemma3"])
def test_each_half_alone_is_its_own_scaling(arch):
    model = tiny_gemma3() if arch == "gemma3" else tiny_model(arch)
    ids = random_ids(40)
    rope.install(model, BOTH.join(POSITIONS, [1.0] * 4), scaling="both")
    positions_only = logits(model, ids)
    rope.set_scales(model, BOTH.join([1.0] * 4, BASES))
    bases_only = logits(model, ids)
    rope.remove(model)
    rope.install(model, POSITIONS)
    assert torch.equal(positions_only, logits(model, ids))
    rope.remove(model)
    rope.install(model, BASES, scaling="base")
    assert torch.equal(bases_only, logits(model, ids))


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("position, base", [(1.5, 2.0), (0.8, 0.5), (2.0, 8.0)])
def test_a_uniform_pair_is_the_model_rebuilt_with_that_base_read_at_scaled_positions(arch, position, base):
    model = tiny_model(arch)
    twin = tiny_model(arch, rope_parameters={"rope_type": "linear", "factor": position, "rope_theta": 1e4 * base})
    twin.load_state_dict(model.state_dict())
    ids = random_ids(64)
    vanilla = logits(model, ids)
    rope.install(model, [position] * 4 + [base] * 4, scaling="both")
    ours = logits(model, ids)
    torch.testing.assert_close(ours, logits(twin, ids), rtol=1e-4, atol=1e-4)
    assert (ours - vanilla).abs().max() > 1e-2


def test_gemma3_a_uniform_pair_keeps_each_layer_types_theta():
    model = tiny_gemma3()
    twin = gemma3_twin(1.5, 2.0)
    twin.load_state_dict(model.state_dict())
    ids = random_ids(40)
    rope.install(model, [1.5] * 4 + [2.0] * 4, scaling="both")
    torch.testing.assert_close(logits(model, ids), logits(twin, ids), rtol=1e-4, atol=1e-4)


def reference_forward(model, ids, pairs):
    """Per-layer RoPE without hooks: layer h gets cos/sin of (i / p_h) * (b_h * theta)^(-2j/d), in float64."""
    decoder = model.model
    hidden = decoder.embed_tokens(ids)
    length = ids.shape[1]
    positions = torch.arange(length).unsqueeze(0)
    causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
    dim = decoder.rotary_emb.inv_freq.shape[0] * 2
    for layer, (p, b) in zip(decoder.layers, pairs):
        inv_freq = 1.0 / (1e4 * b) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        freqs = (positions.double() / p)[..., None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        hidden = layer(hidden, attention_mask=causal, position_ids=positions,
                       position_embeddings=(emb.cos().float(), emb.sin().float()))
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    return model.lm_head(decoder.norm(hidden))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_mixed_pairs_match_an_independent_reference(arch):
    model = tiny_model(arch, attn_implementation="eager")
    ids = random_ids(40)
    rope.install(model, PAIRS, scaling="both")
    ours = logits(model, ids)
    rope.remove(model)
    with torch.no_grad():
        expected = reference_forward(model, ids, list(zip(*BOTH.halves(PAIRS))))
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_cached_generation_equals_full_recomputation():
    model = tiny_model("llama")
    rope.install(model, PAIRS, scaling="both")
    ids = random_ids(20)
    steps = dict(max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = model.generate(ids, use_cache=True, **steps)
        full = model.generate(ids, use_cache=False, **steps)
    assert_same_greedy_steps(cached.sequences, full.sequences, torch.stack(cached.logits), torch.stack(full.logits))


def test_pairs_with_base_1_share_one_rotary_computation(monkeypatch):
    model = tiny_model("llama")
    counts = count_rotary_computations(monkeypatch, model)
    rope.install(model, BOTH.join([1.5, 1.7, 1.0, 1.5], [1.0, 1.0, 2.0, 2.0]), scaling="both")
    counts["lpes"] = 0  # install's own check of the rotary output
    for _ in range(2):
        logits(model, random_ids(16))
    # Per forward: the model's call, and one stacked call for the position-only pairs (1.5, 1) and
    # (1.7, 1); the pairs with a base factor are computed from inv_freq, without the rotary module.
    assert counts == {"model": 2, "lpes": 2}


def test_refusals_name_the_problem_and_change_nothing():
    model = tiny_model("llama")
    with pytest.raises(LPESError, match="scaling='both' takes 2 factors per layer.*single number .1.5. is ambiguous"):
        rope.install(model, 1.5, scaling="both")
    with pytest.raises(LPESError, match="got 4 factors but scaling='both' takes 2 per decoder layer: the 4 position "
                                        "factors, then the 4 base factors .8 numbers."):
        rope.install(model, [1.0] * 4, scaling="both")
    with pytest.raises(LPESError, match="base factor for layer 2 is 0.0"):
        rope.install(model, [1.0] * 6 + [0.0, 1.0], scaling="both")
    assert not rope.is_installed(model)
    linear = tiny_model("llama", rope_parameters={"rope_type": "linear", "factor": 2.0})
    refused = "scaling='both' with a base factor other than 1: .*defined only for plain RoPE.*rope_type='linear'"
    with pytest.raises(LPESError, match=refused):
        rope.install(linear, [1.0] * 4 + [2.0] * 4, scaling="both")
    assert not rope.is_installed(linear)
    rope.install(linear, [1.5] * 4 + [1.0] * 4, scaling="both")  # position factors: any RoPE
    with pytest.raises(LPESError, match=refused):
        rope.set_scales(linear, [1.5] * 4 + [2.0] * 4)
    assert rope.get_scales(linear) == [1.5] * 4 + [1.0] * 4
    with pytest.raises(LPESError, match="installed on this model with scaling='both'"):
        rope.install(linear, 2.0)


def test_the_pair_is_saved_in_the_config_and_reloads(tmp_path):
    model = tiny_model("qwen2")
    rope.install(model, PAIRS, scaling="both")
    ids = random_ids(24)
    expected = logits(model, ids)
    assert (rope.get_scaling(model), rope.get_scales(model)) == ("both", PAIRS)
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    assert rope.saved_scales(reloaded.config) == PAIRS and rope.saved_scaling(reloaded.config) == "both"
    rope.install(reloaded, rope.saved_scales(reloaded.config), scaling=rope.saved_scaling(reloaded.config))
    torch.testing.assert_close(logits(reloaded, ids), expected)


# ----------------------------------------------------------------------------- the scales file


def test_a_both_file_holds_each_half_and_reads_back_as_one_list(tmp_path):
    path = tmp_path / "scales.json"
    write_scales_file(path, PAIRS, scaling="both", curve="bezier")
    document = json.loads(path.read_text())
    assert document["scales"] == [1.0, 1.7, 1.0, 0.8] and document["base_scales"] == [1.0, 1.0, 4.0, 2.0]
    assert document["num_layers"] == 4 and document["scaling"] == "both" and document["format"] == "lpes-scales/1"
    assert read_scales_and_scaling(path) == (PAIRS, "both")
    write_scales_file(path, POSITIONS)
    assert read_scales_and_scaling(path) == (POSITIONS, None)


@pytest.mark.parametrize("content, message", [
    ({"scales": [1.0, 2.0], "base_scales": [1.0, 2.0]}, "has 'base_scales' but its 'scaling' is 'position'"),
    ({"scales": [1.0, 2.0], "base_scales": [1.0, 2.0], "scaling": "base"}, "has 'base_scales' but its 'scaling' is 'base'"),
    ({"scales": [1.0, 2.0], "scaling": "both"}, "'scaling' is 'both' but the file has no 'base_scales' key"),
    ({"scales": [1.0, 2.0], "scaling": "both", "base_scales": "2"}, "has 'base_scales' a string"),
    ({"scales": [1.0, 2.0], "scaling": "both", "base_scales": [2.0]}, "'scales' has 2 position factors but 'base_scales' 1"),
    ({"scales": [1.0, 2.0], "scaling": "both", "base_scales": [2.0, -1]}, "base scale 1 is -1"),
    ({"scales": [1.0, 2.0], "scaling": "both", "base_scales": [2.0, 1.0], "num_layers": 4}, "'num_layers' is 4"),
])
def test_a_malformed_both_file_is_named_in_one_line(tmp_path, content, message):
    path = tmp_path / "scales.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ScalesFileError) as caught:
        read_scales_and_scaling(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


# ----------------------------------------------------------------------------- lpes_hf's arguments


def test_lpes_hf_arguments_of_scaling_both():
    two_l = ";".join(f"{v:g}" for v in PAIRS)
    assert parse_scales_args(scales=two_l, scaling="both").layer_scales(4) == PAIRS
    with pytest.raises(ScalesError, match="scales='1.2' with scaling=both is ambiguous.*2L numbers"):
        parse_scales_args(scales="1.2", scaling="both")
    with pytest.raises(ScalesError, match="gives 4 factors but scaling=both takes 2 per decoder layer: this model has "
                                          "4, so 8 numbers, the 4 position factors then the 4 base factors"):
        parse_scales_args(scales="1;1.2;1.4;1.6", scaling="both").layer_scales(4)
    with pytest.raises(ScalesError, match="control_points=.* make one curve, and scaling=both takes two"):
        parse_scales_args(control_points="0:1;3:2", scaling="both")
    with pytest.raises(ScalesError, match="scaling='bath' is not understood; accepted: position .*, base .*, both"):
        parse_scales_args(scales=two_l, scaling="bath")


def test_pi_and_layer_type_act_on_each_half():
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    scales = "1;2;1;3;2;4;2;6"  # positions 1, 2, 1, 3; bases 2, 4, 2, 6
    pi = parse_scales_args(scales=scales, scaling="both", pi="true")
    assert pi.layer_scales(4) == pytest.approx([1.75] * 4 + [3.5] * 4)
    on_full = parse_scales_args(scales=scales, scaling="both", pi="true", layer_type="full_attention")
    assert on_full.layer_scales(4, layer_types=types) == pytest.approx([1, 2.5, 1, 2.5, 1, 5, 1, 5])
    kept = parse_scales_args(scales=scales, scaling="both", layer_type="full_attention")
    assert kept.layer_scales(4, layer_types=types) == [1, 2, 1, 3, 1, 4, 1, 6]


def test_a_both_file_brings_its_scaling_and_the_start_up_check_reads_saved_pairs(tmp_path):
    path = tmp_path / "scales.json"
    write_scales_file(path, PAIRS, scaling="both")
    parsed = parse_scales_args(scales=str(path))
    assert parsed.scaling == "both" and parsed.layer_scales(4) == PAIRS
    with pytest.raises(ScalesError, match="scaling='position' but .* holds factors of scaling 'both'"):
        parse_scales_args(scales=str(path), scaling="position")
    with pytest.raises(ScalesError, match="gives 8 factors but scaling=both takes 2 per decoder layer: this model has 6"):
        parse_scales_args(scales=str(path)).layer_scales(6)
    # A model saved with pairs: pi=true alone averages each half, before any weight loads.
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "lpes_scales": PAIRS,
                                                      "lpes_scaling": "both"}))
    check_model_args({"pretrained": str(tmp_path), "pi": True})
    with pytest.raises(ScalesError, match="gives 8 factors but scaling=both .* this model has 3"):
        parsed.layer_scales(3)


def test_lpes_hf_applies_a_both_file_and_2l_numbers(tmp_path):
    from lpes_harness.lmeval.lpes_lm import LPESLM

    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", "llama")
    path = tmp_path / "scales.json"
    write_scales_file(path, PAIRS, scaling="both")
    lm = LPESLM(pretrained=checkpoint, scales=str(path), device="cpu")
    assert (lm.scaling, lm.scales) == ("both", PAIRS)
    assert lm.get_model_info()["lpes_scaling"] == "both"
    lm = LPESLM(pretrained=checkpoint, scales=";".join(map(str, PAIRS)), scaling="both", pi=True, device="cpu")
    assert lm.scales == pytest.approx([1.125] * 4 + [2.0] * 4)
    lm = LPESLM(pretrained=checkpoint, scaling="both", device="cpu")  # nothing given: the identity, as pairs
    assert lm.scales == [1.0] * 8
