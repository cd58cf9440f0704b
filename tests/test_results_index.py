"""results/README.md is the map of the committed runs: it lists every folder, and every link on it leads somewhere."""

import re
import subprocess
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "results"
LINK = re.compile(r"\]\(([^)#\s]+)\)")


def _links() -> list[str]:
    return LINK.findall((RESULTS / "README.md").read_text(encoding="utf-8"))


def _committed() -> set[str]:
    """The folders and pages git tracks under results/ (a user's own runs land there too, untracked)."""
    try:
        tracked = subprocess.run(["git", "ls-files", "--", "."], cwd=RESULTS, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: which runs are committed is git's to say")
    return {path.split("/")[0] for path in tracked.stdout.splitlines()} - {"README.md"}


def test_every_committed_run_folder_and_page_is_on_the_map():
    listed = {link.split("/")[0] for link in _links() if not link.startswith("..")}
    committed = _committed()
    missing = sorted(committed - listed)
    assert not missing, f"results/README.md does not list {missing}: add a line where it belongs"


def test_every_link_on_the_map_leads_to_a_file_or_folder():
    broken = [link for link in _links() if not (RESULTS / link).exists()]
    assert not broken, f"results/README.md links to what is not there: {broken}"
