"""Representational-structure deviation on a tiny model: vanilla deviates by 0, scaled runs do not."""

import json

import pytest
import torch
from tiny_models import random_ids, save_tiny_checkpoint, tiny_model

from lpes_harness.core import rope
from lpes_harness.commands import rsm
from lpes_harness.evaluation import representation_structure


def test_layer_similarity_is_cosine_with_unit_diagonal():
    states = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    matrix = representation_structure.layer_similarity(states)
    torch.testing.assert_close(matrix.diagonal(), torch.ones(3))
    assert matrix[0, 1] == pytest.approx(0.0) and matrix[0, 2] == pytest.approx(2**-0.5)


def test_variants_are_perturbations_of_the_searched_scales():
    base = [1.0, 1.2, 1.4, 1.6, 1.8]
    variants = representation_structure.scale_variants(base, seeds=[0, 1, 2], y_min=1.0, y_max=2.0, noise=0.1)
    assert variants["bezier"] == [base] and variants["uniform"] == [[1.4] * 5]
    for noisy in variants["noisy"]:
        assert all(abs(n - b) <= 0.1 + 1e-12 for n, b in zip(noisy, base)) and noisy != base
    assert all(sorted(s) == base for s in variants["shuffled"])
    assert all(1.0 <= v <= 2.0 for s in variants["random"] for v in s)
    assert len({tuple(s) for s in variants["random"]}) == 3  # seeds differ


def test_identity_scales_deviate_by_zero_and_real_scales_do_not():
    model = tiny_model("llama")
    inputs = [random_ids(40, seed=s) for s in (1, 2)]
    results = representation_structure.run(model, inputs, {"identity": [[1.0] * 4], "double": [[2.0] * 4], "mixed": [[1.0, 3.0, 1.0, 3.0]]})
    assert not rope.is_installed(model)
    deviations = {name: entry["mean"] for name, entry in results["variants"].items()}
    assert deviations["identity"] == 0.0
    assert deviations["double"] > 1e-4 and deviations["mixed"] > 1e-4


def test_cli_writes_json_and_plot(tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny")
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"prompt": f"key {i}: value {i * 7} and more text"}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    code = rsm.main(["--pretrained", checkpoint, "--texts", str(texts), "--num-inputs", "2", "--scales", "1;1.5;2;1.5", "--seeds", "2", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "rsm.json").read_text())
    assert set(results["variants"]) == set(representation_structure.VARIANTS) and results["num_inputs"] == 2
    assert len(results["variants"]["noisy"]["deviations"]) == 2
    assert (out / "rsm.png").read_bytes()[:4] == b"\x89PNG"
