"""Tiny randomly initialised causal LMs built in code (no hub, no files)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

ARCHITECTURES = ("llama", "qwen2", "mistral")

_COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention, as in the real models
    max_position_embeddings=512,
    tie_word_embeddings=False,
)


def tiny_config(arch: str, attn_implementation: str = "sdpa", rope_parameters: dict | None = None, **overrides):
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    rope.update(rope_parameters or {})
    kwargs = dict(_COMMON, rope_parameters=rope, **overrides)
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[arch]
    config = config_cls(**kwargs)
    config._attn_implementation = attn_implementation
    return config


def tiny_model(arch: str, seed: int = 0, **config_kwargs):
    model_cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "mistral": MistralForCausalLM}[arch]
    torch.manual_seed(seed)
    model = model_cls(tiny_config(arch, **config_kwargs))
    # Random init is small; scale it up so attention is far from uniform and
    # position changes show in the logits.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "proj" in name:
                param.mul_(4.0)
    # No end-of-sequence token: generation tests compare fixed-length outputs.
    model.generation_config.eos_token_id = None
    return model.eval()


def random_ids(length: int, batch: int = 1, seed: int = 1, vocab: int = 96) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=generator)


def logits(model, ids, **kwargs) -> torch.Tensor:
    """One forward's logits, without autograd."""
    with torch.no_grad():
        return model(ids, **kwargs).logits


def cached_and_recomputed_greedy(model, prompt: torch.Tensor, new_tokens: int = 12):
    """Greedy continuations of ``prompt`` two ways: ``generate`` on its KV cache, and one whole forward per
    new token with no cache at all (the paper's claim: the two agree). Returns ``(cached, recomputed,
    cached_logits, recomputed_logits)``: the token sequences, and each step's next-token logits ``(steps, B, V)``
    both ways (equal tokens alone would hide a cache that moves the logits but not their argmax)."""
    with torch.no_grad():
        cached = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0,
                                output_logits=True, return_dict_in_generate=True)
    ids, steps = prompt, []
    for _ in range(new_tokens):
        steps.append(logits(model, ids, use_cache=False)[:, -1])
        ids = torch.cat([ids, steps[-1].argmax(-1, keepdim=True)], dim=1)
    return cached.sequences, ids, torch.stack(cached.logits), torch.stack(steps)


def pcd_cached_and_recomputed(model, ids, mask, monkeypatch, new_tokens: int = 8):
    """PCD's greedy decoding (its own loop: two rows a step) two ways, as :func:`cached_and_recomputed_greedy`
    returns them: ``pcd.generate`` on its KV cache, the logits each cached step scored caught on the way, and one
    whole ``forward_logits`` per new token over the left-padded batch (positions restart after the padding)."""
    from lpes_harness.methods import pcd

    def positions(mask):
        return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)

    full_logits, cached_logits = pcd.forward_logits, []
    monkeypatch.setattr(pcd, "forward_logits",  # what generate's steps score on the cache
                        lambda *a, **k: cached_logits.append(full_logits(*a, **k)) or cached_logits[-1])
    with torch.no_grad():
        cached = pcd.generate(model, ids, attention_mask=mask, max_new_tokens=new_tokens)
        sequence, steps = ids, []
        for _ in range(new_tokens):
            full_mask = torch.cat([mask, mask.new_ones(ids.shape[0], sequence.shape[1] - ids.shape[1])], -1)
            steps.append(full_logits(model, sequence, full_mask, positions(full_mask))[:, -1])
            sequence = torch.cat([sequence, steps[-1].argmax(-1, keepdim=True)], -1)
    return cached, sequence, torch.stack(cached_logits), torch.stack(steps)


def assert_same_greedy_steps(cached, recomputed, cached_logits, recomputed_logits) -> None:
    """Cached decoding is full recomputation: the same tokens, and at every step the same logits but for
    float32 rounding. The cache holds the very keys and values a full forward computes; only the attention's
    sums run over other shapes (one query against the cache vs. the whole square), so the logits (under 1 in
    size on the tiny models) differ by under 5e-7 on every family of test_families.py: 1e-5, the identity
    tests' tolerance, leaves a 20x margin."""
    assert torch.equal(cached, recomputed)
    assert cached_logits.shape == recomputed_logits.shape and len(cached_logits) > 0
    torch.testing.assert_close(cached_logits, recomputed_logits, rtol=1e-5, atol=1e-5)


