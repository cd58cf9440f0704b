"""The three training-free rivals of issue #45 as lm-eval models, on tiny random models built in code.

Positional hidden-state scaling (``poshidden_hf``), Found-in-the-Middle attention calibration
(``fitm_hf``) and STRING (``string_hf``): each one's identity setting is the plain model bit for
bit, a real setting changes the logits (and only where the method says), cached decoding equals
one forward over the whole sequence, families they cannot run on are refused in one line, bad
arguments are one line, and the channel statistic writes a file ``poshidden_hf`` reads.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import converted_bundled_model
from tiny_models import LM_REQUESTS, lm_generations, lm_loglikelihoods, plain_lm_answers, assert_same_greedy_steps, logits, random_ids, tiny_family_model, tiny_gemma3, tiny_model, tiny_tokenizer

from lpes_harness.methods import fitm, poshidden, string_shift

from lpes_harness.commands import poshidden_channel
from lpes_harness.evaluation import poshidden_channels
from lpes_harness.methods.arguments import MethodError
from lpes_harness.lmeval.method_lm import BOUND
from lpes_harness.lmeval.method_models import FitMLM, PosHiddenLM

ARCHS = ("llama", "qwen2", "mistral", "gemma3")
DUMMY = [5, 6, 7]


def build(arch: str, **kwargs):
    return tiny_gemma3(**kwargs) if arch == "gemma3" else tiny_model(arch, **kwargs)


def left_padded(length=24, batch=2, pad=4):
    ids = random_ids(length, batch=batch)
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0
    return ids, mask


# ----------------------------------------------------------------------------- identity and change


@pytest.mark.parametrize("arch", ARCHS)
def test_poshidden_factor_one_runs_its_path_and_is_the_plain_model_bit_for_bit(arch):
    model = build(arch)
    ids, mask = left_padded()
    plain, plain_masked = logits(model, ids), logits(model, ids, attention_mask=mask)
    with torch.no_grad():
        plain_generated = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    poshidden.install(model, channels=[3, 17], factor=1.0, layers="0:")
    assert torch.equal(logits(model, ids), plain)
    assert torch.equal(logits(model, ids, attention_mask=mask), plain_masked)
    with torch.no_grad():
        assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False), plain_generated)


@pytest.mark.parametrize("arch", ARCHS)
def test_poshidden_answer_rows_own_pass_at_factor_one_is_the_plain_attention_up_to_rounding(arch, monkeypatch):
    """Factor 1 skips the answer rows' second attention (the scaled queries are the plain ones); forced to run
    it anyway, that sliced pass, with its additive mask, gives the full square's numbers but for rounding."""
    from dataclasses import replace

    model = build(arch)
    ids, mask = left_padded()
    plain, plain_masked = logits(model, ids), logits(model, ids, attention_mask=mask)
    monkeypatch.setattr(poshidden, "FACTOR", replace(poshidden.FACTOR, identity=None))  # no skip at factor 1
    poshidden.install(model, channels=[3, 17], factor=1.0, layers="0:")
    last = logits(model, ids), logits(model, ids, attention_mask=mask)  # a bare forward: its last column
    with poshidden.answer_queries_from(model, 10):
        from_ten = logits(model, ids), logits(model, ids, attention_mask=mask)
    for ours, theirs in ((last[0], plain), (last[1], plain_masked), (from_ten[0], plain), (from_ten[1], plain_masked)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert torch.equal(from_ten[0][:, :10], plain[:, :10]) and torch.equal(last[0][:, :-1], plain[:, :-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_poshidden_changes_the_answer_queries_only(arch):
    model = build(arch)
    ids = random_ids(24, batch=2)
    plain = logits(model, ids)
    poshidden.install(model, channels=[3, 17], factor=0.0, layers="0:")
    assert torch.equal(logits(model, ids)[:, :-1], plain[:, :-1]), "a bare forward changes its last query only"
    assert (logits(model, ids)[:, -1] - plain[:, -1]).abs().max() > 1e-3
    with poshidden.answer_queries_from(model, 15):
        ours = logits(model, ids)
    assert torch.equal(ours[:, :15], plain[:, :15])
    assert (ours[:, 15:] - plain[:, 15:]).abs().amax(-1).min() > 1e-4


def rewritten(model) -> list[bool]:
    """Per layer: is its attention's forward replaced (a rewrite installed)?"""
    return ["forward" in vars(layer.self_attn) for layer in model.model.layers]


def test_string_off_installs_nothing_and_s_equal_w_only_applies_the_factor():
    model = tiny_model("llama")
    ids, mask = left_padded(40)
    plain, plain_masked = logits(model, ids), logits(model, ids, attention_mask=mask)
    string_shift.install(model, shifted_offset=0)
    # Off is the plain model because nothing is installed (the reference's ``if shifted_offset > 1``), which
    # is all this shows: the rewrite itself at its identity is checked by the test below, on every family.
    assert not any(rewritten(model)) and string_shift.settings(model)["attention_factor"] == 1.0
    assert torch.equal(logits(model, ids), plain)
    string_shift.remove(model)
    string_shift.install(model, shifted_offset=16, local_window=16, attention_factor=1.0)  # shift S - W = 0
    torch.testing.assert_close(logits(model, ids), plain, rtol=1e-5, atol=1e-5)
    real = mask.bool()  # padding queries differ (sdpa vs a uniform row), they are never read
    torch.testing.assert_close(logits(model, ids, attention_mask=mask)[real], plain_masked[real], rtol=1e-5, atol=1e-5)
    string_shift.remove(model)
    string_shift.install(model, shifted_offset=12, local_window=4, attention_factor=1.0)
    shifted = logits(model, ids)
    torch.testing.assert_close(shifted[:, :12], plain[:, :12], rtol=1e-5, atol=1e-5)  # no distance reaches S yet
    assert (shifted[:, 12:] - plain[:, 12:]).abs().max() > 1e-3, "distances >= S must move"
    string_shift.remove(model)
    assert torch.equal(logits(model, ids), plain)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_string_rewrite_at_its_identity_is_the_plain_model(arch, attn, monkeypatch):
    """STRING's rewrite installed, at settings that are the plain model by its definition (attention factor
    1, and no distance shifted: ``S`` beyond the prompt, or ``S = W``, a shift of ``S - W = 0``).

    ``S`` beyond the prompt in one block of queries: every key is scored by the near rotation in one product
    over all keys, then the same scaling, masked softmax and weighted sum as eager attention: bit for bit
    against an eager model. ``S = W``: the far rotation (recomputed from the positions) is used for the keys
    at distance >= S, the keys split over up to three products per block, in blocks of 7 or one; against
    sdpa, another kernel: the same sums in another order, within 1e-5 (float32 rounding of logits ~1; the
    difference seen is under 1e-6), the tolerance of the rivals' other identity checks."""
    model = build(arch, attn_implementation=attn)
    ids, mask = left_padded(40)
    real = mask.bool()  # padding queries differ (the kernel's row vs a uniform one), they are never read
    plain, plain_masked = logits(model, ids), logits(model, ids, attention_mask=mask)
    for offset, window, block in ((64, 1, 256), (16, 16, 256), (16, 16, 7)):
        monkeypatch.setattr(string_shift, "QUERY_BLOCK", block)
        string_shift.install(model, shifted_offset=offset, local_window=window, attention_factor=1.0)
        assert all(rewritten(model)), "the rewrite must be installed in every layer"
        ours, ours_masked = logits(model, ids), logits(model, ids, attention_mask=mask)
        if attn == "eager" and offset > ids.shape[1] and block >= ids.shape[1]:
            assert torch.equal(ours, plain) and torch.equal(ours_masked[real], plain_masked[real]), (offset, window)
        torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours_masked[real], plain_masked[real], rtol=1e-5, atol=1e-5)
        string_shift.remove(model)
    assert not any(rewritten(model)) and torch.equal(logits(model, ids), plain)


def _naive_string_attention(attn, rotary, hidden, shifted_offset, local_window, factor):
    """One layer's STRING attention from its definition: key j read by query i at distance
    d = i - j if d < S else d - S + W, by rotating the query alone by that distance (RoPE scores
    depend on the distance only)."""
    n, d_head = hidden.shape[1], attn.head_dim
    q = attn.q_proj(hidden).view(1, n, -1, d_head).transpose(1, 2)
    k = attn.k_proj(hidden).view(1, n, -1, d_head).transpose(1, 2)
    v = attn.v_proj(hidden).view(1, n, -1, d_head).transpose(1, 2)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    out = torch.zeros_like(q)
    for i in range(n):
        distance = i - torch.arange(i + 1)
        read = torch.where(distance >= shifted_offset, distance - shifted_offset + local_window, distance)
        cos, sin = rotary(hidden, position_ids=read[None])
        rotated = q[:, :, i : i + 1] * cos[:, None] + torch.cat((-q[:, :, i : i + 1, d_head // 2 :],
                                                                   q[:, :, i : i + 1, : d_head // 2]), -1) * sin[:, None]
        zero_cos, zero_sin = rotary(hidden, position_ids=torch.zeros(1, i + 1, dtype=torch.long))
        keys = k[:, :, : i + 1] * zero_cos[:, None] + torch.cat((-k[:, :, : i + 1, d_head // 2 :],
                                                                  k[:, :, : i + 1, : d_head // 2]), -1) * zero_sin[:, None]
        scores = (rotated * keys).sum(-1) * attn.scaling * factor**2  # (1, H, i + 1)
        out[:, :, i] = torch.einsum("bhj,bhjd->bhd", torch.softmax(scores, -1), v[:, :, : i + 1])
    return attn.o_proj(out.transpose(1, 2).reshape(1, n, -1))


@pytest.mark.parametrize("block", [1, 7, 10, 64])
def test_string_matches_its_definition_on_one_layer_in_any_blocks_of_queries(monkeypatch, block):
    """The attention runs over blocks of queries, each on the keys it may see, with a band where the
    block's rows disagree about the shift: every split (one row, narrower than S, S itself, one block
    of all 30) gives the definition's scores, and a left-padded batch its real rows as one block does."""
    model = tiny_model("llama")
    ids = random_ids(30)
    captured = {}
    attn = model.model.layers[1].self_attn
    def capture(module, args, kwargs, out):
        captured.update(h=kwargs["hidden_states"] if "hidden_states" in kwargs else args[0], out=out[0])

    attn.register_forward_hook(capture, with_kwargs=True)
    string_shift.install(model, shifted_offset=10, local_window=3, attention_factor=1.1)
    monkeypatch.setattr(string_shift, "QUERY_BLOCK", block)
    with torch.no_grad():
        model(ids)
        expected = _naive_string_attention(attn, model.model.rotary_emb, captured["h"], 10, 3, 1.1)
    torch.testing.assert_close(captured["out"], expected, rtol=1e-4, atol=1e-5)
    padded, mask = left_padded(40)
    in_blocks = logits(model, padded, attention_mask=mask)
    monkeypatch.setattr(string_shift, "QUERY_BLOCK", 1024)
    real = mask.bool()
    torch.testing.assert_close(in_blocks[real], logits(model, padded, attention_mask=mask)[real], rtol=1e-5, atol=1e-5)


def test_fitm_near_zero_strength_runs_its_path_and_stays_at_the_plain_model():
    model = tiny_model("qwen2")
    ids, mask = left_padded(32)
    plain_masked = logits(model, ids, attention_mask=mask)
    fitm.install(model, strength=1e-6, num_spans=4, dummy_ids=DUMMY, layers="0:")
    with torch.no_grad():
        ours = fitm.forward_logits(model, ids, attention_mask=mask)
    torch.testing.assert_close(ours, plain_masked, rtol=1e-5, atol=1e-5)


# left_padded's row 0 is padded by 4, its prompt ends at column 20 (17 tokens); row 1 has no padding and ends at
# 25 (26 tokens): cut into 4 spans of equal token count (region 0:1), they are these [start, end) columns.
FITM_QUERY_START = [20, 25]
FITM_SPANS = [[[4, 8], [8, 12], [12, 16], [16, 21]], [[0, 6], [6, 13], [13, 19], [19, 26]]]


def _attention_inputs(model, layer, ids, mask):
    """Hidden states and (cos, sin) that layer ``layer``'s attention receives in one forward of the model."""
    captured = {}

    def capture(module, args, kwargs):
        captured.update(hidden=kwargs["hidden_states"] if "hidden_states" in kwargs else args[0],
                        rope=kwargs["position_embeddings"])

    handle = model.model.layers[layer].self_attn.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        logits(model, ids, attention_mask=mask)
    finally:
        handle.remove()
    return captured["hidden"], captured["rope"]


def _visible(model, layer, mask):
    """(B, n, n): key j is seen by query i if j <= i, j is no padding, and within a sliding layer's window."""
    n = mask.shape[1]
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    seen = (distance >= 0)[None] & mask.bool()[:, None, :]
    if (getattr(model.config, "layer_types", None) or [None] * (layer + 1))[layer] == "sliding_attention":
        seen &= (distance < model.config.sliding_window)[None]
    return seen


def _plain_weights(attn, hidden, rope, visible):
    """softmax(q . k x scaling) over the visible keys, ``(B, H, n, n)``, and the values ``(B, H, n, D)``,
    from the layer's own projections (and Gemma-3's q / k norms)."""
    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos[:, None] + torch.cat((-x[..., half:], x[..., :half]), -1) * sin[:, None]

    shape = (*hidden.shape[:2], -1, attn.head_dim)
    q, k, v = (proj(hidden).view(shape).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = rotate(q, *rope), rotate(k, *rope)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-1, -2) * attn.scaling).masked_fill(~visible[:, None], float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0), v  # a padding query sees nothing: never read


def _calibrated_query(plain, dummies, spans, seen, temperature, strength):
    """One query's weights ``(H, n)`` calibrated as the paper defines it: span k's mean per-token weight A_k,
    its dummy copy's D_k on the dummy span (both over the keys the query sees); the spans' new means are in
    proportion softmax_k((A_k - D_k) / t), their total weight kept, each span's weights keeping their
    proportions; keys outside every span keep theirs; ``strength`` mixes the result with the plain weights."""
    calibrated = plain.clone()
    keys = [torch.arange(start, end)[seen[start:end]] for start, end in spans]
    for head in range(plain.shape[0]):
        kept = [k for k, ks in enumerate(keys) if len(ks) and plain[head, ks].sum() > 0]
        if not kept:
            continue
        mass = {k: plain[head, keys[k]].sum() for k in kept}
        relevance = torch.stack([(mass[k] - dummies[k][head, keys[k]].sum()) / len(keys[k]) for k in kept])
        alpha = torch.softmax(relevance / temperature, 0)
        total, norm = sum(mass.values()), sum(a * len(keys[k]) for a, k in zip(alpha, kept))
        for a, k in zip(alpha, kept):
            calibrated[head, keys[k]] = plain[head, keys[k]] * (total * a * len(keys[k]) / norm) / mass[k]
    return plain + strength * (calibrated - plain)


@pytest.mark.parametrize("strength", [0.5, 1.0])
@pytest.mark.parametrize("arch, layer", [("llama", 2), ("qwen2", 3), ("mistral", 2), ("gemma3", 0), ("gemma3", 1)])
def test_fitm_calibration_at_real_strengths_matches_its_definition(arch, layer, strength):
    """The calibration path end to end (the dummy copies built and run, the spans cut, Eq. 4-6 applied at the
    answer queries, mixed by ``strength``) against a reference written from the definition: the plain model
    run on the prompt and on each dummy copy, per query and head. Gemma-3's layer 0 is a sliding one (window
    8): late queries see part of a span or none. Within float32 rounding (1e-4 relative, 1e-5 absolute)."""
    model = build(arch)
    attn, temperature = model.model.layers[layer].self_attn, 0.02
    ids, mask = left_padded(32)
    visible = _visible(model, layer, mask)
    with torch.no_grad():
        weights, values = _plain_weights(attn, *_attention_inputs(model, layer, ids, mask), visible)
        dummy_weights = []
        for k in range(4):
            copy = ids.clone()
            for row, spans in enumerate(FITM_SPANS):
                start, end = spans[k]
                copy[row, start:end] = torch.tensor(DUMMY).repeat(end - start)[: end - start]
            dummy_weights.append(_plain_weights(attn, *_attention_inputs(model, layer, copy, mask), visible)[0])
        expected = weights.clone()
        for row, first in enumerate(FITM_QUERY_START):
            for query in range(first, ids.shape[1]):
                dummies = [d[row, :, query] for d in dummy_weights]
                expected[row, :, query] = _calibrated_query(weights[row, :, query], dummies, FITM_SPANS[row],
                                                            visible[row, query], temperature, strength)
        merge = lambda w: attn.o_proj((w @ values).transpose(1, 2).reshape(*ids.shape, -1))  # noqa: E731
        plain_out, expected_out = merge(weights), merge(expected)
    captured = {}
    attn.register_forward_hook(lambda module, args, out: captured.update(out=out[0]))
    fitm.install(model, strength=strength, temperature=temperature, num_spans=4, region="0:1", layers=str(layer),
                 dummy_ids=DUMMY)
    with torch.no_grad():
        fitm.forward_logits(model, ids, attention_mask=mask, query_start=FITM_QUERY_START)
    assert fitm.get_state(model).spans.tolist() == FITM_SPANS
    ours, real = captured["out"][: len(ids)], mask.bool()
    torch.testing.assert_close(ours[real], expected_out[real], rtol=1e-4, atol=1e-5)
    answers = torch.zeros_like(real)
    for row, first in enumerate(FITM_QUERY_START):
        answers[row, first:] = True
    assert (ours - plain_out)[answers].abs().max() > 1e-3, "the calibration must change the answer queries"
    torch.testing.assert_close(ours[real & ~answers], plain_out[real & ~answers], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_fitm_changes_the_answer_queries_only(arch):
    model = build(arch)
    ids = random_ids(32, batch=2)
    plain = logits(model, ids)
    fitm.install(model, num_spans=4, dummy_ids=DUMMY, temperature=1e-2)
    with torch.no_grad():
        ours = fitm.forward_logits(model, ids, query_start=[20, 25])
    assert torch.equal(ours[0, :20], plain[0, :20]) and torch.equal(ours[1, :25], plain[1, :25])
    assert (ours[0, 20:] - plain[0, 20:]).abs().amax(-1).min() > 1e-4


def test_fitm_calibration_is_the_papers_eq_5():
    torch.manual_seed(0)
    batch, heads, queries, keys, spans = 2, 3, 2, 20, 4
    plain = torch.softmax(torch.randn(batch, heads, queries, keys), -1)
    dummy = torch.softmax(torch.randn(spans, batch, heads, queries, keys), -1)
    member = torch.zeros(batch, spans, keys, dtype=torch.bool)
    for k in range(spans):
        member[:, k, 2 + 4 * k : 6 + 4 * k] = True  # keys 0, 1 and 18, 19 are in no span
    t = 0.05
    new = fitm.calibrate(plain, dummy, member, t)
    inside = member.any(1)[:, None, None, :]
    torch.testing.assert_close(new.sum(-1), plain.sum(-1))  # total attention kept ...
    torch.testing.assert_close((new * inside).sum(-1), (plain * inside).sum(-1))  # ... and the spans' total
    assert torch.equal(new[~inside.expand_as(new)], plain[~inside.expand_as(plain)])  # keys in no span untouched
    w = member.float()
    mean = torch.einsum("bhqj,bkj->bhqk", plain, w) / 4
    rel = mean - torch.einsum("kbhqj,bkj->bhqk", dummy, w) / 4
    new_mean = torch.einsum("bhqj,bkj->bhqk", new, w) / 4
    torch.testing.assert_close(new_mean / new_mean.sum(-1, keepdim=True), torch.softmax(rel / t, -1))
    # within a span the weights keep their proportions
    share = lambda w: w[..., 2:6] / w[..., 2:6].sum(-1, keepdim=True)  # noqa: E731
    torch.testing.assert_close(share(new), share(plain))
    assert torch.equal(fitm.calibrate(plain, dummy, member, t, strength=0.0), plain)
    # a span's mean is over the keys the query sees: hiding keys no span holds changes nothing ...
    visible = torch.ones(1, 1, queries, keys, dtype=torch.bool)
    hidden = visible.clone()
    hidden[..., :2] = False
    cut = lambda w: w.masked_fill(~hidden, 0.0)  # noqa: E731
    torch.testing.assert_close(fitm.calibrate(cut(plain), cut(dummy), member, t, visible=hidden),
                               fitm.calibrate(cut(plain), cut(dummy), member, t))
    # ... and hiding half of span 0 halves its count: its mean doubles, as if it held 2 keys
    hidden[..., 2:4] = False
    two_keys = member.clone()
    two_keys[:, 0, 2:4] = False
    torch.testing.assert_close(fitm.calibrate(cut(plain), cut(dummy), member, t, visible=hidden),
                               fitm.calibrate(cut(plain), cut(dummy), two_keys, t))


def test_fitm_spans_and_dummy_copies():
    ids = torch.arange(3, 43).repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, :10] = 0
    spans = fitm.prompt_spans(ids, mask, torch.tensor([39, 29]), 4, (0.0, 1.0))
    assert spans[0].tolist() == [[0, 10], [10, 20], [20, 30], [30, 40]]
    assert spans[1].tolist() == [[10, 15], [15, 20], [20, 25], [25, 30]]  # the prompt: columns 10..29
    copies = fitm.dummy_copies(ids, spans, [90, 91])
    assert copies.shape == (5 * 2, 40)
    assert torch.equal(copies[:2], ids)
    assert copies[2 * 2 + 1, 15:20].tolist() == [90, 91, 90, 91, 90]  # copy 2, row 1: its span 1
    assert torch.equal(copies[2 * 2 + 1, :15], ids[1, :15]) and torch.equal(copies[2 * 2 + 1, 20:], ids[1, 20:])
    # three spans to a copy: copy 1 replaces spans 0-2 (columns 0..29 of row 0), copy 2 span 3 alone
    grouped = fitm.dummy_copies(ids, spans, [90, 91], spans_per_copy=3)
    assert grouped.shape == (3 * 2, 40) and fitm.copy_count(4, 3) == 2
    assert grouped[2, :30].tolist() == [90, 91] * 15 and torch.equal(grouped[2, 30:], ids[0, 30:])
    assert torch.equal(grouped[4, :30], ids[0, :30]) and grouped[4, 30:].tolist() == [90, 91] * 5
    one = fitm.dummy_copies(ids, spans, [90, 91], spans_per_copy=4)  # one copy: the dummy in every span
    assert one.shape == (2 * 2, 40) and one[2].tolist() == [90, 91] * 20
    assert one[3].tolist() == ids[1, :10].tolist() + [90, 91, 90, 91, 90] * 4 + ids[1, 30:].tolist()


def test_fitm_one_copy_for_every_span_measures_each_spans_bias_on_that_copy(monkeypatch):
    model = tiny_model("qwen2")
    ids = random_ids(32, batch=2)
    seen = []
    real_calibrate = fitm.calibrate
    monkeypatch.setattr(fitm, "calibrate", lambda plain, dummy, *a, **k: seen.append(dummy) or real_calibrate(plain, dummy, *a, **k))
    fitm.install(model, num_spans=4, spans_per_copy=4, dummy_ids=DUMMY, temperature=1e-2)
    with torch.no_grad():
        fitm.forward_logits(model, ids)
    assert seen and all(d.shape[0] == 4 and all(torch.equal(d[k], d[0]) for k in range(4)) for d in seen)
    seen.clear()
    fitm.remove(model)
    fitm.install(model, num_spans=4, dummy_ids=DUMMY, temperature=1e-2)  # the paper's: a copy per span
    with torch.no_grad():
        fitm.forward_logits(model, ids)
    assert seen and all(not torch.equal(d[1], d[0]) for d in seen)


@pytest.mark.parametrize("spans_per_copy", [1, 2])
def test_fitm_decoding_on_a_sliding_windows_cache_gives_the_full_forwards_logits(spans_per_copy):
    # Gemma-3's sliding layers (window 8) keep only the keys they see: a span partly out of the window
    # must be averaged over its visible keys in both computations (the tokens alone matched by chance).
    from transformers import DynamicCache

    model = build("gemma3")
    ids, mask = left_padded(16, pad=3)
    positions = lambda m: (m.cumsum(-1) - 1).masked_fill(m == 0, 1)  # noqa: E731
    fitm.install(model, num_spans=3, dummy_ids=DUMMY, temperature=1e-2, region="0:1", layers="2",
                 spans_per_copy=spans_per_copy)  # layer 2: a sliding one
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        token = fitm.forward_logits(model, ids, mask, positions(mask), cache, last_only=True).argmax(-1, keepdim=True)
        longer = torch.cat([mask, mask.new_ones(2, 1)], -1)
        cached = fitm.forward_logits(model, token, longer, positions(longer)[:, -1:], cache, last_only=True)
        full = fitm.forward_logits(model, torch.cat([ids, token], -1), longer, positions(longer),
                                   query_start=[ids.shape[1] - 1] * 2)[:, -1]
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- cached decoding


def _recompute(next_logits, ids, mask, steps):
    """Greedy decoding by one forward over the whole sequence per step (no cache): the sequence, and each
    step's logits ``(steps, B, V)``."""
    sequence, scores = ids, []
    for _ in range(steps):
        full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], sequence.shape[1] - ids.shape[1])], -1)
        scores.append(next_logits(sequence, full_mask))
        sequence = torch.cat([sequence, scores[-1].argmax(-1, keepdim=True)], -1)
    return sequence, torch.stack(scores)


@pytest.mark.parametrize("rival", ["poshidden", "string", "fitm", "fitm_two_copies"])
@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_cached_generation_equals_full_recomputation(rival, arch, monkeypatch):
    # Gemma-3: a 16-token prompt and 8 new tokens against a sliding window of 8 (its cache drops keys).
    model = build(arch)
    ids, mask = left_padded(16, pad=3)
    last = ids.shape[1] - 1
    positions = lambda m: (m.cumsum(-1) - 1).masked_fill(m == 0, 1)  # noqa: E731
    with torch.no_grad():
        if rival.startswith("fitm"):
            fitm.install(model, num_spans=3, dummy_ids=DUMMY, temperature=1e-2, region="0:1",
                         spans_per_copy=2 if rival == "fitm_two_copies" else 1)
            full_logits, cached_logits = fitm.forward_logits, []
            monkeypatch.setattr(fitm, "forward_logits",  # what generate's steps score on the cache
                                lambda *a, **k: cached_logits.append(full_logits(*a, **k)) or cached_logits[-1])
            cached = fitm.generate(model, ids, attention_mask=mask, max_new_tokens=8)
            cached_logits = torch.stack(cached_logits)
            full, full_scores = _recompute(
                lambda s, m: full_logits(model, s, m, positions(m), query_start=[last] * 2)[:, -1], ids, mask, 8)
        else:
            if rival == "poshidden":
                poshidden.install(model, channels=[3, 17], factor=-1.0, layers="0:")
                context = poshidden.answer_queries_from(model, last)
            else:
                string_shift.install(model, shifted_offset=6, local_window=2)
                context = torch.no_grad()
            generated = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                       output_logits=True, return_dict_in_generate=True)
            cached, cached_logits = generated.sequences, torch.stack(generated.logits)
            with context:
                def step(s, m):
                    return model(s, attention_mask=m, position_ids=positions(m), use_cache=False).logits[:, -1]

                full, full_scores = _recompute(step, ids, mask, 8)
    assert_same_greedy_steps(cached, full, cached_logits, full_scores)


# ----------------------------------------------------------------------------- refusals and errors

INSTALL = {
    "poshidden": lambda model: poshidden.install(model, channels=[1], factor=0.0),
    "string": lambda model: string_shift.install(model, shifted_offset=8, local_window=2),
    "fitm": lambda model: fitm.install(model, dummy_ids=DUMMY),
}
NAMES = {"poshidden": "poshidden_hf", "string": "string_hf", "fitm": "fitm_hf"}


@pytest.mark.parametrize("rival", sorted(INSTALL))
@pytest.mark.parametrize("family, config, model_class, overrides, reason", [
    ("phi3", "Phi3Config", "Phi3ForCausalLM", {}, "its attention has parts"),
    ("cohere", "CohereConfig", "CohereForCausalLM", {"logit_scale": 1.0}, "interleaved"),
    ("gemma2", "Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "query_pre_attn_scalar": 16}, "attn_logit_softcapping"),
])
def test_unsupported_families_are_refused_in_one_line(rival, family, config, model_class, overrides, reason):
    model = tiny_family_model(config, model_class, attn_implementation="eager", **overrides)
    if model is None:
        pytest.skip(f"transformers has no {model_class}")
    ids = random_ids(12)
    plain = logits(model, ids)
    with pytest.raises(MethodError) as err:
        INSTALL[rival](model)
    message = str(err.value)
    assert "\n" not in message and f"{NAMES[rival]} cannot run on model type '{family}'" in message and reason in message
    assert torch.equal(logits(model, ids), plain), "a refused rival leaves nothing behind"


@pytest.mark.parametrize("rival", sorted(INSTALL))
def test_an_attention_kernel_they_do_not_rewrite_is_named(rival):
    model = tiny_model("llama")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(MethodError, match=f"{NAMES[rival]} rewrites the attention .* the model uses 'flex_attention'"):
        INSTALL[rival](model)


@pytest.mark.parametrize("make, match", [
    (lambda p: PosHiddenLM(pretrained=p), r"poshidden_hf needs the channel to scale: setting=<file from `python -m "),
    (lambda p: PosHiddenLM(pretrained=p, channels="3", factor=2), r"factor=2 is out of range; give a number in \[-1, 1\]"),
    (lambda p: PosHiddenLM(pretrained=p, channels="x", factor=0), r"channels='x' is not understood"),
    (lambda p: PosHiddenLM(pretrained=p, setting=p + "/none.json"), r"setting file not found: .*none.json"),
    (lambda p: FitMLM(pretrained=p, strength=1.5), r"fitm_hf: strength=1.5 is out of range; give a number in \[0, 1\]"),
    (lambda p: FitMLM(pretrained=p, num_spans=1), r"num_spans=1 is out of range; give an integer in \[2, 64\]"),
    (lambda p: FitMLM(pretrained=p, temperature="warm"), r"temperature='warm' is not a number"),
    (lambda p: FitMLM(pretrained=p, region="0.9:0.1"), r"region='0.9:0.1': need 0 <= start < end <= 1"),
    (lambda p: BOUND.string(pretrained=p, shifted_offset=100), r"shifted_offset=100 is below local_window=128"),
    (lambda p: BOUND.string(pretrained=p, shifted_ratio=2), r"shifted_ratio=2 is out of range"),
    (lambda p: BOUND.string(pretrained=p, shifted_offset=2.5), r"shifted_offset=2.5 is not allowed; give an integer >= 0"),
    (lambda p: BOUND.string(pretrained=p, attention_factor=0), r"attention_factor=0 is out of range"),
])
def test_argument_errors_are_one_line_and_come_before_the_model_loads(tmp_path, make, match):
    with pytest.raises(MethodError, match=match) as err:
        make(str(tmp_path / "no_model_here"))
    assert "\n" not in str(err.value)


def test_a_setting_file_of_another_format_or_model_is_refused(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(MethodError, match="has format 'something-else', not 'lpes-poshidden/1'"):
        PosHiddenLM(pretrained=str(tmp_path / "x"), setting=str(other))
    with pytest.raises(MethodError, match=r"channels=\[99\]: the model's hidden size is 64"):
        poshidden.install(tiny_model("llama"), channels=[99])
    setting = dict(format="lpes-poshidden/1", channels=[3], layers=[1], factor=0.0, hidden_size=128, num_layers=4)
    with pytest.raises(MethodError, match=r"measured on another model: hidden_size 128 \(this model: 64\)"):
        expect = poshidden.resolve_arguments(setting=_write(tmp_path, setting))["expect"]
        poshidden.check_setting_shape(tiny_model("llama"), expect, "f")


def _write(tmp_path, setting) -> str:
    path = tmp_path / "setting.json"
    path.write_text(json.dumps(setting))
    return str(path)


# ----------------------------------------------------------------------------- the channel statistic


def test_the_statistic_finds_a_planted_positional_channel():
    rng = np.random.default_rng(0)
    layers, length, hidden = 12, 300, 16
    mean = rng.normal(size=(layers, length, hidden)) * 0.3
    trend = np.log1p(np.arange(length))
    for layer in range(1, 11):
        mean[layer, :, 5] = -2.0 * trend + rng.normal(size=length) * 0.01  # falls with position, smoothly
        mean[layer, :, 9] = trend + rng.normal(size=length) * 0.3  # rises, but noisily
    ranked = poshidden_channels.rank_channels(mean, top_k=3)
    assert ranked[0]["channel"] == 5 and ranked[0]["direction"] == "falling"
    assert ranked[0]["monotone_layers"] == list(range(2, 11))
    assert poshidden.default_layers(32) == list(range(10, 26))  # the reference's 7B band
    assert poshidden.default_layers(30) == list(range(9, 24)) and poshidden.default_layers(4) == [1, 2]


@pytest.fixture(scope="module")
def eight_layer_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama8")
    model = tiny_model("llama", num_hidden_layers=8)
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = 1, 2, 0
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def test_the_measurement_command_writes_a_file_the_model_argument_reads(eight_layer_checkpoint, tmp_path, capsys):
    out = tmp_path / "setting.json"
    assert poshidden_channel.main(["--pretrained", eight_layer_checkpoint, "--out", str(out), "--samples", "4",
                                   "--length", "80", "--top-k", "3"]) == 0
    setting = json.loads(out.read_text())
    assert setting["format"] == "lpes-poshidden/1" and setting["factor"] == 0.0 and setting["hidden_size"] == 64
    assert setting["channels"] == [setting["candidates"][0]["channel"]] and setting["layers"] == [2, 3, 4, 5]
    assert setting["factor_candidates"] == [0.5, 0.0, -0.5, -1.0]
    lm = PosHiddenLM(pretrained=eight_layer_checkpoint, setting=str(out), device="cpu")
    state = poshidden.get_state(lm.model)
    assert (state.channels, state.factor, state.layers) == (setting["channels"], 0.0, [2, 3, 4, 5])
    assert poshidden.get_state(PosHiddenLM(pretrained=eight_layer_checkpoint, setting=str(out), factor=-0.5,
                                           device="cpu").model).factor == -0.5  # an explicit argument wins
    assert "candidates (smoothest first)" in capsys.readouterr().out


def test_the_measurement_command_with_a_task_writes_the_selections_channel_and_factor(eight_layer_checkpoint, tmp_path):
    """``--select-task`` scores the first candidates through ``poshidden_hf`` (it named a class that had moved
    to lmeval/, and the command failed after its statistic: nothing ran that path)."""
    out = tmp_path / "setting.json"
    assert poshidden_channel.main(["--pretrained", eight_layer_checkpoint, "--out", str(out), "--samples", "2",
                                   "--length", "40", "--top-k", "2", "--select-task", "multi_needle",
                                   "--select-samples", "1", "--select-top", "2", "--factors", "0;-1",
                                   "--metadata", '{"num_sentences": 4, "num_needles": 2}']) == 0
    setting = json.loads(out.read_text())
    best = setting["selection"]["best"]
    assert len(setting["selection"]["scores"]) == 4 and best == max(setting["selection"]["scores"],
                                                                       key=lambda r: r["mean_logprob"])
    assert (setting["channels"], setting["factor"]) == ([best["channel"]], best["factor"])


# ----------------------------------------------------------------------------- through lm-eval

LMS = {
    "poshidden": (lambda p, **kw: PosHiddenLM(pretrained=p, device="cpu", layers="0:", **kw), {"channels": "3;17", "factor": 1},
                  {"channels": "3;17", "factor": -1}),
    "fitm": (lambda p, **kw: FitMLM(pretrained=p, device="cpu", num_spans=3, **kw), {"strength": 0},
             {"temperature": 1e-2, "region": "0:1"}),
    "string": (lambda p, **kw: BOUND.string(pretrained=p, device="cpu", **kw), {"shifted_offset": 0},
               {"shifted_offset": 8, "local_window": 2}),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tiny_models import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="module")
def plain_answers(checkpoint):
    return plain_lm_answers(checkpoint)


@pytest.mark.parametrize("rival", sorted(LMS))
def test_identity_through_lm_eval_gives_the_plain_models_answers(checkpoint, plain_answers, rival):
    make, identity, _ = LMS[rival]
    lm = make(checkpoint, batch_size=3, **identity)
    assert (lm_loglikelihoods(lm), lm_generations(lm)) == plain_answers


@pytest.mark.parametrize("rival", sorted(LMS))
def test_a_real_setting_through_lm_eval_batched_equals_unbatched(checkpoint, plain_answers, rival):
    make, _, setting = LMS[rival]
    one, many = make(checkpoint, batch_size=1, **setting), make(checkpoint, batch_size=3, **setting)
    scores = lm_loglikelihoods(one)
    assert [s for s, _ in lm_loglikelihoods(many)] == pytest.approx([s for s, _ in scores], abs=1e-4)
    assert lm_generations(many) == lm_generations(one)
    assert [s for s, _ in scores] != pytest.approx([s for s, _ in plain_answers[0]], abs=1e-4)


def test_answer_starts_are_each_rows_last_context_token_and_a_foreign_row_its_last_column():
    from lpes_harness.lmeval.hflm import RightPaddedRowsMixin

    class Probe:
        def _loglikelihood_tokens(self, requests):
            rows = [[5, 6, 7, 8], [5, 6], [4, 5, 6, 7, 8, 9, 10, 11, 4, 5], [1] * 10]
            batch = torch.tensor([row + [0] * (10 - len(row)) for row in rows])
            return self._answer_starts(batch).tolist()

    class Model(RightPaddedRowsMixin, Probe):
        max_length = 10

    requests = [(None, [5, 6, 7], [8, 9]), (None, [5, 6], [7]), (None, list(range(3, 12)), [4, 5, 6])]
    # the third is cut from the left to max_length + 1 tokens, as HFLM cuts it
    assert Model()._loglikelihood_tokens(requests) == [2, 1, 7, 9]
    assert Model()._answer_starts(torch.ones(1, 4, dtype=torch.long)) is None  # outside loglikelihood


def test_loglikelihood_changes_the_queries_from_the_prompts_last_token(checkpoint):
    """poshidden_hf's loglikelihood is the model's forward with the answer's queries changed."""
    lm = PosHiddenLM(pretrained=checkpoint, device="cpu", layers="0:", channels="3;17", factor=-1)
    (context, continuation), = LM_REQUESTS[:1]
    ctx, cont = lm.tok_encode(context), lm.tok_encode(continuation)
    row = torch.tensor([ctx + cont[:-1]])
    with poshidden.answer_queries_from(lm.model, len(ctx) - 1), torch.no_grad():
        log_probs = torch.log_softmax(lm.model(row).logits[0, len(ctx) - 1 :].float(), -1)
    expected = log_probs[torch.arange(len(cont)), torch.tensor(cont)].sum().item()
    assert lm_loglikelihoods(lm)[0][0] == pytest.approx(expected, abs=1e-5)


# ----------------------------------------------------------------------------- the bar, on the bundled SmolLM2

# PCD (issue #97, tests/test_methods_pcd.py) is a rival too: its identity through plain lm_eval is checked here.
IDENTITY_ARGS = {"poshidden_hf": "channels=100,factor=1", "fitm_hf": "strength=0", "string_hf": "shifted_offset=0",
                 "pcd_hf": "weight=0"}


# A fifth of the default text (~300 tokens instead of ~1,000): identity is identity at any length, and
# the four runs' forwards stay a minute on a slow CPU.
MULTI_NEEDLE_SHORT = {"num_samples": 1, "num_sentences": 12}


def _lm_eval_answers(tmp_path, model: str, model_args: str) -> dict:
    """``lm_eval --model MODEL`` on multi_needle, one sample per gold position: {subtask: [answers]}."""
    import os
    import subprocess
    import sys

    from conftest import REPO_ROOT

    out = tmp_path / model
    command = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args, "--device", "cpu",
               "--tasks", "multi_needle", "--apply_chat_template", "--metadata", json.dumps(MULTI_NEEDLE_SHORT),
               "--log_samples", "--output_path", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    answers = {}
    for path in out.rglob("samples_multi_needle_pos*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        records.sort(key=lambda r: r["doc_id"])
        answers[path.name.split("_2")[0]] = [(r["doc_id"], r["filtered_resps"]) for r in records]
    return answers


@pytest.fixture(scope="module")
def vanilla_multi_needle(tmp_path_factory):
    # Plain `hf` on the folder the rivals load too, not on the GGUF itself.
    return _lm_eval_answers(tmp_path_factory.mktemp("vanilla"), "hf", f"pretrained={converted_bundled_model()}")


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(IDENTITY_ARGS))
def test_lm_eval_runs_each_rival_on_multi_needle_and_its_identity_answers_as_vanilla(tmp_path, vanilla_multi_needle, model):
    answers = _lm_eval_answers(tmp_path, model, IDENTITY_ARGS[model])
    assert len(vanilla_multi_needle) == 5 and all(len(v) == 1 for v in vanilla_multi_needle.values())
    assert answers == vanilla_multi_needle


def test_the_selection_picks_the_best_channel_and_factor_on_a_position_task(eight_layer_checkpoint):
    from lm_eval.tasks import TaskManager

    from lpes_harness.tasks import TASKS_DIR

    metadata = {"num_sentences": 4, "num_needles": 2}
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                          metadata={**metadata, "split": "search", "num_samples": 1})
    lm = PosHiddenLM(pretrained=eight_layer_checkpoint, channels=3, factor=0, device="cpu")
    found = poshidden_channels.select(lm, [3, 17], [0.0, -1.0], "multi_needle", 1, metadata, manager, log=lambda _: None)
    assert [(r["channel"], r["factor"]) for r in found["scores"]] == [(3, 0.0), (3, -1.0), (17, 0.0), (17, -1.0)]
    best = max(found["scores"], key=lambda r: r["mean_logprob"])
    assert found["best"] == best and found["positions"] == [0, 25, 50, 75, 100]
    assert found["beats_plain"] == (best["mean_logprob"] > found["plain_mean_logprob"])
    assert all(r["mean_logprob"] != found["plain_mean_logprob"] for r in found["scores"])
    state = poshidden.get_state(lm.model)
    assert (state.channels, state.factor) == ([best["channel"]], best["factor"])


@pytest.mark.slow
def test_each_rival_on_the_bundled_model_is_vanilla_at_identity_and_moves_otherwise():
    """SmolLM2-135M from its GGUF: 9 query heads on 3 kv heads, theta 1e5, one model load."""
    from lpes_harness.core.models import load_causal_lm

    model, tokenizer = load_causal_lm(attn_implementation="sdpa")
    prompt = ("Document [1] The Eiffel Tower is in Paris. Document [2] The Colosseum is in Rome. Document [3] The "
              "Prado is in Madrid.\nQuestion: Where is the Colosseum?\nAnswer:")
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(model.device)
    plain = logits(model, ids)
    poshidden.install(model, channels=[100], factor=1.0)
    assert torch.equal(logits(model, ids), plain)
    poshidden.remove(model)
    poshidden.install(model, channels=[100], factor=-1.0)
    assert (logits(model, ids)[:, -1] - plain[:, -1]).abs().max() > 1e-3
    poshidden.remove(model)
    string_shift.install(model, shifted_offset=16, local_window=16, attention_factor=1.0)
    torch.testing.assert_close(logits(model, ids), plain, rtol=1e-3, atol=1e-3)
    string_shift.remove(model)
    string_shift.install(model, shifted_offset=16, local_window=4)
    assert (logits(model, ids)[:, -1] - plain[:, -1]).abs().max() > 1e-2
    string_shift.remove(model)
    dummy = tokenizer(fitm.DUMMY_TEXT, add_special_tokens=False)["input_ids"]
    fitm.install(model, strength=1e-6, dummy_ids=dummy)
    with torch.no_grad():
        torch.testing.assert_close(fitm.forward_logits(model, ids), plain, rtol=1e-3, atol=1e-3)
    fitm.remove(model)
    fitm.install(model, dummy_ids=dummy)
    with torch.no_grad():
        assert (fitm.forward_logits(model, ids)[:, -1] - plain[:, -1]).abs().max() > 1e-3
    fitm.remove(model)
    assert torch.equal(logits(model, ids), plain)
