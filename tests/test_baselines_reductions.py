"""Each baseline is vanilla in its trivial setting, and a different model otherwise.

- Ms-PoE with min_ratio = max_ratio = 1: every head sees the positions unchanged;
- Attention Buckets with the single base theta: one copy, weight 1;
- MoICE with every base equal to theta: all experts agree, the router weights sum to 1.

Tiny random Llama / Qwen2 / Mistral models with grouped-query attention (4 heads, 2 kv heads).
"""

import pytest
import torch
from tiny_models import ARCHITECTURES, random_ids, tiny_model

from lpes_harness.baselines import buckets, moice, mspoe

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
