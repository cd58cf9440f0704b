"""``lpes_hf``'s ``loglikelihood`` runs the output layer only at the answer tokens and gives what
HFLM's own path gives (full-vocabulary logits at every position), scales applied, on tiny Llama,
Qwen2 and Mistral."""

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from tiny_models import save_tiny_checkpoint

from lpes_harness.lm import LPESLM

# Different lengths (a batch is right-padded), two answers of one prompt, a one-token answer,
# and an empty context (lm-eval conditions on the prefix token).
REQUESTS = [
    ("The quick brown", " fox jumps"),
    ("Lost in the middle of a long text, the key 7 holds", " 42"),
    ("Lost in the middle of a long text, the key 7 holds", " 4"),
    ("abc", "def!"),
    ("A much longer prompt than the others, so that padding shows: the value of key 9 is", " 9"),
    ("", "hello"),
]


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def checkpoint(request, tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param)


def instances(pairs):
    return [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(pairs)]


def greedy_pair(lm, context: str, tokens: int = 3) -> tuple[str, str]:
    """``(context, answer)`` with the answer the model writes greedily: is_greedy must come out True."""
    ids = lm.tok_encode(context)
    written = lm.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=tokens, do_sample=False,
                                pad_token_id=0)[0, len(ids):].tolist()
    assert min(written) >= 4, written  # printable characters of the tiny tokenizer: the text round-trips
    return context, "".join(lm.tokenizer.convert_ids_to_tokens(written))


@pytest.mark.parametrize("batch_size", [1, 4])
def test_answer_logits_path_equals_hflms_with_scales(checkpoint, batch_size):
    lm = LPESLM(pretrained=checkpoint, scales="1.0;2.5;0.7;1.6", device="cpu", batch_size=batch_size)
    pairs = REQUESTS + [greedy_pair(lm, "Once upon a"), greedy_pair(lm, "xyz", tokens=1)]
    new = lm.loglikelihood(instances(pairs), disable_tqdm=True)
    old = HFLM.loglikelihood(lm, instances(pairs), disable_tqdm=True)  # _model_call: every position, full vocabulary
    assert [greedy for _, greedy in new] == [greedy for _, greedy in old] and new[-1][1] and new[-2][1]
    assert [ll for ll, _ in new] == pytest.approx([ll for ll, _ in old], abs=1e-4)
    vanilla = HFLM.loglikelihood(LPESLM(pretrained=checkpoint, device="cpu"), instances(pairs), disable_tqdm=True)
    assert [ll for ll, _ in new] != pytest.approx([ll for ll, _ in vanilla], abs=1e-3)  # the scales do act


def test_only_the_answer_positions_reach_the_output_layer(checkpoint):
    lm = LPESLM(pretrained=checkpoint, scales=1.5, device="cpu", batch_size=4)
    rows = []
    handle = lm.model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: rows.append(args[0].shape[:-1].numel()))
    try:
        lm.loglikelihood(instances(REQUESTS), disable_tqdm=True)
    finally:
        handle.remove()
    answer_tokens = sum(len(lm.tok_encode(answer)) for _, answer in REQUESTS)
    # at most a token more per answer: lm-eval moves a context's trailing space into the answer
    assert answer_tokens <= sum(rows) <= answer_tokens + len(REQUESTS)


def test_a_progress_bar_counts_the_requests_as_hflms_does(checkpoint, capsys):
    lm = LPESLM(pretrained=checkpoint, device="cpu", batch_size=4)
    lm.loglikelihood(instances(REQUESTS), disable_tqdm=False)
    err = capsys.readouterr().err
    assert "Running loglikelihood requests: 100%" in err and f"{len(REQUESTS)}/{len(REQUESTS)}" in err
    lm.loglikelihood(instances(REQUESTS), disable_tqdm=True)
    assert "Running loglikelihood" not in capsys.readouterr().err
