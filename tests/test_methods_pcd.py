"""Positional Contrastive Decoding (``pcd_hf``) on tiny random models built in code.

PCD decodes from ``L + w (L - L')``: ``L`` the model's logits, ``L'`` those of the same model with its
RoPE base lowered from theta to ``base_ratio`` x theta. Its identity (``weight=0``, or ``base_ratio=1``)
is the plain model bit for bit; at real settings its logits are that definition computed from two
separately built models (the model, and the model built with the lowered theta); cached greedy
decoding equals one forward over the whole sequence per step; through lm-eval the identity answers
as ``hf`` does, a real setting batched equals unbatched, and bad arguments are one line before the
model loads.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import (LM_REQUESTS, assert_same_greedy_steps, lm_generations, lm_loglikelihoods, logits,
                         pcd_cached_and_recomputed, plain_lm_answers, random_ids, tiny_gemma3, tiny_model)

from lpes_harness.lmeval.method_models import PCDLM
from lpes_harness.methods import pcd
from lpes_harness.methods.arguments import MethodError

ARCHS = ("llama", "qwen2", "mistral", "gemma3")


def build(arch: str, theta_factor: float = 1.0):
    """The tiny model of ``arch``, every RoPE base times ``theta_factor`` (the same weights at any factor)."""
    if arch == "gemma3":
        return tiny_gemma3(theta_factor=theta_factor)
    return tiny_model(arch, rope_parameters={"rope_theta": 10000.0 * theta_factor})


def left_padded(length=24, batch=2, pad=4):
    ids = random_ids(length, batch=batch)
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0
    return ids, mask


def positions(mask):
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


# ----------------------------------------------------------------------------- identity


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("identity", [{"weight": 0.0, "base_ratio": 0.1}, {"weight": 0.5, "base_ratio": 1.0}])
def test_the_identity_is_the_plain_model_bit_for_bit(arch, identity):
    model = build(arch)
    ids, mask = left_padded()
    plain = logits(model, ids, attention_mask=mask, position_ids=positions(mask))
    last = logits(model, ids, attention_mask=mask, position_ids=positions(mask), logits_to_keep=1)[:, -1]  # as generate
    pcd.install(model, **identity)
    with torch.no_grad():
        assert torch.equal(pcd.forward_logits(model, ids, mask, positions(mask)), plain)
        assert torch.equal(pcd.forward_logits(model, ids, mask, positions(mask), last_only=True), last)
        generated = pcd.generate(model, ids, attention_mask=mask, max_new_tokens=6)
    pcd.remove(model)
    with torch.no_grad():
        vanilla = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(generated, vanilla)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_plain_call_of_an_installed_model_is_the_plain_model_and_remove_restores_it(arch):
    model = build(arch)
    ids = random_ids(20, batch=2)
    plain = logits(model, ids)
    pcd.install(model, base_ratio=0.05, weight=1.0)
    assert torch.equal(logits(model, ids), plain)  # only forward_logits runs the lowered copy
    with torch.no_grad():
        assert not torch.allclose(pcd.forward_logits(model, ids), plain, atol=1e-3)
    pcd.remove(model)
    assert torch.equal(logits(model, ids), plain) and not pcd.SLOT.find(model)


# ----------------------------------------------------------------------------- the definition


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("base_ratio, weight", [(0.1, 0.5), (0.02, 1.0), (0.5, 3.0)])
def test_the_logits_are_the_contrast_of_the_model_and_the_model_built_at_the_lowered_base(arch, base_ratio, weight):
    model, lowered = build(arch), build(arch, theta_factor=base_ratio)
    ids, mask = left_padded()
    kwargs = dict(attention_mask=mask, position_ids=positions(mask))
    long_aware, local_aware = logits(model, ids, **kwargs).float(), logits(lowered, ids, **kwargs).float()
    assert not torch.allclose(long_aware, local_aware, atol=1e-3)  # the lowered base does change the logits
    expected = long_aware + weight * (long_aware - local_aware)
    pcd.install(model, base_ratio=base_ratio, weight=weight)
    with torch.no_grad():
        got = pcd.forward_logits(model, ids, mask, positions(mask))
        rows, columns = torch.tensor([0, 0, 1, 1]), torch.tensor([5, 23, 0, 17])
        at_answers = pcd.answer_logits(model, ids[1:].expand(2, -1), rows, columns)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # answer_logits (no mask: lm-eval's right-padded rows) at chosen positions: the full contrast's numbers there
    plain_rows = ids[1:].expand(2, -1)
    full = logits(model, plain_rows).float() + weight * (logits(model, plain_rows).float() - logits(lowered, plain_rows).float())
    torch.testing.assert_close(at_answers, full[rows, columns], rtol=1e-5, atol=1e-5)


def test_each_layer_types_base_is_lowered_by_the_ratio_and_the_settings_say_so():
    model = tiny_gemma3()
    pcd.install(model, base_ratio=0.1, weight=0.5)
    assert pcd.settings(model) == {"base_ratio": 0.1, "weight": 0.5,
                                   "lowered_base": {"sliding_attention": 1e3, "full_attention": 1e5}}
    one = tiny_model("llama")
    pcd.install(one, base_ratio=0.25, weight=1)
    assert pcd.settings(one)["lowered_base"] == 2500.0


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_cached_generation_equals_full_recomputation(arch, monkeypatch):
    # Gemma-3: a 16-token prompt and 8 new tokens against a sliding window of 8 (its cache drops keys).
    model = build(arch)
    ids, mask = left_padded(16, pad=3)
    pcd.install(model, base_ratio=0.05, weight=1.0)
    assert_same_greedy_steps(*pcd_cached_and_recomputed(model, ids, mask, monkeypatch))


# ----------------------------------------------------------------------------- refusals and errors


def test_a_rope_without_a_base_to_lower_is_refused_in_one_line_and_left_as_it_was():
    model = tiny_model("llama", rope_parameters={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="rope_type='linear'") as err:
        pcd.install(model)
    assert "\n" not in str(err.value) and pcd.SLOT.find(model) is None
    assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("arguments, match", [
    ({"base_ratio": 2}, r"pcd_hf: base_ratio=2 is out of range; give a number in \(0, 1\]"),
    ({"base_ratio": 0}, r"pcd_hf: base_ratio=0 is out of range"),
    ({"weight": -1}, r"pcd_hf: weight=-1 is out of range; give a number in \[0, 10\]"),
    ({"weight": "strong"}, r"pcd_hf: weight='strong' is not a number"),
])
def test_argument_errors_are_one_line_and_come_before_the_model_loads(tmp_path, arguments, match):
    with pytest.raises(MethodError, match=match) as err:
        PCDLM(pretrained=str(tmp_path / "no_model_here"), **arguments)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- through lm-eval



@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tiny_models import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="module")
def plain_answers(checkpoint):
    return plain_lm_answers(checkpoint)


def test_the_identity_through_lm_eval_gives_the_plain_models_answers(checkpoint, plain_answers):
    lm = PCDLM(pretrained=checkpoint, device="cpu", batch_size=3, weight=0)
    assert pcd.SLOT.find(lm.model) is None and lm.get_model_info()["pcd"]["plain"]
    assert (lm_loglikelihoods(lm), lm_generations(lm)) == plain_answers


def test_a_real_setting_through_lm_eval_is_its_definition_and_batched_equals_unbatched(checkpoint, plain_answers):
    one = PCDLM(pretrained=checkpoint, device="cpu", batch_size=1, base_ratio=0.05, weight=1)
    many = PCDLM(pretrained=checkpoint, device="cpu", batch_size=3, base_ratio=0.05, weight=1)
    assert many.get_model_info()["pcd"]["weight"] == 1.0
    scores = lm_loglikelihoods(one)
    assert [s for s, _ in lm_loglikelihoods(many)] == pytest.approx([s for s, _ in scores], abs=1e-4)
    assert lm_generations(many) == lm_generations(one)
    assert [s for s, _ in scores] != pytest.approx([s for s, _ in plain_answers[0]], abs=1e-4)
    # the first request's log-likelihood: the log-softmax of the contrast over the whole row, at the answer
    context, continuation = LM_REQUESTS[0]
    ctx, cont = one.tok_encode(context), one.tok_encode(continuation)
    with torch.no_grad():
        contrast = pcd.forward_logits(one.model, torch.tensor([ctx + cont[:-1]]))[0, len(ctx) - 1:]
    expected = torch.log_softmax(contrast, -1)[torch.arange(len(cont)), torch.tensor(cont)].sum().item()
    assert scores[0][0] == pytest.approx(expected, abs=1e-5)
