"""The paper's claims about layer-specific position scaling, on tiny Llama/Qwen2/Mistral."""

import math

import pytest
import torch
from tiny_models import ARCHITECTURES, random_ids, tiny_model
from transformers import GPT2Config, GPT2LMHeadModel

from lpes_harness import rope

MIXED = [1.0, 1.7, 0.8, 2.5]  # one per tiny layer; includes a 1.0 layer and a < 1 layer


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_all_scales_one_reproduces_logits_exactly(arch):
    model = tiny_model(arch)
    ids = random_ids(48)
    before = logits(model, ids)
    rope.install(model, [1.0] * 4)
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
    prompt = random_ids(20)
    with torch.no_grad():
        cached = model.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=True, pad_token_id=0)
    # Full recomputation: one whole forward per new token, no cache at all.
    ids = prompt
    for _ in range(12):
        next_id = logits(model, ids, use_cache=False)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_id], dim=1)
    assert torch.equal(cached, ids)


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


def test_one_extra_rope_computation_per_forward():
    model = tiny_model("llama")
    calls = []
    original = model.model.rotary_emb.forward
    model.model.rotary_emb.forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    rope.install(model, [1.5, 1.7, 2.0, 1.0])
    logits(model, random_ids(16))
    # 1 call by the model itself + 1 for all distinct non-1 scales together.
    assert len(calls) == 2


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
    with pytest.raises(rope.RoPENotFoundError, match="gpt2.*no rotary position embedding"):
        rope.install(gpt2, 1.5)


def test_scale_count_mismatch_names_both_numbers():
    with pytest.raises(rope.LPESError, match="got 3 scales but the model has 4 decoder layers"):
        rope.install(tiny_model("llama"), [1.0, 1.2, 1.4])


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_non_positive_or_non_finite_scale_is_rejected(bad):
    model = tiny_model("mistral")
    with pytest.raises(rope.LPESError, match="layer 2 is .*finite number > 0"):
        rope.install(model, [1.0, 1.0, bad, 1.0])
    assert not rope.is_installed(model), "a rejected install must leave nothing behind"
