"""Attention Buckets' ``loglikelihood`` with the output layer only at the answer positions
(``AnswerLogitsLoglikelihoodMixin``) gives what lm-eval's own path gives (full-vocabulary logits of
all K copies at every position, merged, ``HFLM.loglikelihood``), on tiny Llama and Qwen2."""

import pytest
import torch
from lm_eval.models.huggingface import HFLM
from loglikelihood_cases import REQUESTS, instances, output_layer_positions
from tiny_models import save_tiny_checkpoint

from lpes_harness.methods import buckets
from lpes_harness.lmeval.method_models import BucketsLM


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def checkpoint(request, tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param)


def with_greedy_answer(lm, context: str, tokens: int = 3) -> tuple[str, str]:
    """``(context, answer)`` with the answer Buckets itself writes greedily: is_greedy must be True."""
    ids = torch.tensor([lm.tok_encode(context)])
    with torch.no_grad():
        written = buckets.generate(lm.model, ids, max_new_tokens=tokens)[0, ids.shape[1]:].tolist()
    assert min(written) >= 4, written  # printable characters of the tiny tokenizer: the text round-trips
    return context, "".join(lm.tokenizer.convert_ids_to_tokens(written))  # decode() would join them with spaces


def assert_same(new, old, atol=1e-4):
    assert [greedy for _, greedy in new] == [greedy for _, greedy in old]
    assert [logprob for logprob, _ in new] == pytest.approx([logprob for logprob, _ in old], abs=atol)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_answer_logits_equal_the_full_logits_path(checkpoint, batch_size):
    lm = BucketsLM(pretrained=checkpoint, device="cpu", batch_size=batch_size)
    pairs = REQUESTS + [with_greedy_answer(lm, "Once upon a"), with_greedy_answer(lm, "xyz", tokens=1)]
    new = lm.loglikelihood(instances(pairs), disable_tqdm=True)
    old = HFLM.loglikelihood(lm, instances(pairs), disable_tqdm=True)  # _model_call: every position, merged
    assert_same(new, old)
    assert new[-1][1] and new[-2][1]


def test_left_truncation_is_lm_evals(checkpoint):
    lm = BucketsLM(pretrained=checkpoint, device="cpu", batch_size=3, max_length=12)
    new = lm.loglikelihood(instances(REQUESTS), disable_tqdm=True)
    assert_same(new, HFLM.loglikelihood(lm, instances(REQUESTS), disable_tqdm=True))


def test_one_base_equal_to_theta_is_vanilla(checkpoint):
    vanilla = HFLM(pretrained=checkpoint, device="cpu", batch_size=2)
    vanilla = vanilla.loglikelihood(instances(REQUESTS), disable_tqdm=True)
    one_base = BucketsLM(pretrained=checkpoint, device="cpu", batch_size=2, bases="1.0")
    assert_same(one_base.loglikelihood(instances(REQUESTS), disable_tqdm=True), vanilla)


def test_only_the_answer_positions_of_every_copy_reach_the_output_layer(checkpoint):
    lm = BucketsLM(pretrained=checkpoint, device="cpu", batch_size=4)
    positions, answer_tokens = output_layer_positions(lm)
    assert positions == len(buckets.get_state(lm.model).relative_bases) * answer_tokens
