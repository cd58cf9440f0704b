"""``python -m lpes_harness.tasks``: regenerate the built-in tasks' YAML in ``TASKS_DIR``."""

from lpes_harness.lmeval.tasks import write_builtin_task_yaml

for path in write_builtin_task_yaml():
    print(path)
