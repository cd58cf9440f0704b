"""The baselines as lm-eval models: batched equals unbatched, cached equals uncached, GQA exact, errors clear."""

import pytest
import torch
from lm_eval.api.instance import Instance
from tiny_models import assert_same_greedy_steps, random_ids, save_tiny_checkpoint, tiny_gemma3, tiny_model, tiny_tokenizer

from lpes_harness.methods import buckets, moice, moice_training, mspoe
from lpes_harness.methods.arguments import MethodError
from lpes_harness.core.rope_anatomy import LPESError
from lpes_harness.lmeval.method_lm import BOUND
from lpes_harness.lmeval.method_models import BucketsLM, FitMLM, MsPoELM, PosHiddenLM
from lpes_harness.core.models import cache_keyword

pytestmark = pytest.mark.filterwarnings("ignore:moice_hf without gates")

REQUESTS = [("The quick brown", " fox jumps"), ("Lost in the middle of a long text", " it is"), ("abc", "def!")]
PROMPTS = ["Once upon a", "The key 1234 has value", "xyz"]
METHODS = {
    "mspoe": lambda path, **kw: MsPoELM(pretrained=path, device="cpu", layers="0:", **kw),
    "buckets": lambda path, **kw: BucketsLM(pretrained=path, device="cpu", **kw),
    "moice": lambda path, **kw: BOUND.moice(pretrained=path, device="cpu", **kw),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"), "llama")


def loglikelihoods(lm):
    instances = [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(REQUESTS)]
    return [ll for ll, _ in lm.loglikelihood(instances, disable_tqdm=True)]


def generations(lm):
    args = {"until": ["\n\n\n"], "max_gen_toks": 6, "do_sample": False}
    instances = [Instance("generate_until", {}, (p, args), i) for i, p in enumerate(PROMPTS)]
    return lm.generate_until(instances, disable_tqdm=True)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_batched_equals_unbatched(checkpoint, method):
    one = METHODS[method](checkpoint, batch_size=1)
    many = METHODS[method](checkpoint, batch_size=3)
    assert loglikelihoods(many) == pytest.approx(loglikelihoods(one), abs=1e-4)
    assert generations(many) == generations(one)


def test_mspoe_finds_each_rows_length_in_a_right_padded_batch(checkpoint):
    lm = METHODS["mspoe"](checkpoint, batch_size=3)
    rows = [lm.tok_encode(c + x) for c, x in REQUESTS]
    lm._expected_rows = {}
    for row in rows:  # each request's continuation is its last token
        lm._expected_rows.setdefault(len(row) - 1, {}).setdefault(tuple(row[:-1]), set()).add(len(row) - 2)
    width = max(len(r) - 1 for r in rows)
    padded = torch.tensor([r[:-1] + [0] * (width - len(r) + 1) for r in rows])
    assert lm._last_real_index(padded).tolist() == [len(r) - 2 for r in rows]
    assert lm._answer_starts(padded).tolist() == [len(r) - 2 for r in rows]


def build(arch: str):
    return tiny_gemma3() if arch == "gemma3" else tiny_model(arch)


@pytest.fixture(scope="module")
def gemma3_checkpoint(tmp_path_factory):
    """A tiny Gemma-3 (sliding window 8, a RoPE per layer type) that HFLM loads offline."""
    path = tmp_path_factory.mktemp("tiny_gemma3")
    model = tiny_gemma3()
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = 1, 2, 0
    # A row that ends (it does here) is padded while the batch goes on, as generate() does with an
    # end-of-sequence token; without one, lm-eval's stop criterion ends a lone row but not a batch.
    model.generation_config.eos_token_id = 2
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("method", ["mspoe", "buckets"])
def test_batched_equals_unbatched_on_gemma3(gemma3_checkpoint, method):
    """Right-padded loglikelihood batches and left-padded generation on sliding + full layers."""
    one = METHODS[method](gemma3_checkpoint, batch_size=1)
    many = METHODS[method](gemma3_checkpoint, batch_size=3)
    assert loglikelihoods(many) == pytest.approx(loglikelihoods(one), abs=1e-4)
    assert generations(many) == generations(one)


@pytest.mark.parametrize("method, arch", [("mspoe_fixed", "qwen2"), ("moice", "qwen2"), ("mspoe_fixed", "gemma3")])
def test_cached_generation_equals_uncached(method, arch):
    # Gemma-3: a 16-token prompt and 8 new tokens against a sliding window of 8, so the
    # sliding layers' cache drops keys while decoding.
    model = build(arch)
    if method == "moice":
        moice.install(model)
    else:
        # A fixed head order: with the per-sample order, an uncached step would re-rank the heads.
        mspoe.install(model, layers="0:", head_order="fixed")
    ids = random_ids(16, batch=2)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    steps = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = model.generate(ids, **steps)
        uncached = model.generate(ids, use_cache=False, **steps)
    assert_same_greedy_steps(cached.sequences, uncached.sequences, torch.stack(cached.logits), torch.stack(uncached.logits))


def test_mspoe_decoding_keeps_the_head_order_of_the_prefill():
    model = mspoe.install(tiny_model("llama"), layers="0:")
    ids = random_ids(16)
    with torch.no_grad():
        out = model(ids, use_cache=True)
        ratios = {k: v.clone() for k, v in mspoe.get_state(model).head_ratios.items()}
        cache = getattr(out, "cache", None) or out.past_key_values  # renamed in transformers 5.24
        model(random_ids(1, seed=5), use_cache=True, **{cache_keyword(model): cache})
    assert all(torch.equal(mspoe.get_state(model).head_ratios[k], v) for k, v in ratios.items())


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_buckets_cached_generation_equals_recomputing_each_step(arch, monkeypatch):
    model = buckets.install(build(arch))
    ids = random_ids(12)
    full_logits, cached_logits = buckets.forward_logits, []

    def recorded(*args, **kwargs):  # what generate's steps score on the cache
        cached_logits.append(full_logits(*args, **kwargs))
        return cached_logits[-1]

    monkeypatch.setattr(buckets, "forward_logits", recorded)
    with torch.no_grad():
        cached = buckets.generate(model, ids, max_new_tokens=6)
        sequence, recomputed_logits = ids, []
        for _ in range(6):
            recomputed_logits.append(full_logits(model, sequence)[:, -1])
            sequence = torch.cat([sequence, recomputed_logits[-1].argmax(-1, keepdim=True)], dim=-1)
    assert_same_greedy_steps(cached, sequence, torch.stack(cached_logits), torch.stack(recomputed_logits))


def _as_multi_head(gqa_model):
    """The same function with every kv head copied per query head (num_key_value_heads = num_heads)."""
    config = gqa_model.config
    mha = tiny_model("llama", num_key_value_heads=config.num_attention_heads)
    state = {}
    groups = config.num_attention_heads // config.num_key_value_heads
    for name, tensor in gqa_model.state_dict().items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            tensor = tensor.view(config.num_key_value_heads, -1, tensor.shape[-1]).repeat_interleave(groups, 0)
            tensor = tensor.reshape(-1, tensor.shape[-1])
        state[name] = tensor
    mha.load_state_dict(state)
    return mha


def test_mspoe_is_exact_under_grouped_query_attention():
    gqa = tiny_model("llama")
    mha = _as_multi_head(gqa)
    ids = random_ids(20, batch=2)
    with torch.no_grad():
        assert torch.allclose(gqa(ids).logits, mha(ids).logits, atol=1e-5)
        mspoe.install(gqa, layers="0:")
        mspoe.install(mha, layers="0:")
        # Each query head sees keys at its own ratio, so sharing kv heads changes nothing.
        assert torch.allclose(gqa(ids).logits, mha(ids).logits, atol=1e-4)


def test_head_order_maps_to_ratios_rank_or_reference():
    table = mspoe.ratio_table(4, 1.2, 1.8)
    assert table.tolist() == pytest.approx([1.2, 1.35, 1.5, 1.65])
    shares = torch.tensor([[0.1, 0.4, 0.0, 0.2]])  # ranking: head 1, head 3, head 0, head 2
    rank = mspoe.ratios_from_shares(shares, table, "rank")
    # The paper: the most position-aware head (most outliers) gets the smallest ratio.
    assert rank[0].tolist() == pytest.approx([1.5, 1.2, 1.65, 1.35])
    # The reference code: head h gets table[order[h]], order = [1, 3, 0, 2].
    reference = mspoe.ratios_from_shares(shares, table, "reference")
    assert reference[0].tolist() == pytest.approx([1.35, 1.65, 1.2, 1.5])


def test_outlier_share_counts_keys_above_three_times_the_mean():
    key = torch.zeros(1, 1, 8, 2)
    key[0, 0, 3] = torch.tensor([10.0, 0.0])  # one key dominates
    query = torch.tensor([[[1.0, 0.0]]])
    visible = torch.ones(1, 8, dtype=torch.bool)
    assert mspoe.outlier_share(query, key, visible, scaling=1.0).item() == pytest.approx(1 / 8)
    assert mspoe.outlier_share(query, torch.zeros(1, 1, 8, 2), visible, 1.0).item() == 0.0


def test_moice_gates_round_trip_and_training_moves_only_the_routers(tmp_path):
    model = moice.install(tiny_model("llama"))
    frozen = {n: p.clone() for n, p in model.named_parameters() if "moice_router" not in n}
    before = [p.clone() for r in moice.routers(model) for p in r.parameters()]
    chunks = [random_ids(32, seed=s)[0] for s in range(4)]
    history = moice_training.train_gates(model, chunks, steps=3, lr=1e-2, log=lambda _: None)
    assert len(history) == 3 and all("balance_loss" in h for h in history)
    after = [p for r in moice.routers(model) for p in r.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)

    path = moice.save_gates(model, str(tmp_path / "gates.pt"))
    ids = random_ids(16)
    with torch.no_grad():
        expected = model(ids).logits
        reloaded = moice.install(tiny_model("llama"), gates=path)
        assert torch.allclose(reloaded(ids).logits, expected, atol=1e-6)


def test_training_the_routers_lowers_the_lm_loss_they_are_trained_on():
    model = moice.install(tiny_model("llama"))
    chunks = [random_ids(32, seed=s)[0] for s in range(2)]
    before = moice_training.mean_lm_loss(model, chunks)
    moice_training.train_gates(model, chunks, steps=15, lr=3e-2, aux_coef=0.0, log=lambda _: None)
    assert moice_training.mean_lm_loss(model, chunks) < before


def test_balance_loss_is_one_when_uniform_and_larger_when_collapsed():
    uniform = [torch.zeros(1, 2, 5, 4)]
    collapsed = [torch.tensor([5.0, 0, 0, 0]).expand(1, 2, 5, 4)]
    assert moice_training.balance_loss(uniform).item() == pytest.approx(1.0, abs=0.3)
    assert moice_training.balance_loss(collapsed).item() > 3.5


def test_synthetic_corpus_asks_about_facts_it_stated():
    document = moice_training.synthetic_corpus(1, seed=3)[0]
    text, questions = document.split("\n", 1)
    for line in questions.splitlines():
        count = line.rsplit("Answer: ", 1)[1].rstrip(".")
        assert f"holds {count} " in text


# ----------------------------------------------------------------------------- errors


def test_bad_arguments_fail_before_the_model_loads(tmp_path):
    missing = str(tmp_path / "no_model_here")
    with pytest.raises(MethodError, match=r"min_ratio=2, max_ratio=1\.5"):
        MsPoELM(pretrained=missing, min_ratio=2.0, max_ratio=1.5)
    for value, says in (("x", "is not a number"), ("nan", "is not allowed"), ("0", "is out of range")):
        with pytest.raises(MethodError, match=f"mspoe_hf: min_ratio='{value}' {says}"):
            MsPoELM(pretrained=missing, min_ratio=value)
    with pytest.raises(MethodError, match="head_mapping='inverse' is not one of rank, reference"):
        MsPoELM(pretrained=missing, head_mapping="inverse")
    with pytest.raises(MethodError, match="bases='1;x' is not understood"):
        BucketsLM(pretrained=missing, bases="1;x")
    with pytest.raises(MethodError, match="bases='1;-2'.*> 0"):
        BOUND.moice(pretrained=missing, bases="1;-2")
    with pytest.raises(MethodError, match="gates file not found"):
        BOUND.moice(pretrained=missing, gates=str(tmp_path / "none.pt"))
    foreign = tmp_path / "foreign.pt"
    torch.save({"format": "something-else"}, foreign)
    with pytest.raises(MethodError, match="format 'something-else'"):
        BOUND.moice(pretrained=missing, gates=str(foreign))


def test_bad_layers_and_top_k_name_what_is_accepted():
    with pytest.raises(MethodError, match=r"layers='7:'.*layers 0\.\.3"):
        mspoe.install(tiny_model("llama"), layers="7:")
    with pytest.raises(MethodError, match="layers='two' is not understood"):
        mspoe.install(tiny_model("llama"), layers="two")
    with pytest.raises(MethodError, match=r"top_k=9 is out of range; give 1\.\.7"):
        moice.install(tiny_model("llama"), top_k=9)
    for value, says in ((2.5, "top_k=2.5 is not allowed"), ("inf", "top_k='inf' is not allowed"),
                        (0, "top_k=0 is out of range"), ("x", "top_k='x' is not a number")):
        with pytest.raises(MethodError, match=f"moice_hf: {says}"):
            moice.check_arguments(top_k=value)


def test_a_malformed_layers_and_a_top_k_above_the_bases_fail_before_the_model_loads(tmp_path):
    """Their syntax and the bases' count need no model: named before the (slow) load, not after it."""
    missing = str(tmp_path / "no_model_here")
    for make in (lambda: MsPoELM(pretrained=missing, layers="two"),
                 lambda: FitMLM(pretrained=missing, strength=0.5, layers="a:b"),
                 lambda: PosHiddenLM(pretrained=missing, channels="3", factor=0.5, layers="1;x")):
        with pytest.raises(MethodError, match="is not understood; give a slice like '2:'"):
            make()
    with pytest.raises(MethodError, match=r"top_k=3 is out of range; give 1\.\.2 \(the number of bases\)"):
        BOUND.moice(pretrained=missing, bases="1;2", top_k=3)
    gates = moice.save_gates(moice.install(tiny_model("llama"), bases="1;2;4", top_k=2), str(tmp_path / "g.pt"))
    with pytest.raises(MethodError, match=r"top_k=4 is out of range; give 1\.\.3"):
        BOUND.moice(pretrained=missing, gates=gates, top_k=4)
    listed, saved, top_k = moice.check_arguments(gates=gates)  # the file's bases and top_k, when none are given
    assert (listed, saved["top_k"], top_k) == ([1.0, 2.0, 4.0], 2, 2)


def test_gates_for_another_model_are_refused(tmp_path):
    path = moice.save_gates(moice.install(tiny_model("llama")), str(tmp_path / "g.pt"))
    with pytest.raises(MethodError, match="trained for 4 layers.*this model has 2 layers"):
        moice.install(tiny_model("llama", num_hidden_layers=2), gates=path)


def test_base_changes_need_plain_rope():
    llama3 = tiny_model(
        "llama",
        rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 128},
    )
    with pytest.raises(LPESError, match="rope_type='llama3'"):  # rope_math's refusal, a core one
        buckets.install(llama3)
    with pytest.raises(LPESError, match="rope_type='llama3'"):
        moice.install(llama3)


