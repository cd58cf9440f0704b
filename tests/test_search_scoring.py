"""The one-pass scorer reads the same numbers as lm-eval's loglikelihood, with logits only at the answer."""

import math

import pytest
import torch
from tiny_models import save_tiny_checkpoint

from lpes_harness.lmeval.lpes_lm import LPESLM
from lpes_harness.search.fitness import FitnessConfig, LMEvalFitness
from lpes_harness.lmeval.answer_logits import score_answers

CONTEXTS = ["Key: abc, value", "The quick brown fox", "x=1; y=2; z=", "lorem ipsum dolor sit amet"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    checkpoint = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_scoring"), "llama")
    return LPESLM(pretrained=checkpoint, device="cpu", scales="1.3")


def greedy_continuation(lm, context: str, length: int = 4) -> str | None:
    """What greedy decoding writes after ``context`` (None if it writes a special token)."""
    ids = lm.tok_encode(context)
    for _ in range(length):
        with torch.no_grad():
            next_id = int(lm.model(torch.tensor([ids])).logits[0, -1].argmax())
        if next_id < 4:  # <pad> <s> </s> <unk> do not survive a decode/encode round trip
            return None
        ids.append(next_id)
    # Character-level vocabulary: the tokens joined are the text (decode() would add spaces).
    return "".join(lm.tokenizer.convert_ids_to_tokens(ids[len(lm.tok_encode(context)) :]))


def lm_eval_loglikelihood(lm, pairs):
    from lm_eval.api.instance import Instance

    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    return lm.loglikelihood(requests, disable_tqdm=True)


def test_answer_logits_equal_lm_evals_loglikelihood_including_is_greedy(lm):
    greedy = [(c, g) for c in CONTEXTS if (g := greedy_continuation(lm, c))]
    assert greedy, "the tiny model wrote special tokens after every context"
    # The same contexts with a wrong answer: the greedy one with its last character changed.
    wrong = [(c, g[:-1] + ("a" if g[-1] != "a" else "b")) for c, g in greedy]
    pairs = greedy + wrong
    ours = score_answers(lm, pairs)
    theirs = lm_eval_loglikelihood(lm, pairs)
    for (context, answer), mine, (logprob, is_greedy) in zip(pairs, ours, theirs):
        assert mine.logprob == pytest.approx(logprob, abs=1e-4), (context, answer)
        assert mine.is_greedy == is_greedy, (context, answer)
        assert mine.num_tokens == len(answer)  # one character per token
    assert all(s.is_greedy for s in ours[: len(greedy)]) and not any(s.is_greedy for s in ours[len(greedy) :])


def test_answers_to_one_prompt_share_its_forward_pass_and_only_answers_reach_the_output_layer(lm):
    decoder_inputs, head_inputs = [], []
    first_layer = lm.model.model.layers[0]
    hooks = [
        first_layer.register_forward_pre_hook(lambda module, args, kwargs: decoder_inputs.append(tuple(args[0].shape[:2])),
                                              with_kwargs=True),
        lm.model.lm_head.register_forward_hook(lambda module, args, out: head_inputs.append(tuple(args[0].shape[:2]))),
    ]
    context = "a long context " * 5 + "end"
    try:
        score_answers(lm, [(context, " answer"), (context, " other one")])
    finally:
        for hook in hooks:
            hook.remove()
    prompt_tokens = len(lm.tok_encode(context))
    # The prompt once (all but its last token), then both answers in one batch of their own tokens.
    width = len(" other one")
    assert decoder_inputs == [(1, prompt_tokens - 1), (2, width)]
    assert head_inputs == [(2, width)]


def test_a_sequence_longer_than_the_window_is_cut_from_the_left_as_lm_eval_does(lm):
    long_context = "xyz " * (lm.max_length // 3)
    pairs = [(long_context + "end", " tail"), (long_context + "end", " other")]
    for mine, (logprob, is_greedy) in zip(score_answers(lm, pairs), lm_eval_loglikelihood(lm, pairs)):
        assert mine.logprob == pytest.approx(logprob, abs=1e-3) and mine.is_greedy == is_greedy


def answering_checkpoint(path) -> str:
    """A tiny llama whose greedy next character is a function of the current one: ':' -> ' ',
    ' ' -> 'z', 'z' -> 'z'. After a KV prompt ("... Corresponding value:") it answers " zzzz...".

    Attention and MLP write nothing (o_proj, down_proj = 0), so the last hidden state is the
    token's own embedding; the output rows of ' ' and 'z' are the normalised embeddings of
    the tokens that must lead to them (random 64-d vectors: each nearly orthogonal to the rest).
    """
    import json

    from tiny_models import tiny_model, tiny_tokenizer

    model = tiny_model("llama")
    tokenizer = tiny_tokenizer()
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = 1, 2, 0
    ids = {char: tokenizer.convert_tokens_to_ids(char) for char in ": z"}
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        normed = embeddings / embeddings.pow(2).mean(-1, keepdim=True).sqrt()
        head = torch.zeros_like(model.lm_head.weight)
        head[ids[" "]] = 10 * normed[ids[":"]]
        head[ids["z"]] = 10 * (normed[ids[" "]] + normed[ids["z"]])
        model.lm_head.weight.copy_(head)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 4
    return str(path)


def kv_records(path, count=40):
    """LitM KV records; every other gold value is what the answering model writes."""
    import json
    import random

    rng = random.Random(0)
    with open(path, "w") as handle:
        for index in range(count):
            value = "zzzzzzzz" if index % 2 == 0 else "qqqqqqqq"
            pairs = [[f"{rng.getrandbits(32):08x}", f"{rng.getrandbits(32):08x}"] for _ in range(3)]
            gold = [f"{rng.getrandbits(32):08x}", value]
            pairs.insert(index % 4, gold)
            handle.write(json.dumps({"ordered_kv_records": pairs, "key": gold[0], "value": gold[1]}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def answering(tmp_path_factory):
    folder = tmp_path_factory.mktemp("answering")
    (folder / "model").mkdir()
    lm = LPESLM(pretrained=answering_checkpoint(folder / "model"), device="cpu", scales="1.3")
    return lm, kv_records(folder / "kv.jsonl")


def test_the_answering_model_writes_the_gold_value_greedily(answering):
    lm, _ = answering
    context = 'Key: "1a2b3c4d"\nCorresponding value:'
    assert greedy_continuation(lm, context, 5) == " zzzz"


@pytest.mark.parametrize("mode", ["greedy", "logprob"])
def test_both_scorers_give_the_same_fitness(answering, mode):
    lm, records = answering
    values = []
    for scorer in ("answer-logits", "lm-eval"):
        config = FitnessConfig(fitness=mode, scorer=scorer, num_samples=4, chunk_size=2, metadata={"data_path": records},
                               racing=False)
        fitness, info = LMEvalFitness(lm, config)([1.3] * 4)
        values.append((fitness, info["scores"]))
    assert values[0][0] == pytest.approx(values[1][0], abs=1e-4)
    for role, score in values[0][1].items():
        assert score == pytest.approx(values[1][1][role], abs=1e-4)
    assert all(math.isfinite(v[0]) for v in values)
    if mode == "greedy":
        # A comparison of 0 with 0 would prove nothing: half the gold values are the model's answer.
        assert 0 < values[0][0] < 1, values
        assert any(0 < score < 1 for score in values[0][1].values()), values


def test_an_unknown_scorer_is_named():
    with pytest.raises(ValueError, match="scorer 'fast' is not one of answer-logits, lm-eval"):
        FitnessConfig(scorer="fast")


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_the_shared_prompt_path_matches_lm_eval_on_other_architectures(arch, tmp_path):
    lm = LPESLM(pretrained=save_tiny_checkpoint(tmp_path, arch), device="cpu", scales="0.8")
    pairs = [(CONTEXTS[0], " abc"), (CONTEXTS[0], ' "abc"'), (CONTEXTS[2], " 3")]
    for mine, (logprob, is_greedy) in zip(score_answers(lm, pairs), lm_eval_loglikelihood(lm, pairs)):
        assert mine.logprob == pytest.approx(logprob, abs=1e-4) and mine.is_greedy == is_greedy


def test_tiebreak_is_greedy_accuracy_plus_a_confidence_too_small_to_reorder_it(answering):
    from lpes_harness.lmeval.position_scorer import TIEBREAK_EPS, max_sample_score

    lm, records = answering
    per_mode = {}
    for mode in ("greedy", "logprob", "tiebreak"):
        config = FitnessConfig(fitness=mode, num_samples=4, chunk_size=2, metadata={"data_path": records}, racing=False)
        scorer = LMEvalFitness(lm, config).scorer
        per_mode[mode] = [v for percent in sorted(scorer.docs) for v in scorer.scores(percent, range(4))]
    greedy, logprob, tiebreak = per_mode["greedy"], per_mode["logprob"], per_mode["tiebreak"]
    assert 0 < sum(greedy) < len(greedy), greedy  # right and wrong samples, or the check says little
    for g, lp, t in zip(greedy, logprob, tiebreak):
        assert t == pytest.approx(g + TIEBREAK_EPS * math.exp(lp), abs=1e-12)
        assert g < t <= g + TIEBREAK_EPS <= max_sample_score("tiebreak")


def test_tiebreak_refuses_sample_counts_where_confidence_could_outweigh_a_sample():
    FitnessConfig(fitness="tiebreak", num_samples=200, metadata={"num_pairs": 3})  # the paper's size: fine
    with pytest.raises(ValueError, match="fitness tiebreak: one sample is worth only"):
        FitnessConfig(fitness="tiebreak", num_samples=200, weights={"begin": 1.0, "middle": 1e-3, "end": 1.0},
                      metadata={"num_pairs": 3})
