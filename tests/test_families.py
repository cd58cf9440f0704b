"""LPES on every RoPE decoder family of transformers: one row per family, tiny random configs.

Each supported row checks that
- a near-1 scale (1 + 1e-6) on each layer in turn gives vanilla logits (to float tolerance),
  and a real scale on each layer changes them (no layer is silently left unscaled);
- mixed scales match an independent reference: each layer's (cos, sin) computed by hand at
  ``position_ids / s_h``, from that layer's own RoPE (its layer type's frequencies), and
  patched into the layer by a hook of the test's own;
- cached greedy ``generate`` equals full recomputation;
- ``remove()`` restores the model exactly;
- each baseline either reduces to vanilla in its trivial setting or refuses at install with
  an error naming the model type (and Buckets' answer-logits path reads its full logits);
- the answer-logits scorers' output layer gives the model's own logits.

A row LPES cannot scale must be refused at ``install`` with an error naming the model type
and the reason. Add a family by adding a row to ``FAMILIES``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
import torch
from tiny_models import assert_same_greedy_steps, cached_and_recomputed_greedy, logits, random_ids, tiny_family_model

from lpes_harness.core import rope, rope_anatomy
from lpes_harness.methods import buckets, moice, mspoe

pytestmark = pytest.mark.filterwarnings("ignore:moice_hf without gates")

ALL_BASELINES = frozenset({"mspoe", "buckets", "moice"})
GEMMA3_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


@dataclass(frozen=True)
class Family:
    name: str
    config: str  # transformers config class
    model: str  # transformers causal-LM class
    overrides: dict = field(default_factory=dict)  # on top of tiny_models.FAMILY_COMMON
    attn: str = "sdpa"
    layout: str = "half"  # the reference's (cos, sin) layout: "half" (cat(f, f)) or "interleaved"
    nope: tuple = ()  # layers without RoPE: a scale other than 1 there must be refused
    refused: str | None = None  # regex of the install error, for a family LPES must refuse
    baselines: frozenset = frozenset()  # the baselines that work; the others must refuse at install
    checked: str = ""  # what the row exercises beyond plain RoPE (for the README table)


FAMILIES = [
    Family("llama", "LlamaConfig", "LlamaForCausalLM", baselines=ALL_BASELINES),
    Family(
        "llama-llama3",
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        baselines=frozenset({"mspoe"}),
        checked="llama3 rope_scaling",
    ),
    Family(
        "llama-dynamic",
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(max_position_embeddings=32, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
        baselines=frozenset({"mspoe"}),
        checked="dynamic NTK, inputs past max_position_embeddings",
    ),
    Family("qwen2", "Qwen2Config", "Qwen2ForCausalLM", baselines=ALL_BASELINES),
    Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16), baselines=ALL_BASELINES, checked="q/k norm"),
    Family("mistral", "MistralConfig", "MistralForCausalLM", dict(sliding_window=16), baselines=ALL_BASELINES),
    Family("phi3", "Phi3Config", "Phi3ForCausalLM", baselines=frozenset({"buckets"}), checked="fused qkv"),
    Family(
        "phi3-longrope",
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(max_position_embeddings=128, original_max_position_embeddings=32, rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
            "short_factor": [1.0 + 0.1 * i for i in range(8)], "long_factor": [1.5 + 0.5 * i for i in range(8)]}),
        checked="LongRoPE, inputs past original_max_position_embeddings",
    ),
    Family("phi", "PhiConfig", "PhiForCausalLM", dict(partial_rotary_factor=0.5), baselines=frozenset({"buckets"}),
           checked="partial rotary"),
    Family("gemma", "GemmaConfig", "GemmaForCausalLM", dict(head_dim=16), baselines=ALL_BASELINES),
    Family(
        "gemma2",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
        attn="eager",
        baselines=frozenset({"buckets"}),
        checked="sliding/full layers, attention softcapping",
    ),
    Family(
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16, layer_types=GEMMA3_TYPES,
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}),
        baselines=frozenset({"mspoe"}),
        checked="one rotary call per layer type (bases 10k / 1M, linear x8 on full layers)",
    ),
    Family(
        "gemma3-plain",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=24, layer_types=GEMMA3_TYPES,
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}),
        baselines=frozenset({"mspoe", "buckets"}),
        checked="plain RoPE on both layer types (Gemma-3 270M / 1B), query_pre_attn_scalar != head_dim",
    ),
    Family("olmo2", "Olmo2Config", "Olmo2ForCausalLM", baselines=frozenset({"buckets"}), checked="q/k norm over all heads"),
    Family("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", dict(partial_rotary_factor=0.25),
           baselines=frozenset({"buckets"}), checked="partial rotary, fused qkv"),
    Family("stablelm", "StableLmConfig", "StableLmForCausalLM", baselines=frozenset({"buckets"}), checked="partial rotary"),
    Family("cohere", "CohereConfig", "CohereForCausalLM", dict(logit_scale=1.0), layout="interleaved",
           checked="interleaved rotary"),
    Family(
        "granite",
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.25, logits_scaling=2.0),
        baselines=ALL_BASELINES,
        checked="muP multipliers",
    ),
    Family("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", nope=(3,), baselines=frozenset({"buckets"}),
           checked="NoPE every 4th layer"),
    Family("cohere2", "Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=8, logit_scale=1.0),
           layout="interleaved", nope=(3,), checked="NoPE full-attention layers"),
    Family("exaone4", "Exaone4Config", "Exaone4ForCausalLM",
           dict(sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"]), nope=(3,),
           baselines=frozenset({"buckets"}), checked="NoPE global layers"),
    Family("falcon", "FalconConfig", "FalconForCausalLM", dict(new_decoder_architecture=True, num_kv_heads=2),
           baselines=frozenset({"buckets"}), checked="layers in `h`, fused qkv"),
    Family("falcon-alibi", "FalconConfig", "FalconForCausalLM", dict(alibi=True), refused=r"'falcon'.*ALiBi"),
    Family("llama4", "Llama4TextConfig", "Llama4ForCausalLM",
           dict(head_dim=16, num_local_experts=2, intermediate_size_mlp=128),
           refused=r"'llama4_text'.*complex tensor \(`freqs_cis`"),
]
SUPPORTED = [f for f in FAMILIES if f.refused is None]
REFUSED = [f for f in FAMILIES if f.refused is not None]
BY_NAME = {f.name: f for f in FAMILIES}

LENGTH = 40  # past llama-dynamic's max_position_embeddings and phi3-longrope's original length (32)


def build(family: Family, seed: int = 0):
    model = tiny_family_model(family.config, family.model, seed=seed, attn_implementation=family.attn, **family.overrides)
    if model is None:
        pytest.skip(f"transformers has no {family.model}")
    return model


def mixed_scales(family: Family) -> list[float]:
    # 1.7 on a sliding and a full layer of Gemma-3 (one scale, two calls), a 1.0 and a < 1 layer.
    scales = [1.7, 1.0, 0.8, 1.7]
    return [1.0 if i in family.nope else s for i, s in enumerate(scales)]


def scalable_layers(model, family: Family) -> list[int]:
    return [i for i in range(rope.num_layers(model)) if i not in family.nope]


# ----------------------------------------------------------------------------- the reference


def reference_logits(model, ids, scales, family: Family):
    """Each layer's (cos, sin) at ``position_ids / s_h``, computed by hand and patched in by hand.

    Knows the families, not rope.py: the frequencies are read from the model's rotary module
    (per layer type where it has them) after the model's own call at the true positions
    (dynamic NTK and LongRoPE pick them there), and laid out as the family lays them out.
    """
    decoder = model.base_model
    rotary = decoder.rotary_emb
    layers = decoder.layers if hasattr(decoder, "layers") else decoder.h
    layer_types = getattr(model.config, "layer_types", None)
    positions = torch.arange(ids.shape[1])[None]

    def cos_sin(layer_index, scale):
        layer_type = layer_types[layer_index] if layer_types else None
        prefix = f"{layer_type}_" if layer_type and hasattr(rotary, f"{layer_type}_inv_freq") else ""
        inv_freq = getattr(rotary, f"{prefix}inv_freq").double()
        attention_scaling = getattr(rotary, f"{prefix}attention_scaling")
        freqs = (positions.double() / scale)[..., None] * inv_freq
        emb = freqs.repeat_interleave(2, dim=-1) if family.layout == "interleaved" else torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * attention_scaling).float(), (emb.sin() * attention_scaling).float()

    def patch(layer_index, scale):
        def hook(module, args, kwargs):
            kwargs["position_embeddings"] = cos_sin(layer_index, scale)
            return args, kwargs

        return hook

    handles = [
        layer.register_forward_pre_hook(patch(index, scale), with_kwargs=True)
        for index, (layer, scale) in enumerate(zip(layers, scales))
    ]
    try:
        return logits(model, ids, position_ids=positions)
    finally:
        for handle in handles:
            handle.remove()


# ----------------------------------------------------------------------------- supported families


def ids_of(families):
    return [pytest.param(f, id=f.name) for f in families]


@pytest.mark.parametrize("family", ids_of(SUPPORTED))
def test_near_one_scale_on_each_layer_is_vanilla_and_a_real_scale_is_not(family):
    model = build(family)
    ids = random_ids(LENGTH)
    vanilla = logits(model, ids)
    rope.install(model, 1.0)
    assert torch.equal(logits(model, ids), vanilla), "all-ones must be bit-exact vanilla"
    for layer in scalable_layers(model, family):
        scales = [1.0] * rope.num_layers(model)
        scales[layer] = 1 + 1e-6
        rope.set_scales(model, scales)
        near = (logits(model, ids) - vanilla).abs().max().item()
        assert near < 1e-4, f"layer {layer}: scale 1+1e-6 moved the logits by {near:.1e}"
        scales[layer] = 2.0
        rope.set_scales(model, scales)
        far = (logits(model, ids) - vanilla).abs().max().item()
        assert far > 1e-3, f"layer {layer}: scale 2 left the logits unchanged ({far:.1e}): is it NoPE?"


@pytest.mark.parametrize("family", ids_of(SUPPORTED))
def test_mixed_scales_match_the_independent_reference(family):
    model = build(family)
    ids = random_ids(LENGTH)
    scales = mixed_scales(family)
    vanilla = logits(model, ids)
    expected = reference_logits(model, ids, scales, family)
    rope.install(model, scales)
    ours = logits(model, ids)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
    assert (ours - vanilla).abs().max() > 1e-2, "the scales must actually change the logits"


@pytest.mark.parametrize("family", ids_of(SUPPORTED))
def test_cached_greedy_generation_equals_full_recomputation(family):
    model = build(family)
    rope.install(model, mixed_scales(family))
    assert_same_greedy_steps(*cached_and_recomputed_greedy(model, random_ids(20)))


@pytest.mark.parametrize("family", ids_of(SUPPORTED))
def test_the_answer_logits_output_layer_is_the_models_own(family):
    """What the answer-logits scorers run after the decoder gives the model's own logits (Granite divides them)."""
    from lpes_harness.core.models import output_layer

    model = build(family)
    ids = random_ids(LENGTH)
    with torch.no_grad():
        ours = output_layer(model, model.get_decoder()(input_ids=ids).last_hidden_state)
    torch.testing.assert_close(ours, logits(model, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ids_of(SUPPORTED))
def test_remove_restores_the_model_exactly(family):
    # Dynamic NTK keeps state across calls even in vanilla transformers, so the model is
    # compared with a twin that went through the same inputs without LPES.
    model, twin = build(family), build(family)
    ids, long_ids = random_ids(LENGTH), random_ids(2 * LENGTH)
    hooks = {name: (len(m._forward_hooks), len(m._forward_pre_hooks)) for name, m in model.named_modules()}
    rope.install(model, [0.5 if i not in family.nope else 1.0 for i in range(rope.num_layers(model))])
    logits(model, long_ids)  # scaled positions well past every threshold
    rope.remove(model)
    logits(twin, long_ids)
    assert torch.equal(logits(model, ids), logits(twin, ids))
    assert {name: (len(m._forward_hooks), len(m._forward_pre_hooks)) for name, m in model.named_modules()} == hooks
    assert not hasattr(model.config, rope.CONFIG_KEY)


@pytest.mark.parametrize("family", ids_of([f for f in SUPPORTED if f.nope]))
def test_a_scale_on_a_nope_layer_is_refused(family):
    model = build(family)
    for layer in family.nope:
        scales = [1.0] * rope.num_layers(model)
        scales[layer] = 1.5
        with pytest.raises(rope_anatomy.LPESError, match=rf"'{model.config.model_type}'.*\[{layer}\].*apply no RoPE"):
            rope.install(model, scales)
        assert not rope.is_installed(model)
    rope.install(model, 1.0)
    with pytest.raises(rope_anatomy.LPESError, match="apply no RoPE"):
        rope.set_scales(model, 1.5)
    assert rope.get_scales(model) == [1.0] * rope.num_layers(model), "a refused set_scales changes nothing"
    assert sorted(rope_anatomy.nope_layers(model)) == list(family.nope)


# ----------------------------------------------------------------------------- refused families


@pytest.mark.parametrize("family", ids_of(REFUSED))
def test_unsupported_family_is_refused_at_install(family):
    model = build(family)
    with pytest.raises(rope_anatomy.LPESError, match=family.refused):
        rope.install(model, 1.0)
    assert not rope.is_installed(model)


# ----------------------------------------------------------------------------- baselines


def _baseline_logits(name, model, ids):
    if name == "buckets":
        with torch.no_grad():
            return buckets.forward_logits(model, ids)
    return logits(model, ids)


TRIVIAL = {
    "mspoe": lambda model: mspoe.install(model, min_ratio=1.0, max_ratio=1.0, layers="0:"),
    "buckets": lambda model: buckets.install(model, bases="1.0"),
    "moice": lambda model: moice.install(model, bases="1;1"),
}
MODULES = {"mspoe": mspoe, "buckets": buckets, "moice": moice}


@pytest.mark.parametrize("baseline", sorted(ALL_BASELINES))
@pytest.mark.parametrize("family", ids_of(FAMILIES))
def test_each_baseline_works_or_refuses_at_install(family, baseline):
    model = build(family)
    ids = random_ids(24)
    vanilla = logits(model, ids)
    if baseline not in family.baselines:
        with pytest.raises(rope_anatomy.LPESError, match=re.escape(f"'{model.config.model_type}'")):  # MethodError, or rope_math's
            TRIVIAL[baseline](model)
        assert torch.equal(logits(model, ids), vanilla), "a refused baseline leaves nothing behind"
        return
    TRIVIAL[baseline](model)
    trivial = _baseline_logits(baseline, model, ids)
    torch.testing.assert_close(trivial, vanilla, rtol=1e-5, atol=1e-5)
    if baseline == "buckets":  # its loglikelihood's logits at a few positions only, seven bases: the same numbers
        buckets.remove(model)
        buckets.install(model)
        rows, columns = torch.zeros(3, dtype=torch.long), torch.tensor([0, 11, 23])
        with torch.no_grad():
            full = buckets.forward_logits(model, ids)[0, columns]
            torch.testing.assert_close(buckets.answer_logits(model, ids, rows, columns), full, rtol=1e-4, atol=1e-4)
    MODULES[baseline].remove(model)
    assert torch.equal(logits(model, ids), vanilla)
