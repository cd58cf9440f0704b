"""Many prompts per forward: the batched scorer reads exactly what the per-prompt one reads."""

import pytest
import torch
from tiny_models import save_tiny_checkpoint

from lpes_harness.lmeval.lpes_lm import LPESLM
from lpes_harness.lmeval.answer_logits import resolve_batch_size, score_answers

# Mixed lengths (padding in every batch), one or several answers per context, answers of
# different lengths, and a context repeated in the list of pairs.
CONTEXTS = [
    "Key: abc, value",
    "The quick brown fox jumps over the lazy dog, and then",
    "x=1; y=2; z=",
    "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor",
    "a",
    "Question: what is 2+2? Answer:",
    "zz",
]
ANSWERS = [
    [" abc", ' "abc"'],
    [" it sleeps"],
    [" 3", " three", " 3;"],
    [" incididunt"],
    [" b", " bb"],
    [" 4"],
    [" z"],
]


def all_pairs():
    pairs = [(context, answer) for context, answers in zip(CONTEXTS, ANSWERS) for answer in answers]
    return pairs + [(CONTEXTS[0], " xyz")]  # the first context again, later in the list


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def lm(request, tmp_path_factory):
    checkpoint = save_tiny_checkpoint(tmp_path_factory.mktemp(f"batched_{request.param}"), request.param)
    # Distinct scales, one of them 1: every layer reads its own scaled positions.
    return LPESLM(pretrained=checkpoint, device="cpu", dtype="float32", scales="0.7;1.3;1;2.1")


@pytest.mark.parametrize("batch_size", [2, 3, 16, "auto"])
def test_batched_scores_equal_the_per_prompt_scores(lm, batch_size):
    pairs = all_pairs()
    alone = score_answers(lm, pairs)
    batched = score_answers(lm, pairs, batch_size=batch_size)
    assert len(batched) == len(pairs)
    for pair, one, many in zip(pairs, alone, batched):
        assert many.logprob == pytest.approx(one.logprob, abs=1e-5), pair
        assert many.is_greedy == one.is_greedy, pair
        assert many.num_tokens == one.num_tokens == len(lm._encode_pair(*pair)[1]), pair


def test_the_scales_matter_so_the_comparison_is_not_vacuous(lm):
    from lpes_harness.core import rope

    pairs = all_pairs()
    scaled = score_answers(lm, pairs, batch_size=4)
    before = rope.get_scales(lm.model)
    rope.set_scales(lm.model, 1.0)
    try:
        vanilla = score_answers(lm, pairs, batch_size=4)
    finally:
        rope.set_scales(lm.model, before)
    assert max(abs(a.logprob - b.logprob) for a, b in zip(scaled, vanilla)) > 1e-3


def test_only_answer_tokens_reach_the_output_layer_and_prompts_share_forwards(lm):
    pairs = [pair for pair in all_pairs() if len(pair[0]) > 1]  # a one-token context is scored alone
    head_rows, decoder_calls = [], []
    hooks = [
        lm.model.get_output_embeddings().register_forward_hook(
            lambda module, args, out: head_rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])),
        lm.model.get_decoder().register_forward_pre_hook(lambda module, args: decoder_calls.append(1)),
    ]
    try:
        score_answers(lm, pairs, batch_size=16)
    finally:
        for hook in hooks:
            hook.remove()
    assert sum(head_rows) == sum(len(lm._encode_pair(*pair)[1]) for pair in pairs)
    # One forward for the one-answer prompts, two (prompts, then answers) for the others.
    assert len(decoder_calls) == 3


def test_a_too_long_sequence_is_still_cut_from_the_left_in_a_batch(lm):
    long_context = "xyz " * (lm.max_length // 3)
    pairs = [(long_context + "end", " tail"), (long_context + "end", " other"), (CONTEXTS[0], " abc")]
    for one, many in zip(score_answers(lm, pairs), score_answers(lm, pairs, batch_size=8)):
        assert many.logprob == pytest.approx(one.logprob, abs=1e-5) and many.is_greedy == one.is_greedy


@pytest.mark.parametrize("bad", [0, -2, 1.5, "many", True])
def test_a_bad_batch_size_is_named(lm, bad):
    with pytest.raises(ValueError, match="batch_size"):
        resolve_batch_size(lm, bad)


def test_auto_is_a_small_batch_on_a_cpu(lm):
    assert 1 <= resolve_batch_size(lm, "auto") <= 16
    assert resolve_batch_size(lm, "8") == 8


def test_auto_halves_the_batch_on_out_of_memory_and_remembers_what_fits(lm, monkeypatch):
    from lpes_harness.lmeval import answer_logits as scoring

    real = scoring._score_batch
    tried = []

    def small_memory(model_lm, groups, several):
        tried.append(len(groups))
        if len(groups) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model_lm, groups, several)

    monkeypatch.setattr(scoring, "_score_batch", small_memory)
    monkeypatch.delattr(lm, "_lpes_score_batch", raising=False)
    groups = [(lm.tok_encode(c), [i], [lm._encode_pair(c, a[0])[1]]) for i, (c, a) in enumerate(zip(CONTEXTS, ANSWERS))
              if len(c) > 1]
    score = lambda batch: scoring._score_batch(lm, [(g[0], g[2]) for g in batch], False)  # noqa: E731
    scored = list(scoring._in_batches(lm, groups, 8, score, auto=True))
    assert tried[:3] == [len(groups), 4, 2] and max(tried[2:]) <= 2
    assert lm._lpes_score_batch == 2
    assert [g[1] for g, _ in scored] == [g[1] for g in groups]
    alone = [scoring._score_context(lm, g[0], g[2]) for g in groups]
    for (_, mine), theirs in zip(scored, alone):
        assert mine[0].logprob == pytest.approx(theirs[0].logprob, abs=1e-5)
    monkeypatch.setattr(scoring, "_score_batch", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")))
    with pytest.raises(torch.OutOfMemoryError):  # a batch size the user chose is not changed behind their back
        list(scoring._in_batches(lm, groups, 8, score, auto=False))
