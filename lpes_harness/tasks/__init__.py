"""Position-bias tasks for lm-eval: KV retrieval, multi-document QA, and a recipe for new ones.

- ``position``: the :class:`~lpes_harness.tasks.position.PositionTask` API and splits (the lm-eval
  glue, and the YAML generator ``python -m lpes_harness.commands.write_tasks``, are in :mod:`lpes_harness.lmeval.tasks`).
- ``kv_retrieval``, ``mdqa``: LitM's two benchmarks; ``needle``: the worked example of the recipe;
  ``multi_needle``: multi-key needles, the retrieval test a small chat model can do.
- ``metrics``: LitM's scoring; ``data``: file reading with ``file:line`` errors.

``TASKS_DIR`` is the folder of lm-eval YAML files (the repository's ``tasks/``); give it to
``--include_path`` or to ``TaskManager(include_path=...)``. This module stays cheap to import
(no lm-eval, torch or datasets): start-up code may read ``TASKS_DIR``.
"""

from pathlib import Path

# lpes_harness/tasks/__init__.py -> the checkout root is two folders up from the package.
_CHECKOUT_TASKS = Path(__file__).resolve().parents[2] / "tasks"
# Where a regular wheel ships the same files (hatch_build.py force-includes tasks/ there).
_PACKAGED_TASKS = Path(__file__).resolve().parent / "yaml"

TASKS_DIR: Path = _CHECKOUT_TASKS if _CHECKOUT_TASKS.is_dir() else _PACKAGED_TASKS

# Built-in position tasks, as "module:ATTRIBUTE" references (what the YAML files name).
BUILTIN_POSITION_TASKS = {
    "kv_retrieval": "lpes_harness.tasks.kv_retrieval:KV_RETRIEVAL",
    "mdqa": "lpes_harness.tasks.mdqa:MDQA",
    "needle": "lpes_harness.tasks.needle:NEEDLE",
    "multi_needle": "lpes_harness.tasks.multi_needle:MULTI_NEEDLE",
}
