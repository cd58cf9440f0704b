"""A GGUF is converted once into a cache folder, and loading that folder gives the same model, bit for bit."""

import os
import warnings
from pathlib import Path

import pytest
import torch

from lpes_harness.core import gguf_cache
from lpes_harness.core.models import load_causal_lm, resolve_pretrained


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_bundled_gguf_and_its_converted_folder_give_the_same_logits_tokens_and_template():
    # The session's own cache (conftest.py): the first load of the suite converts, later ones read the folder.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, gguf_file = resolve_pretrained(None)
    direct = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32).eval()
    direct_tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)

    model, tokenizer = load_causal_lm()  # converts unless an earlier test did, then loads the folder
    folder = gguf_cache.converted_folder(Path(directory) / gguf_file)
    assert model.config._name_or_path == str(folder) and (folder / gguf_cache.MARKER).is_file()
    assert folder.parent.parent == Path(os.environ[gguf_cache.CACHE_ENV])
    assert not [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]  # no partial folder left

    text = "Paris is the capital of France. " * 30
    ids = direct_tokenizer(text, return_tensors="pt").input_ids
    assert torch.equal(tokenizer(text, return_tensors="pt").input_ids, ids)
    assert tokenizer.chat_template == direct_tokenizer.chat_template is not None
    assert model.generation_config.eos_token_id == direct.generation_config.eos_token_id
    with torch.no_grad():
        assert torch.equal(model(ids).logits, direct(ids).logits)
    # The tokenizer alone now comes from the folder too.
    assert gguf_cache.loadable(directory, gguf_file, convert=False) == (str(folder), None)


def test_a_changed_file_or_transformers_gets_its_own_folder(tmp_path, cache, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    first = gguf_cache.converted_folder(gguf)
    assert first == gguf_cache.converted_folder(gguf) and first.name.startswith("m-")
    os.utime(gguf, ns=(1, 1))
    assert gguf_cache.converted_folder(gguf) != first
    monkeypatch.setattr("transformers.__version__", "0.0.0")
    assert len({first, gguf_cache.converted_folder(gguf)}) == 2


def test_no_gguf_off_switch_and_an_unwritable_cache_load_the_file_as_given(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    assert gguf_cache.loadable("some/hf-id", None) == ("some/hf-id", None)
    assert gguf_cache.loadable(str(tmp_path), "missing.gguf") == (str(tmp_path), "missing.gguf")
    monkeypatch.setenv(gguf_cache.SWITCH_ENV, "0")
    assert gguf_cache.loadable(str(tmp_path), "m.gguf") == (str(tmp_path), "m.gguf")

    monkeypatch.delenv(gguf_cache.SWITCH_ENV)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(blocker))  # the cache "folder" is a file: it cannot be made
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gguf_cache.loadable(str(tmp_path), "m.gguf") == (str(tmp_path), "m.gguf")
    assert "loading the GGUF directly" in str(caught[0].message)


def test_a_folder_without_its_marker_is_never_trusted(tmp_path, cache):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    folder = gguf_cache.converted_folder(gguf)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # as if a copy stopped half way
    assert gguf_cache.loadable(str(tmp_path), "m.gguf", convert=False) == (str(tmp_path), "m.gguf")
