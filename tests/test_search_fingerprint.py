"""The resume fingerprint: any setting that changes a fitness value, the model's identity and the
library versions; a change to any of them is one named mismatch, and only ``generations`` may grow."""

import argparse
import hashlib
import json
import os
import subprocess

import pytest
from tiny_models import save_tiny_checkpoint

from lpes_harness.search import fingerprint as fp
from lpes_harness.search.fingerprint import FITNESS_KEYS, fingerprint, mismatches

SETTINGS = {
    "task": "kv_retrieval", "metadata": {"num_pairs": 30}, "mode": "greedy", "scorer": "answer-logits",
    "weights": {"begin": 0.2, "middle": 0.3, "end": 0.5}, "positions": {"begin": (0,), "middle": (40,), "end": (100,)},
    "num_samples": 20, "racing": True, "chunk_size": 10, "chat_template": None,
    "pretrained": None, "model_args": "", "dtype": "float32",
    "population": 8, "parents": 3, "mutants": 4, "crossovers": 1, "generations": 4, "mutation": "paper", "seed": 0,
}
CHANGES = {
    "task": "mdqa",
    "metadata": {"num_pairs": 10},
    "mode": "logprob",
    "scorer": "lm-eval",
    "weights": {"begin": 0.5, "middle": 0.3, "end": 0.2},
    "positions": {"begin": (0,), "middle": (60,), "end": (100,)},
    "num_samples": 50,
    "racing": False,
    "chunk_size": 5,
    "chat_template": True,
    "objective": "ranked",
}


def saved_and_loaded(value):
    """What a checkpoint gives back: the fingerprint through JSON."""
    return json.loads(json.dumps(value))


def test_a_fingerprint_survives_json_and_matches_itself():
    first = fingerprint(SETTINGS)
    assert mismatches(saved_and_loaded(first), fingerprint(dict(SETTINGS))) == []
    assert set(first) == {"format", "fitness", "model", "versions", "search"}
    assert set(first["fitness"]) == set(FITNESS_KEYS)
    assert set(first["versions"]) == {"lm_eval", "transformers"} and all(first["versions"].values())
    model = first["model"]
    assert model["pretrained"] == "bundled" and model["gguf_file"].endswith(".gguf")
    (stat,) = model["files"].values()
    assert stat["size"] > 10_000_000 and stat["modified"]


@pytest.mark.parametrize("key", sorted(CHANGES))
def test_each_fitness_setting_changed_is_one_named_mismatch(key):
    saved = saved_and_loaded(fingerprint(SETTINGS))
    lines = mismatches(saved, fingerprint(dict(SETTINGS, **{key: CHANGES[key]})))
    assert len(lines) == 1 and lines[0].startswith(f"fitness.{key}: saved "), lines


@pytest.mark.parametrize("key, value", [("pretrained", "HuggingFaceTB/SmolLM2-135M"), ("model_args", "revision=abc"),
                                        ("dtype", "bfloat16")])
def test_model_identity_changed_is_named(key, value):
    lines = mismatches(saved_and_loaded(fingerprint(SETTINGS)), fingerprint(dict(SETTINGS, **{key: value})))
    assert lines and all(line.startswith("model.") for line in lines), lines
    assert any(line.startswith(f"model.{key}: ") for line in lines), lines


