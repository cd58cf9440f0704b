"""Stacks: an LPES curve and one other method in one run (issue #97, item 3: ``lpes+pcd``, ``lpes+fitm``).

On a tiny random Llama built in code, for every method whose table entry stacks (``stacks_with_lpes``) and
under a curve of each scaling (position, base, both):

- the identity of both halves (scales 1, the entry's ``identity``) is the plain model, bit for bit;
- a curve with the method at its identity is the curve alone, and scales 1 with the method at a real
  setting is the method alone, bit for bit (so each half's identity holds with the other half installed);
- a real stack moves the logits away from each half alone, and removing it (the method, then the curve)
  leaves the plain model;
- where a method computes a layer's RoPE itself, it does so in the curve's frame: PCD's contrast is its
  definition computed from the curve on the model and on the model built at the lowered base; STRING with
  a shift of 0 is the curve alone (and would not be with its far rotation outside the curve's frame);
- cached decoding equals full recomputation for a stack;
- through lm-eval: ``lpes_scales=`` (numbers or a scales file) on a stacking method's model, the model
  info naming the stack, ``reconfigure``; the methods that do not stack refuse ``lpes_scales=`` in one
  line, with their entry's reason, before any model loads.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from tiny_models import (LM_REQUESTS, assert_same_greedy_steps, cached_and_recomputed_greedy, lm_generations,
                         lm_loglikelihoods, logits, pcd_cached_and_recomputed, plain_lm_answers, random_ids,
                         save_tiny_checkpoint, tiny_model)

from lpes_harness.core import rope
from lpes_harness.core.scales_file import ScalesError, write_scales_file
from lpes_harness.core.scaling import SCALINGS
from lpes_harness.lmeval.lpes_lm import LPESLM
from lpes_harness.lmeval.method_models import FitMLM, PCDLM
from lpes_harness.lmeval.registration import model_args_error
from lpes_harness.methods import METHODS, fitm, lm_eval_models, pcd, poshidden, string_shift
from lpes_harness.methods.arguments import MethodError
from lpes_harness.methods.under_lpes import PLAIN, LayerFrames

N_LAYERS = 4  # tiny_model's
# One curve per scaling; layer 2 stays at 1, so the identity path runs beside the scaled ones.
CURVES = {"position": [0.7, 1.3, 1.0, 1.6], "base": [0.5, 2.0, 1.0, 4.0],
          "both": [0.7, 1.3, 1.0, 1.6, 0.5, 2.0, 1.0, 4.0]}
STACKING = sorted(name for name, entry in METHODS.items() if entry.stacks_with_lpes)
QUERY_START = 18  # the first answer-predicting column of the 24-token rows (FitM, positional hidden states)
# A real setting of each stacking method, one that moves the tiny model's logits.
SETTINGS = {
    "pcd": {"base_ratio": 0.05, "weight": 1.0},
    "fitm": {"strength": 1.0, "temperature": 1e-2, "num_spans": 4, "dummy_ids": [5, 6, 7], "layers": "0:"},
    "poshidden": {"channels": [3, 17], "factor": 0.0, "layers": "0:"},
    "string": {"shifted_offset": 12, "local_window": 4, "attention_factor": 1.0},
}


def test_the_stacking_methods_are_the_four_whose_hooks_were_read_and_each_has_a_setting_here():
    assert STACKING == ["fitm", "pcd", "poshidden", "string"]
    assert sorted(SETTINGS) == STACKING
    for entry in METHODS.values():  # the others each say why, in one line (the refusal's)
        assert entry.stacks_with_lpes or (entry.why_not_stacked and "\n" not in entry.why_not_stacked)


def method_logits(name: str, model, ids) -> torch.Tensor:
    """The installed method's logits: its own forward where it has one (PCD's two copies, FitM's dummy
    copies), its answer queries from :data:`QUERY_START` (positional hidden states), else the model's."""
    with torch.no_grad():
        if name == "pcd":
            return pcd.forward_logits(model, ids)
        if name == "fitm":
            return fitm.forward_logits(model, ids, query_start=[QUERY_START] * len(ids))
        if name == "poshidden":
            with poshidden.answer_queries_from(model, QUERY_START):
                return model(ids).logits
        return model(ids).logits


