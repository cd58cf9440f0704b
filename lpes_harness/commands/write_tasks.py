"""``python -m lpes_harness.commands.write_tasks``: regenerate the built-in tasks' YAML in ``TASKS_DIR``."""

from lpes_harness.lmeval.tasks import write_builtin_task_yaml


def main() -> None:
    for path in write_builtin_task_yaml():
        print(path)


if __name__ == "__main__":
    main()
