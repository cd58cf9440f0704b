"""The console scripts of pyproject.toml point at real functions, and ``lpes-search --help`` answers."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_console_script_names_a_function():
    for name, target in SCRIPTS.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), f"{name} = {target!r}"


def test_lpes_search_is_the_search_command():
    assert SCRIPTS["lpes-search"] == "lpes_harness.commands.search:main"
    # The installed script where the venv has it (after `make setup`), else the same entry point.
    script = Path(sys.executable).with_name("lpes-search")
    command = [str(script)] if script.exists() else [sys.executable, "-c", "from lpes_harness.commands.search import main; main()"]
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--population" in done.stdout and "--profile" in done.stdout
