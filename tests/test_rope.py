"""The paper's claims about layer-specific position scaling, on tiny Llama/Qwen2/Mistral (and Gemma-3,
dynamic NTK, LongRoPE for the mechanism; every family is in test_families.py)."""

import math

import pytest
import torch
from test_families import BY_NAME, LENGTH, build, reference_logits
from tiny_models import (ARCHITECTURES, assert_same_greedy_steps, cached_and_recomputed_greedy, logits, random_ids,
                         tiny_gemma3_multimodal, tiny_model)
from transformers import GPT2Config, GPT2LMHeadModel

from lpes_harness.core import rope, rope_anatomy

MIXED = [1.0, 1.7, 0.8, 2.5]  # one per tiny layer; includes a 1.0 layer and a < 1 layer


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("scaling", ["position", "base"])
def test_all_scales_one_reproduces_logits_exactly(arch, scaling):
    model = tiny_model(arch)
    ids = random_ids(48)
    before = logits(model, ids)
    rope.install(model, [1.0] * 4, scaling=scaling)
    assert torch.equal(logits(model, ids), before)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("scale", [0.8, 1.5, 2.0])
def test_uniform_scale_equals_transformers_linear_rope(arch, scale):
    lpes_model = tiny_model(arch)
    linear_model = tiny_model(arch, rope_parameters={"rope_type": "linear", "factor": scale})
    linear_model.load_state_dict(lpes_model.state_dict())
    ids = random_ids(64)
    vanilla = logits(lpes_model, ids)
    rope.install(lpes_model, scale)
    ours = logits(lpes_model, ids)
    theirs = logits(linear_model, ids)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert (ours - vanilla).abs().max() > 1e-2, "the scale must actually change the logits"


