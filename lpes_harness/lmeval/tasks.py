"""Position tasks as lm-eval tasks: datasets, results, groups, YAML files, the precheck.

The lm-eval side of :mod:`lpes_harness.tasks.position`; the YAML files name this module's
``load_dataset`` and ``process_results`` (``python -m lpes_harness.commands.write_tasks`` regenerates them):

- :func:`load_dataset` is the ``custom_dataset`` of every position subtask; lm-eval calls it
  with the task metadata, into which it has merged ``--model_args``: those keys are told
  apart from the user's task keys through :data:`~lpes_harness.lmeval.model_args.MODEL_ARGS`,
  which the ``simple_evaluate`` wrapper sets (no caller's frame is read);
- :func:`build_group` builds a group in memory, :func:`write_task_yaml` the files for the CLI;
- :func:`precheck` checks options and data files before ``simple_evaluate`` loads the model;
- :func:`load_task` loads one task by name, indexing lm-eval's own tasks only for a name not ours.

lm-eval warns "Custom kwargs can be passed to --metadata..." once per subtask whose dataset is
a callable; for our subtasks that is noise in every run, so it is filtered out here (only for
subtasks of a registered position task: other tasks' warnings stay visible).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lpes_harness.lmeval.model_args import model_arg_names, parse_model_args
from lpes_harness.tasks import BUILTIN_POSITION_TASKS, TASKS_DIR
from lpes_harness.tasks.data import TaskDataError
from lpes_harness.tasks.position import (
    POSITION_TASKS,
    TEST_SPLIT,
    PositionTask,
    build_docs,
    load_builtin_tasks,
    register_position_task,
    resolve_options,
    resolve_task,
)

# The module the YAML files name for custom_dataset / process_results: the one that defines them.
YAML_FUNCTIONS_MODULE = "lpes_harness.lmeval.tasks"
# What lm-eval 0.4.13 logs (lm_eval.api.task, ConfigurableTask.download) for a callable dataset.
CUSTOM_KWARGS_WARNING = "Custom kwargs can be passed to `--metadata`"
LM_EVAL_TASK_LOGGER = "lm_eval.api.task"


class _OurCustomKwargsWarning(logging.Filter):
    """Drops lm-eval's custom-kwargs warning for position subtasks; lets every other record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage() if isinstance(record.msg, str) else ""
        if CUSTOM_KWARGS_WARNING not in message:
            return True
        subtask = message.partition(":")[0]
        load_builtin_tasks()  # a YAML task warns before its dataset (and module) is loaded
        return not any(subtask.startswith(f"{name}_pos") for name in POSITION_TASKS)


def silence_custom_kwargs_warning() -> None:
    logger = logging.getLogger(LM_EVAL_TASK_LOGGER)
    if not any(isinstance(f, _OurCustomKwargsWarning) for f in logger.filters):
        logger.addFilter(_OurCustomKwargsWarning())


silence_custom_kwargs_warning()


def load_dataset(position_task: PositionTask | str, gold_percent: int, **metadata) -> Any:
    """lm-eval ``custom_dataset``: called with the task metadata and the YAML ``dataset_kwargs``."""
    import datasets

    task = resolve_task(position_task)
    if gold_percent not in task.positions:
        raise TaskDataError(f"{task.name}: gold_percent={gold_percent!r} is not one of {task.positions}")
    options, _ = resolve_options(task, metadata, tolerated=model_arg_names())
    docs = build_docs(task, gold_percent, options)
    return datasets.DatasetDict({TEST_SPLIT: datasets.Dataset.from_list(docs)})


def score(task: PositionTask, doc: Mapping[str, Any], results: Sequence[str]) -> dict[str, float]:
    return {task.metric_name: task.metric(results[0], doc["answers"])}


def process_results(doc: Mapping[str, Any], results: Sequence[str]) -> dict[str, float]:
    """lm-eval ``process_results``: the task's metric on the generated answer."""
    return score(resolve_task(doc["position_task"]), doc, results)


