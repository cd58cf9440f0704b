"""The suites' data files are looked up before the model loads (lpes_harness.tasks.suites.data_files):
every committed suite task and group maps to the files its loader reads, and a wrong folder is the
loader's own TaskDataError."""

import re

import pytest
import yaml
from conftest import REPO_ROOT, SHARED_DATA

from lpes_harness.tasks.data import TaskDataError
from lpes_harness.tasks.suites.data_files import check_files, files_read

SUITES_DIR = REPO_ROOT / "tasks" / "suites"


def committed_names() -> list[str]:
    """Every task and group name of the committed suite YAML."""
    names = set()
    for path in SUITES_DIR.rglob("*.yaml"):
        text = re.sub(r"!function \S+", "null", path.read_text(encoding="utf-8"))
        config = yaml.safe_load(text) or {}
        for key in ("task", "group"):
            if isinstance(config.get(key), str):
                names.add(config[key])
    return sorted(names)


def test_every_committed_suite_task_and_group_names_its_files():
    names = committed_names()
    assert len(names) > 100  # MMLU's and C-Eval's subjects, their groups, L-Eval, ZeroSCROLLS
    missing = [name for name in names if not files_read(name)]
    assert missing == []
    assert files_read("leval") == [("leval", f"{t}.jsonl") for t in ("coursera", "quality", "tpo", "sci_fi")]
    assert files_read("zeroscrolls_qasper") == [("zeroscrolls", "qasper.validation.jsonl")]
    assert files_read("mmlu_continuation_local_anatomy") == [("mmlu", "mapping.json")]
    assert files_read("multi_needle") == [] and files_read("hellaswag") == []
    assert files_read("qasper") == [] and files_read("quality") == []  # lm-eval's own, not ZeroSCROLLS'
    assert files_read("coursera") == []


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="shared data not present")
def test_the_shared_data_holds_every_file_and_a_wrong_folder_is_the_loaders_error(tmp_path):
    check_files(committed_names(), SHARED_DATA)
    (tmp_path / "leval").mkdir()
    (tmp_path / "leval" / "coursera.jsonl").write_text("{}\n")
    check_files(["leval_coursera"], tmp_path)
    with pytest.raises(TaskDataError, match=re.escape(f"could not find the leval data (looked for data_path: "
                                                      f"{tmp_path / 'leval' / 'quality.jsonl'}")):
        check_files(["leval"], tmp_path)