def tiny_tokenizer():
    """A character-level fast tokenizer built in code (ids < 96, like the tiny models)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    chars = [chr(c) for c in range(32, 32 + 96 - len(specials))]
    vocab = {token: index for index, token in enumerate(specials + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def save_tiny_checkpoint(path, arch: str = "llama", seed: int = 0):
    """A local model directory (weights + tokenizer) that HFLM can load offline."""
    model = tiny_model(arch, seed=seed)
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = 1, 2, 0
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def save_tiny_checkpoint_with_tokenizer(path, tokenizer_folder, seed: int = 0, logit_scale: float = 60.0):
    """A tiny Llama (2 layers) behind a real model's tokenizer and chat template, saved where HFLM loads it:
    prompts of a real task tokenize as on that model, and a forward over thousands of them takes
    milliseconds, for tests of commands whose cost is the real model's forwards.

    Its output layer is scaled by ``logit_scale`` (random init gives logits of std ~0.2 over ~50k tokens,
    where greedy decoding would turn on gaps of float rounding; scaled, the top two are far apart)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    model = tiny_model("llama", seed=seed, num_hidden_layers=2, vocab_size=len(tokenizer), max_position_embeddings=8192)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.config.bos_token_id, model.config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


# ----------------------------------------------------------------------------- other families

# What every family's tiny config gets (a row's overrides win): the sizes above, and special
# token ids inside the tiny vocabulary (some configs default to ids like 32000).
FAMILY_COMMON = dict(_COMMON, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def tiny_family_model(config_class: str, model_class: str, seed: int = 0, attn_implementation: str = "sdpa", **overrides):
    """A tiny random model of any transformers family, by class names; ``None`` if transformers lacks it.

    Like :func:`tiny_model`: weights inside the decoder layers are scaled up so that
    attention is far from uniform and position changes show in the logits.
    """
    import transformers

    config_cls, model_cls = getattr(transformers, config_class, None), getattr(transformers, model_class, None)
    if config_cls is None or model_cls is None:
        return None
    config = config_cls(**dict(FAMILY_COMMON, **overrides))
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2 and (".layers." in name or ".h." in name):
                param.mul_(4.0)
    model.generation_config.eos_token_id = None
    return model.eval()


def tiny_gemma3_multimodal(seed: int = 0):
    """Gemma-3 as AutoModelForCausalLM loads gemma-3-4b and up: the text decoder inside a vision wrapper."""
    import transformers

    text = dict(FAMILY_COMMON, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4,
        boi_token_index=93, eoi_token_index=94, image_token_index=95,  # kept out of the text ids the test uses
    )
    torch.manual_seed(seed)
    return transformers.Gemma3ForConditionalGeneration(config).eval()


GEMMA3_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def tiny_gemma3(seed: int = 0, attn_implementation: str = "sdpa", theta_factor: float = 1.0):
    """Tiny Gemma-3 text model: sliding layers (theta 10k, a window of 8) and full layers (theta 1M),
    plain RoPE on both (as Gemma-3 270M / 1B), each theta times ``theta_factor``.

    ``query_pre_attn_scalar`` 24, not ``head_dim`` 16: an attention rewrite that used
    ``head_dim ** -0.5`` instead of the layer's ``scaling`` would show.
    """
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4 * theta_factor},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6 * theta_factor}}
    return tiny_family_model(
        "Gemma3TextConfig", "Gemma3ForCausalLM", seed=seed, attn_implementation=attn_implementation,
        head_dim=16, sliding_window=8, query_pre_attn_scalar=24, layer_types=GEMMA3_TYPES, rope_parameters=rope,
    )


# ----------------------------------------------------------------------------- a method through lm-eval
# The same few requests for every method's lm-eval model: loglikelihoods and greedy generations on a tiny
# checkpoint, compared with plain HFLM's (the identity) or with the method's definition.
LM_REQUESTS = [("The quick brown fox jumps over", " the lazy"), ("Lost in the middle of a long text", " it is"),
               ("abc def ghi", "jkl!")]
LM_PROMPTS = ["Once upon a time, far away,", "The key 1234 has value", "xyz uvw rst"]


def lm_loglikelihoods(lm):
    from lm_eval.api.instance import Instance

    return lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(LM_REQUESTS)], disable_tqdm=True)


def lm_generations(lm):
    from lm_eval.api.instance import Instance

    args = {"until": ["\n\n\n"], "max_gen_toks": 6, "do_sample": False}
    return lm.generate_until([Instance("generate_until", {}, (p, args), i) for i, p in enumerate(LM_PROMPTS)], disable_tqdm=True)


def plain_lm_answers(checkpoint):
    """Plain HFLM's loglikelihoods and generations of :data:`LM_REQUESTS` / :data:`LM_PROMPTS`."""
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=checkpoint, device="cpu", batch_size=3)
    return lm_loglikelihoods(lm), lm_generations(lm)
