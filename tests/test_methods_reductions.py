"""Each baseline is vanilla in its trivial setting, and a different model otherwise.

- Ms-PoE with min_ratio = max_ratio = 1: every head sees the positions unchanged;
- Attention Buckets with the single base theta: one copy, weight 1;
- MoICE with every base equal to theta: all experts agree, the router weights sum to 1.

Tiny random Llama / Qwen2 / Mistral models with grouped-query attention (4 heads, 2 kv heads),
and a tiny Gemma-3 whose sliding (theta 10k) and full (theta 1M) layers each have their own RoPE.
"""

import pytest
import torch
from tiny_models import ARCHITECTURES, random_ids, tiny_gemma3, tiny_gemma3_multimodal, tiny_model

from lpes_harness.core import rope
from lpes_harness.methods import attention, buckets, moice, mspoe

pytestmark = pytest.mark.filterwarnings("ignore:moice_hf without gates")


def logits(model, ids, mask=None):
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


def generated(model, ids, mask=None, **kwargs):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, **kwargs)


@pytest.fixture
def inputs():
    ids = random_ids(24, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # left padding, as lm-eval's generate_until batches
    return ids, mask


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_mspoe_with_unit_ratios_is_vanilla(arch, inputs):
    ids, mask = inputs
    model = tiny_model(arch)
    vanilla_logits, vanilla_tokens = logits(model, ids), generated(model, ids, mask)
    mspoe.install(model, min_ratio=1.0, max_ratio=1.0, layers="0:")
    assert torch.allclose(logits(model, ids), vanilla_logits, atol=1e-5)
    assert torch.equal(generated(model, ids, mask), vanilla_tokens)
    mspoe.remove(model)
    mspoe.install(model, min_ratio=1.2, max_ratio=1.8, layers="0:")
    assert not torch.allclose(logits(model, ids), vanilla_logits, atol=1e-3)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_buckets_with_the_single_base_theta_is_vanilla(arch, inputs):
    ids, mask = inputs
    model = tiny_model(arch)
    vanilla_logits, vanilla_tokens = logits(model, ids), generated(model, ids, mask)
    buckets.install(model, bases="1.0")
    with torch.no_grad():
        assert torch.allclose(buckets.forward_logits(model, ids), vanilla_logits, atol=1e-5)
        assert torch.equal(buckets.generate(model, ids, mask, max_new_tokens=6), vanilla_tokens)
    buckets.remove(model)
    buckets.install(model)  # the paper's seven bases
    with torch.no_grad():
        assert not torch.allclose(buckets.forward_logits(model, ids), vanilla_logits, atol=1e-3)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_moice_with_all_bases_theta_is_vanilla(arch, inputs):
    ids, mask = inputs
    model = tiny_model(arch)
    vanilla_logits, vanilla_tokens = logits(model, ids), generated(model, ids, mask)
    moice.install(model, bases="1;1;1;1;1;1;1")
    assert torch.allclose(logits(model, ids), vanilla_logits, atol=1e-5)
    assert torch.equal(generated(model, ids, mask), vanilla_tokens)
    moice.remove(model)
    moice.install(model)  # the paper's seven distinct bases
    assert not torch.allclose(logits(model, ids), vanilla_logits, atol=1e-3)


def test_remove_restores_the_exact_model(inputs):
    ids, _ = inputs
    model = tiny_model("llama")
    vanilla = logits(model, ids)
    for method in (mspoe, buckets, moice):
        method.install(model)
        method.remove(model)
        assert torch.equal(logits(model, ids), vanilla), method.__name__
    assert not any("moice_router" in name for name, _ in model.named_parameters())


def test_buckets_weights_favour_the_most_confident_copy():
    confident = torch.tensor([[0.0, 9.0, 0.0]])
    unsure = torch.tensor([[1.0, 1.0, 1.2]])
    merged = buckets.merge_logits(torch.stack([confident, unsure]))
    weight = torch.softmax(torch.tensor([9.0, 1.2]), dim=0)
    assert torch.allclose(merged, weight[0] * confident + weight[1] * unsure)
    assert merged.argmax().item() == 1


# ----------------------------------------------------------------------------- Gemma-3: a RoPE per layer type
# The 24-token prompts are three times the sliding window (8): a sliding layer that attended to
# more keys than the model's own mask lets it, or rotated with the full layers' RoPE, would show.


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_mspoe_on_gemma3_is_vanilla_at_ratio_1_and_lpes_at_one_uniform_ratio(attn, inputs):
    ids, mask = inputs
    model = tiny_gemma3(attn_implementation=attn)
    vanilla_logits, vanilla_tokens = logits(model, ids, mask), generated(model, ids, mask)
    rope.install(model, 1.6)  # LPES: every layer at positions / 1.6, from its own layer type's RoPE
    uniform = logits(model, ids, mask)
    rope.remove(model)

    mspoe.install(model, min_ratio=1.0, max_ratio=1.0, layers="0:")
    torch.testing.assert_close(logits(model, ids, mask), vanilla_logits, rtol=0, atol=1e-6)
    assert torch.equal(generated(model, ids, mask), vanilla_tokens)
    mspoe.remove(model)
    mspoe.install(model, min_ratio=1.6, max_ratio=1.6, layers="0:")  # every head of every layer at 1.6
    ours = logits(model, ids, mask)
    torch.testing.assert_close(ours, uniform, rtol=0, atol=1e-5)
    assert (ours - vanilla_logits).abs().max() > 1e-2


def test_mspoe_on_gemma3_ranks_heads_over_the_keys_of_each_layers_own_mask(monkeypatch):
    model = tiny_gemma3()
    ids = random_ids(24)
    window, length = model.config.sliding_window, ids.shape[1]
    seen, hidden = [], {}  # per layer: the keys its statistic was told are visible; its attention's input
    share = mspoe.outlier_share

    def recording_share(query, key, visible, scaling):
        seen.append(visible)
        return share(query, key, visible, scaling)

    def keep_input(index):
        return lambda module, args, kwargs: hidden.__setitem__(index, kwargs["hidden_states"])

    monkeypatch.setattr(mspoe, "outlier_share", recording_share)
    layers = model.model.layers
    for index, layer in enumerate(layers):
        layer.self_attn.register_forward_pre_hook(keep_input(index), with_kwargs=True)
    mspoe.install(model, layers="0:")
    logits(model, ids)
    table = mspoe.ratio_table(model.config.num_attention_heads, 1.2, 1.8)
    for index, layer in enumerate(layers):
        attn = layer.self_attn
        visible = torch.ones(1, length, dtype=torch.bool)
        if attn.sliding_window is not None:
            visible[:, : length - window] = False  # the last query sees itself and the 7 keys before it
        assert torch.equal(seen[index], visible), f"layer {index} ({attn.layer_type})"
        # By hand: pre-RoPE queries and keys after Gemma's q_norm / k_norm, Gemma's own scaling.
        query, key, _ = attention.projections(attn, hidden[index])
        key = attention.repeat_heads(key, query.shape[1] // key.shape[1])
        expected = mspoe.ratios_from_shares(share(query[:, :, -1], key, visible, attn.scaling), table, "rank")
        assert torch.equal(mspoe.get_state(model).head_ratios[index], expected), f"layer {index}"


def test_buckets_on_gemma3_base_c_is_every_layer_types_theta_times_c(inputs):
    ids, mask = inputs
    model = tiny_gemma3()
    vanilla_logits, vanilla_tokens = logits(model, ids, mask), generated(model, ids, mask)
    buckets.install(model, bases="1.0")
    with torch.no_grad():
        torch.testing.assert_close(buckets.forward_logits(model, ids, mask), vanilla_logits, rtol=0, atol=1e-6)
        assert torch.equal(buckets.generate(model, ids, mask, max_new_tokens=6), vanilla_tokens)
    buckets.remove(model)

    twin = tiny_gemma3(theta_factor=1.7)  # theta 17k on the sliding layers and 1.7M on the full ones
    twin.load_state_dict(model.state_dict())
    buckets.install(model, bases="1.7")
    assert buckets.get_state(model).bases == {"sliding_attention": [17000.0], "full_attention": [1700000.0]}
    with torch.no_grad():
        ours = buckets.forward_logits(model, ids, mask)
    torch.testing.assert_close(ours, logits(twin, ids, mask), rtol=0, atol=1e-5)
    assert (ours - vanilla_logits).abs().max() > 1e-2


def test_gemma3_inside_its_vision_wrapper_runs_both_baselines():
    model = tiny_gemma3_multimodal()
    ids = random_ids(24, batch=2, vocab=93)  # no image token ids (93-95)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    vanilla_logits, vanilla_tokens = logits(model, ids, mask), generated(model, ids, mask)
    mspoe.install(model, min_ratio=1.0, max_ratio=1.0, layers="0:")
    torch.testing.assert_close(logits(model, ids, mask), vanilla_logits, rtol=0, atol=1e-6)
    assert torch.equal(generated(model, ids, mask), vanilla_tokens)
    mspoe.remove(model)
    buckets.install(model, bases="1.0")
    with torch.no_grad():
        torch.testing.assert_close(buckets.forward_logits(model, ids, mask), vanilla_logits, rtol=0, atol=1e-6)
        assert torch.equal(buckets.generate(model, ids, mask, max_new_tokens=6), vanilla_tokens)