def task_config(task: PositionTask, percent: int) -> dict[str, Any]:
    """The lm-eval task config of one gold position (without the two callables)."""
    return {
        "task": task.subtask_name(percent),
        "dataset_kwargs": {"gold_percent": percent},
        "test_split": TEST_SPLIT,
        "output_type": "generate_until",
        "doc_to_text": "prompt",
        "doc_to_target": "target",
        "generation_kwargs": dict(task.generation_kwargs),
        "num_fewshot": 0,
        "metric_list": [{"metric": task.metric_name, "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
        # lm-eval reads the doc field of this name as the start of the answer.
        **({"gen_prefix": "answer_prefix"} if task.answer_prefix else {}),
    }


def group_config(task: PositionTask) -> dict[str, Any]:
    return {
        "group": task.name,
        "task": [task.subtask_name(p) for p in task.positions],
        # Positions are equally sized; the group score is the plain mean over positions.
        "aggregate_metric_list": [{"metric": task.metric_name, "aggregation": "mean", "weight_by_size": False}],
        "metadata": {"version": 1.0},
    }


def build_group(task: PositionTask, metadata: Mapping[str, Any] | None = None):
    """An lm-eval Group with one ConfigurableTask per position, built in memory.

    Pass it to ``lm_eval.simple_evaluate(model=..., tasks=[group])``. ``metadata`` takes the
    same keys as ``--metadata`` and is checked before any data is built.
    """
    from lm_eval.api.group import Group
    from lm_eval.api.task import ConfigurableTask

    register_position_task(task)
    metadata = dict(metadata or {})
    resolve_options(task, metadata, tolerated=model_arg_names())  # fail here, before any task is built
    config = group_config(task)
    group = Group.from_config({k: v for k, v in config.items() if k != "task"})
    for percent in task.positions:
        task_cfg = task_config(task, percent)
        task_cfg["dataset_kwargs"] = {"position_task": task, "gold_percent": percent}
        task_cfg["custom_dataset"] = load_dataset
        task_cfg["process_results"] = functools.partial(score, task)
        task_cfg["metadata"] = {**task_cfg["metadata"], **metadata}
        group.add(ConfigurableTask(config=task_cfg))
    return group


_GENERATED_HEADER = "# Generated by " + YAML_FUNCTIONS_MODULE + ".write_task_yaml from {reference}; edit the task, then regenerate.\n"


def _yaml_value(value: Any) -> str:
    # JSON is valid YAML flow style and keeps this writer free of a YAML dumper.
    return json.dumps(value)


def task_yaml_files(task: PositionTask, reference: str) -> dict[str, str]:
    """File name -> YAML text for the group and each position; ``reference`` is ``"module:ATTRIBUTE"``."""
    if resolve_task(reference) is not task:
        raise ValueError(f"{reference!r} does not refer to the task {task.name!r}")
    header = _GENERATED_HEADER.format(reference=reference)
    files = {}
    for percent in task.positions:
        config = task_config(task, percent)
        config["dataset_kwargs"] = {"position_task": reference, "gold_percent": percent}
        lines = [header]
        for key, value in config.items():
            lines.append(f"{key}: {_yaml_value(value)}\n")
            if key == "task":
                lines.append(f"custom_dataset: !function {YAML_FUNCTIONS_MODULE}.load_dataset\n")
                lines.append(f"process_results: !function {YAML_FUNCTIONS_MODULE}.process_results\n")
        files[f"{task.subtask_name(percent)}.yaml"] = "".join(lines)
    group_lines = [header] + [f"{key}: {_yaml_value(value)}\n" for key, value in group_config(task).items()]
    files[f"{task.name}.yaml"] = "".join(group_lines)
    return files


def write_task_yaml(task: PositionTask, directory: str | Path, reference: str) -> list[Path]:
    """Write the lm-eval YAML of ``task`` into ``directory`` (for ``--include_path``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in task_yaml_files(task, reference).items():
        path = directory / name
        tmp = path.with_suffix(".yaml.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # atomic: never a half-written task file
        written.append(path)
    return written


def write_builtin_task_yaml(directory: Path | str = TASKS_DIR) -> list[Path]:
    """(Re)generate the YAML of the built-in position tasks under ``directory/<name>/``."""
    written = []
    for name, reference in BUILTIN_POSITION_TASKS.items():
        written += write_task_yaml(resolve_task(reference), Path(directory) / name, reference)
    return written


def position_scores(results: Mapping[str, Any], task: PositionTask | str) -> dict[int, float]:
    """Gold percent -> score, read from an lm-eval results dict (``simple_evaluate`` or results JSON)."""
    task = resolve_task(task)
    per_task = results["results"]
    scores = {}
    for percent in task.positions:
        entry = per_task[task.subtask_name(percent)]
        scores[percent] = float(entry[f"{task.metric_name},none"])
    return scores


# ---------------------------------------------------------------- early checks


def precheck(task_names: Sequence[str] | str | None, metadata: Mapping[str, Any] | None, model_args: Any = None) -> None:
    """Check the options and data files of the position tasks in ``task_names``, and that the
    suites' (MMLU, C-Eval, L-Eval, ZeroSCROLLS) data files are where their loaders will look.

    lm-eval 0.4.13 loads the model before it builds the tasks, so a typo in ``--metadata``
    or a broken ``data_path`` would surface only after the model load. The start-up hook
    calls this first, from ``simple_evaluate``, so such errors come before any model work.
    """
    if not task_names:
        return
    names = task_names.split(",") if isinstance(task_names, str) else [str(n) for n in task_names]
    model_keys = set(parse_model_args(model_args))
    task_metadata = {k: v for k, v in (metadata or {}).items() if k not in model_keys}
    from lpes_harness.tasks.suites.data_files import check_files

    check_files(names, task_metadata.get("data_path"))
    if not task_metadata:
        return
    load_builtin_tasks()
    for task in list(POSITION_TASKS.values()):
        if not any(name == task.name or name.startswith(f"{task.name}_pos") for name in names):
            continue
        options, _ = resolve_options(task, task_metadata)
        if options["data_path"] is not None and task.count_records is not None:
            task.count_records(options)  # reads the file: missing file, bad line -> file:line


def load_task(name: str):
    """lm-eval's task ``name`` (a ConfigurableTask), from this repository's ``tasks/`` when it is one of
    ours, else from everything lm-eval knows. KeyError names an unknown task.

    Indexing lm-eval's ~15,000 task files takes 17 s on a 2-core AVX2 CPU, 0.2 s for our ~220
    (``benchmarks/model_load.py``): a command that loads one of ours (an L-Eval or MMLU subset, a
    position task) should not pay for the rest before it can even say that the task is wrong."""
    from lm_eval.tasks import TaskManager

    ours = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    manager = ours if name in ours.all_tasks else TaskManager()
    if name not in manager.all_tasks:
        raise KeyError(name)
    return manager.load([name])["tasks"][name]
