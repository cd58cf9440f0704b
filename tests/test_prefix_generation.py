"""``lpes_hf prefix_cache=true``: greedy ``generate_until`` shares the prompts' common prefixes on one KV
cache, writes what HFLM writes prompt by prompt (scales applied, stop sequences, the order of the
requests), runs fewer tokens, and keeps HFLM's path where it cannot share."""

import logging

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from tiny_models import save_tiny_checkpoint, tiny_gemma3, tiny_tokenizer

from lpes_harness.lmeval.lpes_lm import LPESLM
from lpes_harness.lmeval.prefix_generation import why_not_shared

DOCUMENT = "The quick brown fox jumps over the lazy dog near the river bank at dawn. " * 3
GREEDY = {"until": ["."], "max_gen_toks": 12, "do_sample": False}
# L-Eval's shape: several questions of one document, another document between them in request
# order, a prompt that is a prefix of another, and two generation settings.
PROMPTS = [
    (DOCUMENT + "Q: who jumps? A:", GREEDY),
    ("Another text entirely. Q: what? A:", GREEDY),
    (DOCUMENT + "Q: where? A:", GREEDY),
    (DOCUMENT + "Q: when? A:", {"until": ["\n\n"], "max_gen_toks": 20}),
    (DOCUMENT, GREEDY),
    (DOCUMENT + "Q: who jumps? A:", {"max_gen_toks": 5}),
    (DOCUMENT + "Q: why? A:", {"until": ["?"], "max_length": 240}),  # HFLM lets max_length win over max_gen_toks
]


def requests(prompts=PROMPTS):
    return [Instance("generate_until", {}, prompt, index) for index, prompt in enumerate(prompts)]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def checkpoint(request, tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param)


def tokens_run(lm, run) -> tuple[list[str], int]:
    """What ``run()`` returns, and how many tokens went through the decoder's embedding meanwhile."""
    counted = []
    hook = lm.model.get_input_embeddings().register_forward_hook(lambda _, args, __: counted.append(args[0].numel()))
    try:
        return run(), sum(counted)
    finally:
        hook.remove()


@pytest.mark.parametrize("scales", ["1.0;2.5;0.7;1.6", None])
def test_shared_prefixes_write_what_hflm_writes_and_run_fewer_tokens(checkpoint, scales):
    lm = LPESLM(pretrained=checkpoint, scales=scales, device="cpu", dtype="float32", prefix_cache="true")
    assert why_not_shared(lm, requests()) is None
    shared, shared_tokens = tokens_run(lm, lambda: lm.generate_until(requests(), disable_tqdm=True))
    whole, whole_tokens = tokens_run(lm, lambda: HFLM.generate_until(lm, requests(), disable_tqdm=True))
    assert shared == whole
    assert any(text for text in whole)  # the tiny model writes something: the comparison has content
    prompt_tokens = sum(len(lm.tok_encode(context)) for context, _ in PROMPTS)
    # HFLM runs every prompt whole; sharing saves at least the document three times over
    assert whole_tokens >= prompt_tokens and shared_tokens <= whole_tokens - 3 * (len(lm.tok_encode(DOCUMENT)) - 1)


def test_the_scales_act_on_the_shared_path(checkpoint):
    # the second prompt runs on the first one's cache: "Another text entirely. Q: w" is shared
    prompts = [("Another text entirely. Q: what? A:", {"until": [], "max_gen_toks": 10}),
               ("Another text entirely. Q: why? A:", {"until": [], "max_gen_toks": 10})]
    written = {}
    for scales in ("3.0;0.4;2.5;0.5", None):
        lm = LPESLM(pretrained=checkpoint, scales=scales, device="cpu", dtype="float32", prefix_cache=True)
        written[scales] = lm.generate_until(requests(prompts), disable_tqdm=True)
        assert written[scales] == HFLM.generate_until(lm, requests(prompts), disable_tqdm=True)
    assert written["3.0;0.4;2.5;0.5"][1] != written[None][1]


def test_it_needs_batch_size_one(checkpoint):
    with pytest.raises(ValueError, match="prefix_cache=true .* needs batch_size 1, got 4"):
        LPESLM(pretrained=checkpoint, device="cpu", batch_size=4, prefix_cache=True)
    with pytest.raises(ValueError, match="prefix_cache='sometimes' is not allowed"):
        LPESLM(pretrained=checkpoint, device="cpu", prefix_cache="sometimes")


def test_sampling_keeps_hflms_path_and_says_why(checkpoint, caplog):
    lm = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32", prefix_cache=True)
    sampled = [(DOCUMENT, {"until": ["."], "max_gen_toks": 4, "do_sample": True, "temperature": 0.7})]
    assert why_not_shared(lm, requests(sampled)) == "sampling or beam search (only greedy decoding is shared)"
    assert why_not_shared(lm, requests([(DOCUMENT, {"max_gen_toks": 4, "temperature": 0.0})])) is None
    with caplog.at_level(logging.WARNING):
        torch.manual_seed(0)
        lm.generate_until(requests(sampled), disable_tqdm=True)
    assert "each prompt runs whole (HFLM's path): sampling" in caplog.text


@pytest.mark.parametrize("scales", [None, "1.0;2.5;0.7;1.6"])
def test_sliding_window_layers_share_prefixes_and_keep_their_window(tmp_path, scales):
    # The document is many windows (8) long: the shared cache keeps every layer's keys and the
    # window is kept by the mask, so the continuations are HFLM's, whole prompt by whole prompt.
    tiny_gemma3().save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    lm = LPESLM(pretrained=str(tmp_path), device="cpu", dtype="float32", prefix_cache=True, scales=scales)
    assert why_not_shared(lm, requests()) is None
    assert len(lm.tok_encode(DOCUMENT)) > 10 * lm.model.config.sliding_window
    shared, shared_tokens = tokens_run(lm, lambda: lm.generate_until(requests(), disable_tqdm=True))
    whole, whole_tokens = tokens_run(lm, lambda: HFLM.generate_until(lm, requests(), disable_tqdm=True))
    assert shared == whole and any(whole)
    assert shared_tokens <= whole_tokens - 3 * (len(lm.tok_encode(DOCUMENT)) - 1)


def test_a_cache_that_cannot_be_cut_back_keeps_hflms_path(checkpoint, monkeypatch, caplog):
    from lpes_harness.lmeval import prefix_generation

    monkeypatch.setattr(prefix_generation, "prefix_cache", lambda lm: None)  # as for linear-attention layers
    lm = LPESLM(pretrained=checkpoint, device="cpu", dtype="float32", prefix_cache=True)
    assert why_not_shared(lm, requests()) == ("this model's KV cache cannot be cut back "
                                              "(a layer keeps a recurrent state, a key index or another layer's keys)")
    with caplog.at_level(logging.WARNING):
        assert lm.generate_until(requests(), disable_tqdm=True) == HFLM.generate_until(lm, requests(), disable_tqdm=True)
    assert "each prompt runs whole (HFLM's path): this model's KV cache" in caplog.text