def reference_forward(model, ids, scales):
    """Independent per-layer RoPE: run the decoder layer by layer, each with its own (cos, sin).

    Uses no hooks: positions are divided explicitly before the model's rotary function.
    """
    decoder = model.model
    hidden = decoder.embed_tokens(ids)
    length = ids.shape[1]
    positions = torch.arange(length).unsqueeze(0)
    causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
    for layer, scale in zip(decoder.layers, scales):
        freqs = (positions.double() / scale)[..., None] * decoder.rotary_emb.inv_freq.double()
        emb = torch.cat((freqs, freqs), dim=-1)
        cos_sin = (emb.cos().float(), emb.sin().float())
        hidden = layer(hidden, attention_mask=causal, position_ids=positions, position_embeddings=cos_sin)
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    return model.lm_head(decoder.norm(hidden))


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_mixed_scales_match_independent_reference(arch, attn):
    model = tiny_model(arch, attn_implementation=attn)
    ids = random_ids(40)
    rope.install(model, MIXED)
    ours = logits(model, ids)
    rope.remove(model)
    with torch.no_grad():
        expected = reference_forward(model, ids, MIXED)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_eager_and_sdpa_agree_under_lpes(arch):
    eager = tiny_model(arch, attn_implementation="eager")
    sdpa = tiny_model(arch, attn_implementation="sdpa")
    ids = random_ids(40)
    rope.install(eager, MIXED)
    rope.install(sdpa, MIXED)
    torch.testing.assert_close(logits(eager, ids), logits(sdpa, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cached_generation_equals_full_recomputation(arch):
    model = tiny_model(arch)
    rope.install(model, MIXED)
    assert_same_greedy_steps(*cached_and_recomputed_greedy(model, random_ids(20)))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_left_padded_batch_equals_each_row_alone(arch):
    model = tiny_model(arch)
    rope.install(model, MIXED)
    long_row, short_row = random_ids(30, seed=2)[0], random_ids(18, seed=3)[0]
    pad = 12
    batch = torch.stack([long_row, torch.cat([torch.zeros(pad, dtype=torch.long), short_row])])
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0
    with torch.no_grad():
        batched = model.generate(batch, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
        alone_long = model.generate(long_row[None], max_new_tokens=8, do_sample=False, pad_token_id=0)
        alone_short = model.generate(short_row[None], max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(batched[0, 30:], alone_long[0, 30:])
    assert torch.equal(batched[1, 30:], alone_short[0, 18:])
    # And the prefill logits of the padded row match the row run alone.
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    padded_logits = logits(model, batch, attention_mask=mask, position_ids=position_ids)[1, pad:]
    torch.testing.assert_close(padded_logits, logits(model, short_row[None])[0], rtol=1e-4, atol=1e-4)


def test_set_scales_in_place_and_remove_restores_exactly():
    model = tiny_model("llama")
    ids = random_ids(32)
    vanilla = logits(model, ids)
    rope.install(model, 1.5)
    hooks_after_install = len(model.model.layers[0]._forward_pre_hooks)
    first = logits(model, ids)
    rope.set_scales(model, MIXED)
    second = logits(model, ids)
    assert not torch.allclose(first, second)
    assert rope.get_scales(model) == MIXED
    assert len(model.model.layers[0]._forward_pre_hooks) == hooks_after_install, "no re-install"
    rope.remove(model)
    assert torch.equal(logits(model, ids), vanilla)
    assert not rope.is_installed(model)
    assert not hasattr(model.config, rope.CONFIG_KEY)
    assert all(len(layer._forward_pre_hooks) == 0 for layer in model.model.layers)


def count_rotary_computations(monkeypatch, model):
    """Counters of the model's own rotary_emb calls and of LPES's extra (cos, sin) computations."""
    counts = {"model": 0, "lpes": 0}
    model.base_model.rotary_emb.register_forward_hook(lambda *_: counts.__setitem__("model", counts["model"] + 1))
    original = rope_anatomy.RotaryFunction.__call__

    def counted(self, bound):
        counts["lpes"] += 1
        return original(self, bound)

    monkeypatch.setattr(rope_anatomy.RotaryFunction, "__call__", counted)
    return counts


def test_one_extra_rope_computation_per_forward(monkeypatch):
    model = tiny_model("llama")
    counts = count_rotary_computations(monkeypatch, model)
    rope.install(model, [1.5, 1.7, 2.0, 1.0])
    counts["lpes"] = 0  # install's own check of the rotary output
    for _ in range(2):
        logits(model, random_ids(16))
    # Per forward: 1 call by the model itself + 1 for all distinct non-1 scales together.
    assert counts == {"model": 2, "lpes": 2}
    rope.set_scales(model, 1.0)
    logits(model, random_ids(16))
    assert counts == {"model": 3, "lpes": 2}, "all-ones computes nothing extra"


def test_one_extra_rope_computation_per_layer_type_on_gemma3(monkeypatch):
    model = build(BY_NAME["gemma3"])  # layer types: sliding, full, sliding, full
    counts = count_rotary_computations(monkeypatch, model)
    rope.install(model, [1.7, 1.0, 0.8, 1.7])  # sliding {1.7, 0.8}, full {1.7}
    counts["lpes"] = 0  # install's own check of the rotary output
    with torch.no_grad():
        generated = model.generate(random_ids(16), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert generated.shape[1] == 19
    # Per forward (1 prefill + 2 decoding steps): the model calls rotary_emb once per layer type,
    # LPES computes once per (call, set of scales): one stacked call for the sliding layers, one for the full.
    assert counts == {"model": 6, "lpes": 6}
    rope.set_scales(model, [1.0, 1.3, 1.0, 1.0])  # only a full layer is scaled
    logits(model, random_ids(16))
    assert counts == {"model": 8, "lpes": 7}


def test_gemma3_each_layer_is_scaled_from_its_own_layer_types_rope():
    """The issue's case: a scaled sliding layer must be scaled from the sliding (10k) RoPE, a full
    layer from the full one, whichever order the model calls them in."""
    model = build(BY_NAME["gemma3"])
    ids = random_ids(40)
    vanilla = logits(model, ids)
    for layer in range(4):
        scales = [1.0] * 4
        scales[layer] = 1 + 1e-6
        rope.install(model, scales)
        assert (logits(model, ids) - vanilla).abs().max() < 1e-5, f"layer {layer}"
        rope.remove(model)


def test_gemma3_inside_its_vision_wrapper_is_found_and_scaled():
    model = tiny_gemma3_multimodal()
    assert rope.num_layers(model) == 4
    ids = random_ids(40, vocab=90)  # text tokens only
    vanilla = logits(model, ids)
    for layer in range(4):
        scales = [1.0] * 4
        scales[layer] = 1 + 1e-6
        rope.install(model, scales)
        assert (logits(model, ids) - vanilla).abs().max() < 1e-5, f"layer {layer}"
        rope.set_scales(model, [1.7, 1.0, 0.8, 1.7])
        assert (logits(model, ids) - vanilla).abs().max() > 1e-2
        rope.remove(model)


@pytest.mark.parametrize("family", ["llama-dynamic", "phi3-longrope"])
def test_frequencies_are_chosen_from_the_true_positions(family):
    """Dynamic NTK / LongRoPE: a layer's (cos, sin) do not depend on the other layers' scales.

    The input (40 tokens) is past both models' threshold (32): vanilla uses the extended
    frequencies. A layer at scale 2 sees positions below the threshold, another at 0.5 far
    above it; neither may change which frequencies the first one gets.
    """
    ids = random_ids(LENGTH)
    seen = {}
    for others in (1.0, 0.5, 2.0):
        model = build(BY_NAME[family])
        scales = [2.0, others, others, others]
        rope.install(model, scales)
        captured = []
        model.base_model.layers[0].register_forward_pre_hook(
            lambda module, args, kwargs: captured.append(kwargs["position_embeddings"]), with_kwargs=True
        )
        layer0_out = []
        model.base_model.layers[0].register_forward_hook(
            lambda module, args, out: layer0_out.append(out[0] if isinstance(out, tuple) else out)
        )
        out = logits(model, ids)
        rotary = model.base_model.rotary_emb
        assert not torch.equal(rotary.inv_freq, rotary.original_inv_freq), "the input must be past the threshold"
        seen[others] = (captured[0], layer0_out[0], out)
        # and the frequencies are those of vanilla at the true positions
        torch.testing.assert_close(out, reference_logits(model, ids, scales, BY_NAME[family]), rtol=1e-4, atol=1e-4)
    for others in (0.5, 2.0):
        for ours, alone in zip(seen[others][0], seen[1.0][0]):
            assert torch.equal(ours, alone), f"layer 0's (cos, sin) changed with the other layers at {others}"
        assert torch.equal(seen[others][1], seen[1.0][1]), "layer 0's output changed with the other layers' scales"


def test_lpes_leaves_the_rotary_module_state_alone():
    """The scaled positions never reach dynamic NTK's update: the module is as vanilla leaves it."""
    model, twin = build(BY_NAME["llama-dynamic"]), build(BY_NAME["llama-dynamic"])
    rope.install(model, [0.25, 1.0, 1.0, 1.0])  # layer 0 sees positions up to 4x the true ones
    ids = random_ids(LENGTH)
    logits(model, ids)
    logits(twin, ids)
    for name in ("inv_freq", "original_inv_freq"):
        assert torch.equal(getattr(model.model.rotary_emb, name), getattr(twin.model.rotary_emb, name))
    assert model.model.rotary_emb.max_seq_len_cached == twin.model.rotary_emb.max_seq_len_cached


def test_position_embeddings_from_elsewhere_are_refused_not_guessed():
    model = tiny_model("llama")
    def copy_position_embeddings(module, args, kwargs):  # same values, but not the rotary call's tensors
        return args, dict(kwargs, position_embeddings=tuple(t.clone() for t in kwargs["position_embeddings"]))

    model.model.layers[2].register_forward_pre_hook(copy_position_embeddings, with_kwargs=True)
    rope.install(model, [1.0, 1.0, 1.5, 1.0])
    with pytest.raises(RuntimeError, match="layer 2 of model type 'llama'.*not supported"):
        logits(model, random_ids(8))
    rope.set_scales(model, [1.5, 1.0, 1.0, 1.0])  # the other layers are fine
    logits(model, random_ids(8))


def test_scales_are_kept_through_save_pretrained(tmp_path):
    model = tiny_model("qwen2")
    rope.install(model, MIXED)
    ids = random_ids(24)
    expected = logits(model, ids)
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    assert rope.saved_scales(reloaded.config) == MIXED
    rope.install(reloaded, rope.saved_scales(reloaded.config))
    torch.testing.assert_close(logits(reloaded, ids), expected)


def test_model_without_rope_gets_a_clear_error():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(rope_anatomy.RoPENotFoundError, match="gpt2.*no rotary position embedding"):
        rope.install(gpt2, 1.5)


def test_scale_count_mismatch_names_both_numbers():
    with pytest.raises(rope_anatomy.LPESError, match="got 3 scales but the model has 4 decoder layers"):
        rope.install(tiny_model("llama"), [1.0, 1.2, 1.4])


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_non_positive_or_non_finite_scale_is_rejected(bad):
    model = tiny_model("mistral")
    with pytest.raises(rope_anatomy.LPESError, match="layer 2 is .*finite number > 0"):
        rope.install(model, [1.0, 1.0, bad, 1.0])
    assert not rope.is_installed(model), "a rejected install must leave nothing behind"
