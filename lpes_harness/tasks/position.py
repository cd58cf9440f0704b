"""Position-bias tasks: one lm-eval subtask per gold position, and the recipe for new ones.

A position-bias task is LitM's experiment in general form. Each sample is a context made
of N items, one of which (the *gold* item) holds the answer. The same sample is shown once
per gold position: the gold item is taken out and re-inserted at index
``percent * (N - 1) // 100`` (for 20 documents and 0/25/50/75/100 % that is LitM's
0/4/9/14/19), the context is rendered to a prompt, and the model's answer is scored.

A task is a :class:`PositionTask`: an example builder, a prompt renderer, the positions
and a metric. From it this module makes

- an lm-eval :class:`~lm_eval.api.group.Group` in memory (:func:`build_group`), or
- YAML files for the CLI (:func:`write_task_yaml`), whose ``custom_dataset`` is
  :func:`load_dataset` and whose ``process_results`` is :func:`process_results`.

Parameters arrive as lm-eval task metadata (``--metadata``): the common keys
``data_path``, ``split``, ``num_samples``, ``seed`` plus each task's own options.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import logging
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lpes_harness.tasks.data import TaskDataError

logger = logging.getLogger(__name__)

SPLITS = ("search", "heldout")
# The paper searches on 200 samples and reports on 500 others.
SEARCH_SPLIT_SIZE = 200
DEFAULT_NUM_SAMPLES = {"search": 200, "heldout": 500}

COMMON_OPTIONS: dict[str, Any] = {"data_path": None, "split": "heldout", "num_samples": None, "seed": 0}

# Keys lm-eval itself puts into a task's metadata.
LM_EVAL_METADATA_KEYS = frozenset({"version", "config_source", "_metadata"})

# Greedy and short: answers are one line, and CPU time is spent mostly on the prompt.
DEFAULT_GENERATION_KWARGS: dict[str, Any] = {"until": ["\n"], "max_gen_toks": 32, "do_sample": False}

# The split of lm-eval's dataset dict that holds the docs.
TEST_SPLIT = "test"


@dataclass(frozen=True)
class Sample:
    """Which sample to build: the same ``index`` and an identically seeded ``rng`` at every position."""

    index: int
    rng: random.Random


@dataclass(frozen=True)
class Example:
    """One sample before positioning: the gold item, the N-1 other items in order, the answers.

    ``fields`` are extra doc columns (strings or numbers) the renderer may use and that end
    up in lm-eval's logged samples, e.g. the KV key or the question.
    """

    gold: Any
    distractors: Sequence[Any]
    answers: Sequence[str]
    fields: Mapping[str, Any] = field(default_factory=dict)
    # Other ways of writing a right answer that the one-pass (greedy-match) fitness accepts,
    # e.g. a KV value in its JSON quotes, which the model often copies. Each must score 1
    # under the task's metric, so greedy-match and the generation metric stay consistent.
    other_forms: Sequence[str] = ()


def generated(options: Mapping[str, Any]) -> int | None:
    """``count_records`` for generated data: any number of samples."""
    return None


# eq=False: tasks compare and hash by identity (they hold dicts, and key the example cache).
@dataclass(frozen=True, eq=False)
class PositionTask:
    """A position-bias task; see the module docstring and ``docs/position_tasks.md``.

    - ``make_example(sample, options) -> Example``: build sample ``sample.index``; draw all
      randomness from ``sample.rng``.
    - ``render(items, example) -> str``: the prompt for the items in their final order.
    - ``metric(prediction, answers) -> float`` reported as ``metric_name``.
    - ``options``: this task's own metadata keys and their defaults.
    - ``count_records(options) -> int | None``: the number of source records for file-backed
      data (the splits are drawn from them), or None for a generator.
    - ``check_options(options, given)``: optional extra validation; ``given`` is the set of
      keys the user set explicitly.
    - ``answer_prefix(example) -> str``: optional start of the model's answer (lm-eval's
      ``gen_prefix``): with a chat template it opens the assistant turn, so a chat model
      answers in a known form that teacher-forced scoring can read.
    - ``roles``: the fitness roles, role -> gold percents; default: begin = the first
      position, middle = the one nearest 50 %, end = the last (the paper's λ weights).
    - ``chat_template``: whether the task is meant to be run with the model's chat template
      (lm-eval ``--apply_chat_template``; the search follows it by default).
    """

    name: str
    positions: tuple[int, ...]
    make_example: Callable[[Sample, Mapping[str, Any]], Example]
    render: Callable[[list, Example], str]
    metric: Callable[[str, Sequence[str]], float]
    metric_name: str = "acc"
    options: Mapping[str, Any] = field(default_factory=dict)
    count_records: Callable[[Mapping[str, Any]], int | None] = generated
    check_options: Callable[[Mapping[str, Any], set[str]], None] | None = None
    generation_kwargs: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_GENERATION_KWARGS))
    answer_prefix: Callable[[Example], str] | None = None
    roles: Mapping[str, tuple[int, ...]] | None = None
    chat_template: bool = False

    def __post_init__(self):
        if not self.positions or any(not isinstance(p, int) or not 0 <= p <= 100 for p in self.positions):
            raise ValueError(f"{self.name}: positions must be integer percents in [0, 100], got {self.positions!r}")
        if self.roles is None:
            middle = min(self.positions, key=lambda p: (abs(p - 50), p))
            object.__setattr__(self, "roles", {"begin": (self.positions[0],), "middle": (middle,), "end": (self.positions[-1],)})
        else:
            object.__setattr__(self, "roles", {role: tuple(ps) for role, ps in self.roles.items()})
        for role, percents in self.roles.items():
            if not percents or any(p not in self.positions for p in percents):
                raise ValueError(f"{self.name}: role {role!r} names positions {percents!r}, not all of {self.positions}")
        clash = set(self.options) & set(COMMON_OPTIONS)
        if clash:
            raise ValueError(f"{self.name}: options {sorted(clash)} are common options; do not redefine them")

    def subtask_name(self, percent: int) -> str:
        return f"{self.name}_pos{percent}"

    @property
    def accepted_options(self) -> dict[str, Any]:
        return {**COMMON_OPTIONS, **self.options}


# name -> task; lets metadata checks know every position task's keys, and process_results
# find a task by the name stored in its docs.
POSITION_TASKS: dict[str, PositionTask] = {}


def register_position_task(task: PositionTask) -> PositionTask:
    """Add ``task`` to the registry (replacing one of the same name) and return it."""
    POSITION_TASKS[task.name] = task
    return task


def resolve_task(reference: PositionTask | str) -> PositionTask:
    """A task from an object, a registered name, or ``"package.module:ATTRIBUTE"``."""
    if isinstance(reference, PositionTask):
        return reference
    if ":" in reference:
        module_name, _, attribute = reference.partition(":")
        task = getattr(importlib.import_module(module_name), attribute, None)
        if not isinstance(task, PositionTask):
            raise TaskDataError(f"{reference!r} does not name a PositionTask")
        return register_position_task(task)
    if reference not in POSITION_TASKS:
        load_builtin_tasks()  # a built-in task whose module is not imported yet
    if reference not in POSITION_TASKS:
        raise TaskDataError(f"unknown position task {reference!r}; registered: {sorted(POSITION_TASKS)}")
    return POSITION_TASKS[reference]


def load_builtin_tasks() -> None:
    """Register the built-in position tasks (imports their modules; cheap, no lm-eval)."""
    from lpes_harness.tasks import BUILTIN_POSITION_TASKS

    for reference in BUILTIN_POSITION_TASKS.values():
        resolve_task(reference)


def gold_index(percent: int, num_items: int) -> int:
    """LitM's gold index: 0 % is the first item, 100 % the last, the rest rounded down."""
    return percent * (num_items - 1) // 100


# ---------------------------------------------------------------- options


def _model_arg_names() -> set[str]:
    # lm-eval 0.4.13 merges --model_args into every task's metadata, so the metadata we
    # receive mixes the user's task keys with model keys. To reject typos in task keys
    # without rejecting model keys we read the model args from the running simple_evaluate.
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "simple_evaluate" and frame.f_globals.get("__name__") == "lm_eval.evaluator":
            model_args = frame.f_locals.get("model_args")
            if isinstance(model_args, str):
                from lm_eval.utils import simple_parse_args_string

                return set(simple_parse_args_string(model_args))
            return set(model_args) if isinstance(model_args, dict) else set()
        frame = frame.f_back
    return set()


def _all_position_option_names() -> set[str]:
    load_builtin_tasks()  # so their keys are known even if not loaded yet
    names = set(COMMON_OPTIONS)
    for task in POSITION_TASKS.values():
        names |= set(task.options)
    return names


def resolve_options(task: PositionTask, metadata: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Defaults overlaid with the user's keys, checked; returns (options, keys the user gave).

    Keys of other position tasks are tolerated (one ``--metadata`` serves every task of a
    run), as are lm-eval's own keys and the model args it merges in. Anything else is an error.
    """
    accepted = task.accepted_options
    tolerated = _all_position_option_names() | LM_EVAL_METADATA_KEYS | _model_arg_names()
    options = dict(accepted)
    given: set[str] = set()
    unknown = []
    for key, value in metadata.items():
        if key in accepted:
            options[key] = value
            given.add(key)
        elif key not in tolerated:
            unknown.append(key)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, list(accepted), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise TaskDataError(
            f"{task.name}: unknown metadata key(s) {', '.join(hints)}; accepted keys are {sorted(accepted)}"
        )

    if options["split"] not in SPLITS:
        raise TaskDataError(f"{task.name}: split={options['split']!r} is not one of {list(SPLITS)}")
    options["seed"] = as_int(task.name, "seed", options["seed"])
    if options["num_samples"] is not None:
        options["num_samples"] = as_int(task.name, "num_samples", options["num_samples"], minimum=1)
    if options["data_path"] is not None:
        options["data_path"] = str(options["data_path"])
    if task.check_options is not None:
        task.check_options(options, given)
    return options, given


def as_int(task_name: str, key: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an int (also from a digit string), or an error naming the task and key."""
    try:
        number = int(value)
        if isinstance(value, bool) or number != float(value):
            raise ValueError
    except (TypeError, ValueError):
        raise TaskDataError(f"{task_name}: {key}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise TaskDataError(f"{task_name}: {key}={value!r} must be at least {minimum}")
    return number


# ---------------------------------------------------------------- splits and docs


def sample_indices(task: PositionTask, options: Mapping[str, Any]) -> list[int]:
    """The source indices of the requested split; search and held-out never share one.

    Generated data: search is samples 0..199, held-out counts on from 200.
    File data: a seeded permutation of the records; search takes its first
    min(200, records // 2), held-out the rest.
    """
    split, seed = options["split"], options["seed"]
    num_records = task.count_records(options)
    if num_records is None:
        search_pool = list(range(SEARCH_SPLIT_SIZE))
        heldout_pool = None  # unbounded
    else:
        order = list(range(num_records))
        random.Random(f"{task.name}/{seed}/splits").shuffle(order)
        search_size = min(SEARCH_SPLIT_SIZE, num_records // 2)
        search_pool, heldout_pool = order[:search_size], order[search_size:]

    requested = options["num_samples"]
    wanted = requested if requested is not None else DEFAULT_NUM_SAMPLES[split]
    if split == "heldout" and heldout_pool is None:
        return list(range(SEARCH_SPLIT_SIZE, SEARCH_SPLIT_SIZE + wanted))
    pool = search_pool if split == "search" else heldout_pool
    if wanted > len(pool):
        source = "the generator" if num_records is None else f"{options.get('data_path') or 'the data file'} ({num_records} records)"
        if requested is not None:
            raise TaskDataError(
                f"{task.name}: num_samples={requested} but the {split} split of {source} has {len(pool)} samples"
            )
        logger.warning("%s: the %s split of %s has %d samples, fewer than the default %d", task.name, split, source, len(pool), wanted)
    return pool[:wanted]


def _options_key(options: Mapping[str, Any]) -> str:
    return json.dumps(options, sort_keys=True, default=str)


@functools.lru_cache(maxsize=16)
def _cached_examples(task: PositionTask, options_key: str) -> tuple[tuple[int, Example], ...]:
    # Every position subtask of one run asks for the same examples: build them once.
    options = json.loads(options_key)
    examples = []
    for index in sample_indices(task, options):
        sample = Sample(index=index, rng=random.Random(f"{task.name}/{options['seed']}/{index}"))
        examples.append((index, task.make_example(sample, options)))
    return tuple(examples)


def build_examples(task: PositionTask, options: Mapping[str, Any]) -> list[tuple[int, Example]]:
    """(source index, example) for every sample of the split, before positioning."""
    return list(_cached_examples(task, _options_key(options)))


def place_gold(example: Example, percent: int) -> tuple[list, int]:
    """The items with the gold one inserted at ``percent`` of the way through; and its index."""
    items = list(example.distractors)
    index = gold_index(percent, len(items) + 1)
    items.insert(index, example.gold)
    return items, index


def build_docs(task: PositionTask, percent: int, options: Mapping[str, Any]) -> list[dict]:
    """lm-eval docs for one gold position: prompt, answers, target, gold index and the example's fields."""
    docs = []
    for index, example in build_examples(task, options):
        items, gold_at = place_gold(example, percent)
        for form in example.other_forms:
            if task.metric(form, list(example.answers)) != 1:
                raise ValueError(f"{task.name}: the answer form {form!r} does not score 1 under the task's metric")
        docs.append(
            {
                "prompt": task.render(items, example),
                "answers": list(example.answers),
                "greedy_answers": list(example.answers) + list(example.other_forms),
                "target": example.answers[0],
                "gold_index": gold_at,
                "num_items": len(items),
                "gold_percent": percent,
                "sample_index": index,
                "position_task": task.name,
                **({"answer_prefix": task.answer_prefix(example)} if task.answer_prefix else {}),
                **example.fields,
            }
        )
    return docs


# ---------------------------------------------------------------- lm-eval glue


def load_dataset(position_task: PositionTask | str, gold_percent: int, **metadata) -> Any:
    """lm-eval ``custom_dataset``: called with the task metadata and the YAML ``dataset_kwargs``."""
    import datasets

    task = resolve_task(position_task)
    if gold_percent not in task.positions:
        raise TaskDataError(f"{task.name}: gold_percent={gold_percent!r} is not one of {task.positions}")
    options, _ = resolve_options(task, metadata)
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
    resolve_options(task, metadata)  # fail here, before any task is built
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


_GENERATED_HEADER = "# Generated by lpes_harness.tasks.position.write_task_yaml from {reference}; edit the task, then regenerate.\n"


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
                lines.append(f"custom_dataset: !function {__name__}.load_dataset\n")
                lines.append(f"process_results: !function {__name__}.process_results\n")
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
    """Check the options and data files of the position tasks in ``task_names``.

    lm-eval 0.4.13 loads the model before it builds the tasks, so a typo in ``--metadata``
    or a broken ``data_path`` would surface only after the model load. The start-up hook
    calls this first, from ``simple_evaluate``, so such errors come before any model work.
    """
    if not task_names or not metadata:
        return
    names = task_names.split(",") if isinstance(task_names, str) else [str(n) for n in task_names]
    load_builtin_tasks()
    if isinstance(model_args, str):
        from lm_eval.utils import simple_parse_args_string

        model_args = simple_parse_args_string(model_args)
    model_keys = set(model_args or {})
    task_metadata = {k: v for k, v in metadata.items() if k not in model_keys}
    for task in list(POSITION_TASKS.values()):
        if not any(name == task.name or name.startswith(f"{task.name}_pos") for name in names):
            continue
        options, _ = resolve_options(task, task_metadata)
        if options["data_path"] is not None and task.count_records is not None:
            task.count_records(options)  # reads the file: missing file, bad line -> file:line
