"""``lpes_hf answer_logits=true``: ``loglikelihood`` runs the output layer only at the answer tokens
and gives what HFLM's own path gives (full-vocabulary logits at every position), scales applied,
on tiny Llama, Qwen2 and Mistral; without it, ``loglikelihood`` is HFLM's, bit for bit."""

import pytest
import torch
from lm_eval.models.huggingface import HFLM
from loglikelihood_cases import REQUESTS, instances, output_layer_positions
from tiny_models import save_tiny_checkpoint

from lpes_harness.lmeval.lpes_lm import LPESLM


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def checkpoint(request, tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param)


def greedy_pair(lm, context: str, tokens: int = 3) -> tuple[str, str]:
    """``(context, answer)`` with the answer the model writes greedily: is_greedy must come out True."""
    ids = lm.tok_encode(context)
    written = lm.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=tokens, do_sample=False,
                                pad_token_id=0)[0, len(ids):].tolist()
    assert min(written) >= 4, written  # printable characters of the tiny tokenizer: the text round-trips
    return context, "".join(lm.tokenizer.convert_ids_to_tokens(written))


@pytest.mark.parametrize("batch_size", [1, 4])
def test_answer_logits_path_equals_hflms_with_scales(checkpoint, batch_size):
    lm = LPESLM(pretrained=checkpoint, scales="1.0;2.5;0.7;1.6", device="cpu", batch_size=batch_size,
                answer_logits="true")
    pairs = REQUESTS + [greedy_pair(lm, "Once upon a"), greedy_pair(lm, "xyz", tokens=1)]
    new = lm.loglikelihood(instances(pairs), disable_tqdm=True)
    old = HFLM.loglikelihood(lm, instances(pairs), disable_tqdm=True)  # _model_call: every position, full vocabulary
    assert [greedy for _, greedy in new] == [greedy for _, greedy in old] and new[-1][1] and new[-2][1]
    assert [ll for ll, _ in new] == pytest.approx([ll for ll, _ in old], abs=1e-4)
    vanilla = HFLM.loglikelihood(LPESLM(pretrained=checkpoint, device="cpu"), instances(pairs), disable_tqdm=True)
    assert [ll for ll, _ in new] != pytest.approx([ll for ll, _ in vanilla], abs=1e-3)  # the scales do act


def test_only_the_answer_positions_reach_the_output_layer(checkpoint):
    positions, answer_tokens = output_layer_positions(LPESLM(pretrained=checkpoint, scales=1.5, device="cpu", batch_size=4,
                                                                   answer_logits=True))
    assert positions == answer_tokens


def test_a_progress_bar_counts_the_requests_as_hflms_does(checkpoint, capsys):
    lm = LPESLM(pretrained=checkpoint, device="cpu", batch_size=4, answer_logits=True)
    lm.loglikelihood(instances(REQUESTS), disable_tqdm=False)
    err = capsys.readouterr().err
    assert "Running loglikelihood requests: 100%" in err and f"{len(REQUESTS)}/{len(REQUESTS)}" in err
    lm.loglikelihood(instances(REQUESTS), disable_tqdm=True)
    assert "Running loglikelihood" not in capsys.readouterr().err


def test_by_default_loglikelihood_is_hflms_bit_for_bit(checkpoint):
    lm = LPESLM(pretrained=checkpoint, scales=1.5, device="cpu", batch_size=4)
    assert lm.loglikelihood(instances(REQUESTS), disable_tqdm=True) == HFLM.loglikelihood(
        lm, instances(REQUESTS), disable_tqdm=True)
    with pytest.raises(ValueError, match="answer_logits='maybe' is not allowed"):
        LPESLM(pretrained=checkpoint, device="cpu", answer_logits="maybe")


def test_one_token_answers_to_one_prompt_share_its_row_as_hflms_logits_cache_does(checkpoint):
    """A multiple-choice letter (C-Eval's A-D): four answers, one decoder row, HFLM's scores."""
    lm = LPESLM(pretrained=checkpoint, scales=1.5, device="cpu", batch_size=4, answer_logits=True)
    letters = [lm.tokenizer.convert_ids_to_tokens(i) for i in (30, 31, 32, 33)]
    pairs = [("Question one? Answer:", letter) for letter in letters] + [("Another, longer question? Answer:", "b")]
    assert all(len(lm._encode_pair(c, a)[1]) == 1 for c, a in pairs)
    rows = []
    handle = lm.model.get_decoder().register_forward_hook(
        lambda module, args, kwargs, output: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        new = lm.loglikelihood(instances(pairs), disable_tqdm=True)
    finally:
        handle.remove()
    assert rows == [2]  # the four letters' prompt once, the other prompt once
    old = HFLM.loglikelihood(lm, instances(pairs), disable_tqdm=True)
    assert [greedy for _, greedy in new] == [greedy for _, greedy in old]
    assert [ll for ll, _ in new] == pytest.approx([ll for ll, _ in old], abs=1e-4)
    assert len({ll for ll, _ in new[:4]}) == 4  # each letter read at the shared row, not one letter four times
