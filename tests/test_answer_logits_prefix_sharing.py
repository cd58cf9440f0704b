"""Prompts that share a prefix share its forward: the same scores as each prompt from scratch, fewer tokens run."""

import pytest
from tiny_models import save_tiny_checkpoint, tiny_gemma3, tiny_tokenizer

from lpes_harness.lmeval.lpes_lm import LPESLM
from lpes_harness.lmeval import answer_logits
from lpes_harness.lmeval.answer_logits import score_answers

# A position task's shape: one text of items, the gold item moved between them, then the question.
ITEMS = ["ab cd.", "ef gh.", "ij kl.", "mn op.", "qr st."]
GOLD = "KEY is 42."


def prompt(slot: int) -> str:
    items = ITEMS[:slot] + [GOLD] + ITEMS[slot:]
    return "Read: " + " ".join(items) + " Q: KEY? A:"


def position_pairs():
    """One answer at each gold slot, several answers at two of them, a prompt that extends another, a repeated
    prompt, a short unrelated one."""
    pairs = [(prompt(slot), " 42") for slot in range(len(ITEMS) + 1)]
    pairs += [(prompt(2), ' "42"'), (prompt(2), " forty"), (prompt(5), " 4")]
    # A context that extends another, whose several answers left the cache one token short of it.
    pairs += [(prompt(2) + " 4", "2"), (prompt(2) + " 4", "3")]
    return pairs + [("zz", " z"), (prompt(0), " 42")]


def each_alone(lm, pairs):
    """The reference: every context scored from scratch (the path without a cache to share)."""
    by_context: dict[str, list[int]] = {}
    for index, (context, _) in enumerate(pairs):
        by_context.setdefault(context, []).append(index)
    results = [None] * len(pairs)
    for context, indices in by_context.items():
        encoded = [lm._encode_pair(*pairs[i]) for i in indices]
        for i, score in zip(indices, answer_logits._score_context(lm, encoded[0][0], [a for _, a in encoded])):
            results[i] = score
    return results


def tokens_run(lm, pairs) -> tuple[list, int]:
    """Scores, and the tokens the decoder ran to get them."""
    counted = []
    hook = lm.model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: counted.append((args[0] if args else kwargs["input_ids"]).numel()),
        with_kwargs=True)
    try:
        return score_answers(lm, pairs), sum(counted)
    finally:
        hook.remove()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def checkpoint(request, tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp(f"prefix_{request.param}"), request.param)


@pytest.mark.parametrize("scaling, scales", [("position", "0.7;1.3;1;2.1"), ("base", "0.5;2;1;4"),
                                             ("both", "0.7;1.3;1;2.1;2;1;0.5;3")])
def test_shared_prefixes_score_as_each_prompt_alone_with_fewer_tokens(checkpoint, scaling, scales):
    lm = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32", scales=scales, scaling=scaling)
    pairs = position_pairs()
    shared, shared_tokens = tokens_run(lm, pairs)
    alone = each_alone(lm, pairs)
    for pair, one, other in zip(pairs, alone, shared):
        assert other.logprob == pytest.approx(one.logprob, abs=1e-5), pair
        assert other.is_greedy == one.is_greedy, pair
        assert other.num_tokens == one.num_tokens, pair
    full_tokens = sum(len(lm._encode_pair(c, a)[0]) + len(lm._encode_pair(c, a)[1]) - 1 for c, a in dict(pairs).items())
    assert shared_tokens < 0.8 * full_tokens  # the six prompts share most of their text


def test_the_scales_reach_the_cached_tokens_so_the_comparison_is_not_vacuous(checkpoint):
    vanilla = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32")
    scaled = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32", scales="0.7;1.3;1;2.1")
    pairs = position_pairs()
    plain, moved = score_answers(vanilla, pairs), score_answers(scaled, pairs)
    assert any(abs(a.logprob - b.logprob) > 1e-3 for a, b in zip(plain, moved))


def test_a_prompt_past_the_window_is_truncated_as_lm_eval_does_and_the_others_still_share(checkpoint):
    lm = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32", scales="0.7;1.3;1;2.1", max_length=48)
    long_prompt = "Read: " + " ".join(ITEMS * 4) + " Q: KEY? A:"
    pairs = position_pairs() + [(long_prompt, " 42"), (long_prompt, " 4")]
    assert len(lm._encode_pair(long_prompt, " 42")[0]) > lm.max_length
    shared, alone = score_answers(lm, pairs), each_alone(lm, pairs)
    for pair, one, other in zip(pairs, alone, shared):
        assert other.logprob == pytest.approx(one.logprob, abs=1e-5), pair
        assert other.is_greedy == one.is_greedy, pair


@pytest.mark.parametrize("scales", [None, "0.7;1.3;1;2.1"])
def test_a_model_with_sliding_window_layers_shares_prefixes_and_keeps_its_window(tmp_path, scales):
    # The prompts are several times the window (8): a cache that dropped the keys a window drops
    # could not be cut back and extended, and one that let sliding layers see past the window
    # would score otherwise than each prompt alone (HFLM's path, the window applied by the mask).
    tiny_gemma3().save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    lm = LPESLM(pretrained=str(tmp_path), device="cpu", dtype="float32", scales=scales)
    pairs = position_pairs()
    assert all(len(lm._encode_pair(c, a)[0]) > 3 * lm.model.config.sliding_window for c, a in pairs[:6])
    shared, tokens = tokens_run(lm, pairs)
    for pair, one, other in zip(pairs, each_alone(lm, pairs), shared):
        assert other.logprob == pytest.approx(one.logprob, abs=1e-5), pair
        assert other.is_greedy == one.is_greedy, pair
    full_tokens = sum(len(lm._encode_pair(c, a)[0]) + len(lm._encode_pair(c, a)[1]) - 1 for c, a in dict(pairs).items())
    assert tokens < 0.8 * full_tokens


def test_a_cache_of_another_layer_kind_scores_each_prompt_from_scratch(checkpoint, monkeypatch):
    lm = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32")
    monkeypatch.setattr(answer_logits, "prefix_cache", lambda lm: None)  # as for linear-attention layers
    pairs = position_pairs()
    shared, tokens = tokens_run(lm, pairs)
    for pair, one, other in zip(pairs, each_alone(lm, pairs), shared):
        assert other.logprob == pytest.approx(one.logprob, abs=1e-5), pair
    encoded = [lm._encode_pair(c, a) for c, a in dict(pairs).items()]
    assert tokens >= sum(len(c) - 1 for c, _ in encoded)  # every context ran whole
