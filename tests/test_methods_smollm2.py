"""On the real bundled SmolLM2-135M (GQA: 9 query heads, 3 kv heads; theta 1e5): every
baseline reduces to the vanilla model in its trivial setting and changes it otherwise.
One model load for the whole module."""

import pytest
import torch

from lpes_harness.methods import buckets, moice, mspoe
from lpes_harness.core.models import load_causal_lm

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:moice_hf without gates")]

PROMPT = "Document [1] The Eiffel Tower is in Paris. Document [2] The Colosseum is in Rome.\nQuestion: Where is the Colosseum?\nAnswer:"


def test_each_baseline_is_vanilla_when_trivial_and_differs_otherwise():
    model, tokenizer = load_causal_lm(attn_implementation="sdpa")
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"].to(model.device)
    with torch.no_grad():
        vanilla = model(ids).logits
        trivial_and_default = [
            (mspoe, dict(min_ratio=1.0, max_ratio=1.0), {}),
            (buckets, dict(bases="1.0"), {}),
            (moice, dict(bases="1;1;1;1;1;1;1"), {}),
        ]
        for method, trivial, default in trivial_and_default:
            method.install(model, **trivial)
            out = buckets.forward_logits(model, ids) if method is buckets else model(ids).logits
            assert torch.allclose(out, vanilla, atol=2e-4), method.__name__
            method.remove(model)
            method.install(model, **default)
            out = buckets.forward_logits(model, ids) if method is buckets else model(ids).logits
            assert not torch.allclose(out, vanilla, atol=1e-2), method.__name__
            method.remove(model)