def test_gemma3_refusals_say_why():
    with pytest.raises(MethodError, match=r"moice_hf cannot run on model type 'gemma3_text': its layer types "
                                            r"\(sliding_attention, full_attention\) each have their own RoPE.*routers"):
        moice.install(tiny_gemma3())
    with pytest.raises(MethodError, match=r"absolute_bases=true is ambiguous on model type 'gemma3_text'.*"
                                            r"sliding_attention theta=10000, full_attention theta=1e\+06"):
        buckets.install(tiny_gemma3(), bases="10000;20000", absolute_bases=True)
    linear = tiny_gemma3()
    linear.config.rope_parameters["full_attention"].update(rope_type="linear", factor=8.0)  # as gemma-3-4b and up
    with pytest.raises(LPESError, match=r"'gemma3_text', layer type full_attention\) uses rope_type='linear'"):
        buckets.install(linear)
    for model in (tiny_gemma3(), linear):
        assert not hasattr(model, "_moice_state") and not hasattr(model, "_buckets_state")
        assert not any(m._forward_hooks for m in model.modules()), "a refused baseline leaves nothing behind"


def test_unsupported_attention_kernel_is_named():
    model = tiny_model("llama")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(MethodError, match="supports attn_implementation sdpa or eager; the model uses 'flex_attention'"):
        mspoe.install(model)