def test_a_model_file_with_other_content_is_a_mismatch_and_a_touched_or_copied_one_is_not(tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", "llama")
    settings = dict(SETTINGS, pretrained=checkpoint)
    saved = saved_and_loaded(fingerprint(settings))
    assert "model.safetensors" in saved["model"]["files"] and "config.json" in saved["model"]["files"]
    weights = tmp_path / "tiny" / "model.safetensors"
    content = weights.read_bytes()
    assert saved["model"]["files"]["model.safetensors"]["sha256"] == hashlib.sha256(content).hexdigest()
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a copy on another machine: same bytes
    assert mismatches(saved, fingerprint(settings)) == []
    weights.write_bytes(content[:-1] + bytes([content[-1] ^ 1]))  # same size, one bit else
    now = {key: fingerprint(settings)["model"]["files"]["model.safetensors"][key] for key in ("sha256", "size")}
    assert mismatches(saved, fingerprint(settings)) == [
        f"model.files.model.safetensors: saved {json.dumps({k: saved['model']['files']['model.safetensors'][k] for k in ('sha256', 'size')}, sort_keys=True)}, "
        f"now {json.dumps(now, sort_keys=True)}"
    ]
    with open(weights, "ab") as handle:
        handle.write(b"\0")
    assert any(line.startswith("model.files.model.safetensors:") for line in mismatches(saved, fingerprint(settings)))


def test_a_fingerprint_from_before_the_hash_compares_size_and_modification_time(tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", "llama")
    settings = dict(SETTINGS, pretrained=checkpoint)
    saved = saved_and_loaded(fingerprint(settings))
    for stat in saved["model"]["files"].values():
        del stat["sha256"]
    assert mismatches(saved, fingerprint(settings)) == []
    weights = tmp_path / "tiny" / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    (line,) = mismatches(saved, fingerprint(settings))
    assert line.startswith("model.files.model.safetensors: saved {\"modified\": ")
    # The line says how to resume with the same file: the command it quotes makes the two agree.
    command = line[line.index("touch -d "):].rstrip(")")
    subprocess.run(command, shell=True, check=True)
    assert mismatches(saved, fingerprint(settings)) == []
    with open(weights, "ab") as handle:  # another size: no such hint, the file is not the same
        handle.write(b"\0")
    (line,) = mismatches(saved, fingerprint(settings))
    assert "touch" not in line


def test_another_library_version_is_a_mismatch(monkeypatch):
    saved = saved_and_loaded(fingerprint(SETTINGS))
    monkeypatch.setattr(fp, "_version", lambda name: "9.9.9" if name == "transformers" else saved["versions"][name])
    assert mismatches(saved, fingerprint(SETTINGS)) == [f"versions.transformers: saved {saved['versions']['transformers']!r}, now '9.9.9'"]


def test_generations_may_grow_and_nothing_else():
    saved = saved_and_loaded(fingerprint(SETTINGS))
    assert mismatches(saved, fingerprint(dict(SETTINGS, generations=10))) == []
    assert mismatches(saved, fingerprint(dict(SETTINGS, generations=2))) == ["search.generations: saved 4, now 2 (it may only grow)"]
    assert mismatches(saved, fingerprint(dict(SETTINGS, population=9, mutation="joint"))) == [
        "search.mutation: saved 'paper', now 'joint'", "search.population: saved 8, now 9"]
    # A random generation 0 is another search; the paper's (absent from older fingerprints) is not a change.
    assert mismatches(saved, fingerprint(dict(SETTINGS, initial="mutants"))) == []
    assert mismatches(saved, fingerprint(dict(SETTINGS, initial="random"))) == [
        "search.initial: saved (absent), now 'random'"]


def test_a_missing_setting_shows_as_absent_and_another_format_is_one_line():
    saved = saved_and_loaded(fingerprint(SETTINGS))
    current = fingerprint(SETTINGS)
    del current["search"]["seed"]
    assert mismatches(saved, current) == ["search.seed: saved 0, now (absent)"]
    assert mismatches({"format": "lpes-fingerprint/0"}, current) == ["format: saved 'lpes-fingerprint/0', now 'lpes-fingerprint/1'"]


def test_a_command_line_namespace_reads_like_the_fitness_config():
    namespace = argparse.Namespace(
        task="kv_retrieval", metadata='{"num_pairs": 30}', fitness="greedy", scorer="answer-logits",
        weights="0.2,0.3,0.5", weights_dict={"begin": 0.2, "middle": 0.3, "end": 0.5},
        positions_dict={"begin": 0, "middle": 40, "end": 100}, num_samples=20, no_racing=False, chunk_size=10,
        chat_template=None, pretrained=None, model_args="", dtype="float32",
    )
    from_namespace = fingerprint(namespace)["fitness"]
    assert from_namespace == fingerprint(SETTINGS)["fitness"]


def test_the_loaded_model_gives_its_path_and_dtype(tmp_path):
    from lpes_harness.lmeval.lpes_lm import LPESLM

    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", "llama")
    lm = LPESLM(pretrained=checkpoint, device="cpu")
    settings = dict(SETTINGS, pretrained=checkpoint, dtype=None)
    from_lm = fingerprint(settings, lm)["model"]
    assert from_lm["path"] == checkpoint and from_lm["dtype"] == "float32"
    assert from_lm["files"] == fingerprint(settings)["model"]["files"]
    described = fingerprint(settings, {"pretrained": checkpoint, "gguf_file": None, "dtype": "float32"})["model"]
    assert mismatches({"format": fp.FORMAT, "model": from_lm}, {"format": fp.FORMAT, "model": described}) == []


def test_the_checkpoint_keeps_the_fingerprint_and_the_search_still_loads_it(tmp_path):
    from lpes_harness.search import GeneticSearch, GenomeSpec, SearchConfig
    from lpes_harness.search.callbacks import CheckpointCallback, load_checkpoint

    spec = GenomeSpec(num_layers=8, num_points=3)
    config = SearchConfig(population=4, parents=2, mutants=1, crossovers=1, generations=1)
    current = fingerprint(SETTINGS)
    GeneticSearch(spec, lambda ind: (0.0, {}), config, [CheckpointCallback(tmp_path / "c.json", {"fingerprint": current})]).run()
    state = load_checkpoint(tmp_path / "c.json")
    assert mismatches(state["fingerprint"], current) == []
    GeneticSearch(spec, lambda ind: (0.0, {}), config).load_state_dict(state)
