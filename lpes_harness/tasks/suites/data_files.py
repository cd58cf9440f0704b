"""The data files a suite task reads, looked up before the model loads.

lm-eval 0.4.13 loads the model before it builds the tasks, so a wrong ``LPES_DATA`` or
``data_path`` would surface only after the load, as a traceback. The lm-eval glue's precheck
asks :func:`check_files` first; the loaders look the same files up again, by the file names
they own and the same :func:`~lpes_harness.tasks.suites.common.suite_dir`, so the two cannot
disagree.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from lpes_harness.tasks.suites import leval, multiple_choice, zeroscrolls
from lpes_harness.tasks.suites.common import suite_dir


def files_read(task_name: str) -> list[tuple[str, str]]:
    """(suite folder, file name) of each file the task or group ``task_name`` reads, named by the
    suite's loader; none when it is not one of ours (lm-eval's own ``qasper`` included). An MMLU or
    C-Eval subject reads its suite's mapping file first."""
    name = task_name.lstrip("_")  # the category groups' names start with "_"
    for suite in multiple_choice.SUITES.values():
        if name == suite.name or name.startswith(suite.name + "_"):
            return [(suite.folder, multiple_choice.MAPPING_FILE)]
    if name == "leval":
        return [("leval", leval.data_file(task)) for task in leval.TASKS.values()]
    if name in leval.TASKS:
        return [("leval", leval.data_file(leval.TASKS[name]))]
    if name == "zeroscrolls":
        return [("zeroscrolls", zeroscrolls.data_file(task)) for task in zeroscrolls.TASKS]
    if name.startswith("zeroscrolls_") and name.removeprefix("zeroscrolls_") in zeroscrolls.TASKS:
        return [("zeroscrolls", zeroscrolls.data_file(name.removeprefix("zeroscrolls_")))]
    return []


def check_files(task_names: Iterable[str], data_path: str | os.PathLike | None = None) -> None:
    """The loaders' TaskDataError for the first file of ``task_names`` that cannot be found."""
    for name in task_names:
        for folder, file_name in files_read(name):
            suite_dir(folder, file_name, data_path)