def stacked(curve=None, scaling="position", method=None, arguments=None, **model_kwargs):
    """A fresh tiny Llama (the same weights each time) with ``curve`` installed, then ``method`` at ``arguments``."""
    model = tiny_model("llama", **model_kwargs)
    if curve is not None:
        rope.install(model, curve, scaling=scaling)
    if method is not None:
        METHODS[method].load().install(model, **arguments)
    return model


def has_no_hooks(model) -> bool:
    return not any(m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m) for m in model.modules())


# ----------------------------------------------------------------------------- identities


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
@pytest.mark.parametrize("name", STACKING)
def test_both_identities_stacked_are_the_plain_model_bit_for_bit(name, scaling):
    ids = random_ids(24, batch=2)
    plain = logits(tiny_model("llama"), ids)
    model = stacked(SCALINGS[scaling].identity(N_LAYERS), scaling, name, METHODS[name].identity(N_LAYERS))
    assert torch.equal(method_logits(name, model, ids), plain)


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
@pytest.mark.parametrize("name", STACKING)
def test_a_curve_under_the_methods_identity_is_the_curve_alone_bit_for_bit(name, scaling):
    ids = random_ids(24, batch=2)
    curve_alone = logits(stacked(CURVES[scaling], scaling), ids)
    model = stacked(CURVES[scaling], scaling, name, METHODS[name].identity(N_LAYERS))
    assert torch.equal(method_logits(name, model, ids), curve_alone)


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
@pytest.mark.parametrize("name", STACKING)
def test_the_curves_identity_under_a_real_setting_is_the_method_alone_bit_for_bit(name, scaling):
    # PCD under a curve lowers its copy in a hook of each layer, not of the rotary call: at scales 1 the same numbers.
    ids = random_ids(24, batch=2)
    method_alone = method_logits(name, stacked(None, scaling, name, SETTINGS[name]), ids)
    model = stacked(SCALINGS[scaling].identity(N_LAYERS), scaling, name, SETTINGS[name])
    assert torch.equal(method_logits(name, model, ids), method_alone)


# ----------------------------------------------------------------------------- a real stack, and its removal


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
@pytest.mark.parametrize("name", STACKING)
def test_a_real_stack_differs_from_each_half_and_removing_it_leaves_the_plain_model(name, scaling):
    ids = random_ids(24, batch=2)
    plain = logits(tiny_model("llama"), ids)
    curve_alone = logits(stacked(CURVES[scaling], scaling), ids)
    method_alone = method_logits(name, stacked(None, scaling, name, SETTINGS[name]), ids)
    model = stacked(CURVES[scaling], scaling, name, SETTINGS[name])
    both = method_logits(name, model, ids)
    assert (both - curve_alone).abs().max() > 1e-3, "the method must move the curve's logits"
    assert (both - method_alone).abs().max() > 1e-3, "the curve must move the method's logits"
    METHODS[name].load().remove(model)  # the method first, then the curve under it
    rope.remove(model)
    assert has_no_hooks(model)
    assert torch.equal(logits(model, ids), plain)


# ----------------------------------------------------------------------------- in the curve's frame


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
def test_pcd_on_a_curve_contrasts_the_curve_with_the_curve_on_the_model_at_the_lowered_base(scaling):
    """``L + w (L - L')``: ``L`` the curve on the model, ``L'`` the curve on the model built at ``r`` x theta,
    whose layer h then has base ``r b_h theta`` at positions ``i / p_h``: PCD's copy, in the curve's frame."""
    base_ratio, weight = 0.1, 1.0
    ids = random_ids(24, batch=2)
    long_aware = logits(stacked(CURVES[scaling], scaling), ids).float()
    local_aware = logits(stacked(CURVES[scaling], scaling, rope_parameters={"rope_theta": 10000.0 * base_ratio}), ids)
    model = stacked(CURVES[scaling], scaling, "pcd", {"base_ratio": base_ratio, "weight": weight})
    expected = long_aware + weight * (long_aware - local_aware.float())
    torch.testing.assert_close(method_logits("pcd", model, ids), expected, rtol=1e-5, atol=1e-5)
    plain_copy = long_aware + weight * (long_aware - logits(stacked(None, scaling, None, None,
                                                                    rope_parameters={"rope_theta": 1000.0}), ids))
    assert (method_logits("pcd", model, ids) - plain_copy).abs().max() > 1e-3  # a copy off the curve would show


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
def test_string_with_no_shift_on_a_curve_is_the_curve_alone_because_its_far_rotation_is_in_the_curves_frame(
        scaling, monkeypatch):
    """``S = W``: far distances read ``d - S + W = d``, so the far rotation (recomputed by STRING) must be the
    rotation the curve gives the layer; outside the curve's frame (the true positions, the model's base) the
    far keys move."""
    ids = random_ids(40, batch=2)
    curve_alone = logits(stacked(CURVES[scaling], scaling), ids)
    no_shift = {"shifted_offset": 16, "local_window": 16, "attention_factor": 1.0}
    model = stacked(CURVES[scaling], scaling, "string", no_shift)
    torch.testing.assert_close(logits(model, ids), curve_alone, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(LayerFrames, "pair", lambda self, layer: PLAIN)
    assert (logits(model, ids) - curve_alone).abs().max() > 1e-3


def test_pcd_installed_before_the_curve_refuses_to_contrast_instead_of_losing_its_lowered_base():
    # The curve's hooks would re-rotate PCD's rotary output, both copies at the curve's base: the order is the stack's.
    model = stacked(None, "position", "pcd", SETTINGS["pcd"])
    rope.install(model, CURVES["position"])
    with pytest.raises(RuntimeError, match="PCD was installed before the LPES curve now under it"):
        method_logits("pcd", model, random_ids(24))


# ----------------------------------------------------------------------------- decoding


def test_cached_generation_of_lpes_and_pcd_equals_full_recomputation(monkeypatch):
    ids = random_ids(16, batch=2)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: the positions restart after it, scaled by the curve
    model = stacked(CURVES["both"], "both", "pcd", SETTINGS["pcd"])
    assert_same_greedy_steps(*pcd_cached_and_recomputed(model, ids, mask, monkeypatch))


def test_cached_generation_of_lpes_and_string_equals_full_recomputation():
    model = stacked(CURVES["position"], "position", "string", SETTINGS["string"])
    assert_same_greedy_steps(*cached_and_recomputed_greedy(model, random_ids(16, batch=2), new_tokens=8))


# ----------------------------------------------------------------------------- through lm-eval


def lm_class(lm_eval: str):
    module, _, attribute = lm_eval_models()[lm_eval].partition(":")
    found = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


NOT_STACKING = sorted({entry.lm_eval for entry in METHODS.values() if not entry.stacks_with_lpes})


@pytest.mark.parametrize("lm_eval", NOT_STACKING)
def test_a_method_that_does_not_stack_refuses_lpes_scales_in_one_line_before_the_model_loads(lm_eval, tmp_path):
    model_class = lm_class(lm_eval)
    reason = METHODS[model_class.method].why_not_stacked
    with pytest.raises(MethodError) as err:  # a load would fail otherwise: there is no model at that path
        model_class(pretrained=str(tmp_path / "no_model_here"), lpes_scales="0.8;1.2")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{lm_eval}: lpes_scales=") and message.endswith(reason)
    assert model_args_error(lm_eval, "lpes_scales=1.2") == message  # lm_eval's command line: the same line
    assert "lpes_scales" not in inspect.signature(model_class.__init__).parameters


@pytest.mark.parametrize("lm_eval", sorted({METHODS[name].lm_eval for name in STACKING}))
def test_a_stacking_methods_model_lists_the_curves_arguments(lm_eval):
    assert {"lpes_scales", "lpes_scaling"} <= set(inspect.signature(lm_class(lm_eval).__init__).parameters)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"), "llama")


def test_bad_curve_arguments_are_one_line_named_as_the_stack_spells_them_before_the_model_loads(checkpoint,
                                                                                                   monkeypatch):
    from lm_eval.models.huggingface import HFLM

    monkeypatch.setattr(HFLM, "__init__", lambda *a, **k: pytest.fail("the model loaded before the check"))
    for arguments, error, match in (
            ({"lpes_scales": "abc"}, ScalesError, r"^lpes_scales='abc' is not understood"),
            ({"lpes_scales": "1;2"}, ScalesError, r"^lpes_scales='1;2' gives 2 scales but the model has 4 decoder"),
            ({"lpes_scales": "1.2", "lpes_scaling": "both"}, ScalesError,
             r"^lpes_scales='1.2' with lpes_scaling=both is ambiguous"),
            ({"lpes_scaling": "base"}, MethodError, r"^pcd_hf: lpes_scaling='base' says .* no lpes_scales= gives")):
        with pytest.raises(error, match=match) as err:
            PCDLM(pretrained=checkpoint, device="cpu", **arguments)
        assert "\n" not in str(err.value)


def test_stacks_through_lm_eval_identity_reconfigure_and_model_info(checkpoint, tmp_path):
    plain = plain_lm_answers(checkpoint)
    curve = ";".join(map(str, CURVES["position"]))
    # The identity of both halves: the plain model's answers, the stack named in the model info.
    lm = PCDLM(pretrained=checkpoint, device="cpu", batch_size=3, lpes_scales=1, weight=0)
    info = lm.get_model_info()
    assert (info["stack"], info["lpes_scales"], info["lpes_scaling"]) == ("lpes+pcd", [1.0] * 4, "position")
    assert (lm_loglikelihoods(lm), lm_generations(lm)) == plain
    # A curve under PCD at its identity: the curve's answers (lpes_hf's).
    lpes = LPESLM(pretrained=checkpoint, device="cpu", batch_size=3, scales=curve)
    curve_answers = lm_loglikelihoods(lpes), lm_generations(lpes)
    lm.reconfigure(lpes_scales=curve, weight=0)
    assert (lm_loglikelihoods(lm), lm_generations(lm)) == curve_answers != plain
    # A real stack: the contrast of the curve's model with its lowered copy, at the answer.
    lm.reconfigure(lpes_scales=curve, base_ratio=0.05, weight=1)
    assert rope.get_scales(lm.model) == CURVES["position"] and pcd.SLOT.find(lm.model) is not None
    scores = lm_loglikelihoods(lm)
    context, continuation = LM_REQUESTS[0]
    ctx, cont = lm.tok_encode(context), lm.tok_encode(continuation)
    model = stacked(CURVES["position"], "position", "pcd", {"base_ratio": 0.05, "weight": 1})  # the checkpoint's
    with torch.no_grad():
        contrast = pcd.forward_logits(model, torch.tensor([ctx + cont[:-1]]))[0, len(ctx) - 1:]
    expected = torch.log_softmax(contrast, -1)[torch.arange(len(cont)), torch.tensor(cont)].sum().item()
    assert scores[0][0] == pytest.approx(expected, abs=1e-5) and scores != curve_answers[0]
    with pytest.raises(ScalesError, match="^lpes_scales='abc'"):  # checked before anything comes off
        lm.reconfigure(lpes_scales="abc", weight=0)
    assert rope.get_scales(lm.model) == CURVES["position"] and lm_loglikelihoods(lm) == scores
    # Reconfigured without lpes_scales, as a load without it: the method alone (here its identity: plain).
    lm.reconfigure(weight=0)
    assert not rope.is_installed(lm.model) and pcd.SLOT.find(lm.model) is None and "stack" not in lm.get_model_info()
    assert (lm_loglikelihoods(lm), lm_generations(lm)) == plain
    # A scales file says its own scaling: lpes+fitm on a curve of scaling both.
    path = tmp_path / "scales.json"
    write_scales_file(path, CURVES["both"], scaling="both")
    stack = FitMLM(pretrained=checkpoint, device="cpu", batch_size=3, lpes_scales=str(path), strength=0)
    assert stack.get_model_info()["stack"] == "lpes+fitm" and rope.get_scaling(stack.model) == "both"
    both = LPESLM(pretrained=checkpoint, device="cpu", batch_size=3, scales=str(path))
    assert lm_loglikelihoods(stack) == lm_loglikelihoods(both)


@pytest.mark.parametrize("name", STACKING)
def test_a_stacks_run_is_reported_as_lpes_plus_the_method_and_the_method_alone_as_itself(name):
    from lpes_harness.evaluation.leaderboard_rows import baseline_row
    from lpes_harness.methods import run_of

    entry = METHODS[name]
    alone, stack = run_of(entry.lm_eval, {}), run_of(entry.lm_eval, {"lpes_scales": "results/x/scales.json"})
    assert alone.label == entry.label and stack.label == f"LPES+{entry.label}"
    assert (stack.name, stack.module, stack.lm_target) == (entry.name, entry.module, entry.lm_target)
    row_entry, setting, _ = baseline_row(entry.lm_eval, {"lpes_scales": "results/x/scales.json"}, "a record")
    assert row_entry.label == f"LPES+{entry.label}" and "lpes_scales=results/x/scales.json" in setting
