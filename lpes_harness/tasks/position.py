"""Position-bias tasks: one lm-eval subtask per gold position, and the recipe for new ones.

A position-bias task is LitM's experiment in general form. Each sample is a context made
of N items, one of which (the *gold* item) holds the answer. The same sample is shown once
per gold position: the gold item is taken out and re-inserted at index
``percent * (N - 1) // 100`` (for 20 documents and 0/25/50/75/100 % that is LitM's
0/4/9/14/19), the context is rendered to a prompt, and the model's answer is scored.

A task is a :class:`PositionTask`: an example builder, a prompt renderer, the positions
and a metric. This module is the task API (the registry, option checks, splits, docs); it
knows nothing of lm-eval. :mod:`lpes_harness.lmeval.tasks` turns a task into lm-eval tasks
(an in-memory group: ``build_group``; or YAML files: ``write_task_yaml``, which name its
``load_dataset`` and ``process_results``).

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lpes_harness.tasks.data import TaskDataError

logger = logging.getLogger(__name__)

SPLITS = ("search", "heldout", "validation")
# The paper searches on 200 samples and reports on 500 others. The validation split (a search's
# final choice among its best curves, re-scored on samples the fitness never saw) is a third
# set, disjoint from both: a choice made on held-out samples would no longer be held out.
SEARCH_SPLIT_SIZE = 200
VALIDATION_SPLIT_SIZE = 200
DEFAULT_NUM_SAMPLES = {"search": 200, "heldout": 500, "validation": VALIDATION_SPLIT_SIZE}

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
    - ``item_answer(item) -> str | None``: optional; what an item would answer if it were the
      gold one (a needle's number, a pair's value), None for an item that holds no answer
      (filler). ``item_text(item) -> str``: optional, for items that hold text rather than a
      value (documents). Either lets ``lpes-check`` tell which item a wrong answer came from.
    - ``ask_item(example, item) -> Example | None``: optional; the example asked about another of
      its items instead (that item's answer, and the fields its question and answer prefix read),
      None for an item that answers nothing. The prompt differs from the gold one only in the
      question, so a search can score a question about every item of one prompt from one forward
      of the text they share (:func:`item_docs`).
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
    item_answer: Callable[[Any], str | None] | None = None
    item_text: Callable[[Any], str] | None = None
    ask_item: Callable[[Example, Any], Example | None] | None = None

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


def _all_position_option_names() -> set[str]:
    load_builtin_tasks()  # so their keys are known even if not loaded yet
    names = set(COMMON_OPTIONS)
    for task in POSITION_TASKS.values():
        names |= set(task.options)
    return names


def resolve_options(
    task: PositionTask, metadata: Mapping[str, Any], tolerated: Iterable[str] = ()
) -> tuple[dict[str, Any], set[str]]:
    """Defaults overlaid with the user's keys, checked; returns (options, keys the user gave).

    Keys of other position tasks are tolerated (one ``--metadata`` serves every task of a
    run), as are lm-eval's own keys and ``tolerated`` (the lm-eval glue passes the model args
    lm-eval merges into task metadata). Anything else is an error.
    """
    accepted = task.accepted_options
    tolerated = _all_position_option_names() | LM_EVAL_METADATA_KEYS | set(tolerated)
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
    """The source indices of the requested split; no two splits share one.

    Generated data: search is samples 0..199, held-out counts on from 200, validation counts
    down from -1 (-1, -2, ...): unbounded, and disjoint from the other two by sign.
    File data: a seeded permutation of the records; search takes its first
    min(200, records // 2), validation its last min(200, (records - search) // 4), held-out
    the records in between (so the held-out samples of every earlier table are unchanged).
    """
    split, seed = options["split"], options["seed"]
    num_records = task.count_records(options)
    requested = options["num_samples"]
    wanted = requested if requested is not None else DEFAULT_NUM_SAMPLES[split]
    if num_records is None:
        if split == "heldout":
            return list(range(SEARCH_SPLIT_SIZE, SEARCH_SPLIT_SIZE + wanted))
        if split == "validation":
            return [-(k + 1) for k in range(wanted)]
        pool = list(range(SEARCH_SPLIT_SIZE))
    else:
        order = list(range(num_records))
        random.Random(f"{task.name}/{seed}/splits").shuffle(order)
        search_size = min(SEARCH_SPLIT_SIZE, num_records // 2)
        validation_size = min(VALIDATION_SPLIT_SIZE, (num_records - search_size) // 4)
        pool = {"search": order[:search_size],
                "heldout": order[search_size:num_records - validation_size],
                "validation": order[num_records - validation_size:]}[split]
    if wanted > len(pool):
        source = "the generator" if num_records is None else f"{options.get('data_path') or 'the data file'} ({num_records} records)"
        if requested is not None:
            raise TaskDataError(
                f"{task.name}: num_samples={requested} but the {split} split of {source} has {len(pool)} samples"
            )
        logger.warning("%s: the %s split of %s has %d samples, fewer than the default %d", task.name, split, source, len(pool), wanted)
    return pool[:wanted]


def search_split_size(task: PositionTask, metadata: Mapping[str, Any]) -> int:
    """How many samples the search split of ``task`` under ``metadata`` holds (200 for generated data)."""
    options, _ = resolve_options(task, {**metadata, "split": "search", "num_samples": None})
    num_records = task.count_records(options)
    return SEARCH_SPLIT_SIZE if num_records is None else min(SEARCH_SPLIT_SIZE, num_records // 2)


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


def same_place_positions(task: PositionTask, percent: int, num_items: int) -> list[int]:
    """The task's other gold positions that put the gold item where ``percent`` does, with
    ``num_items`` items (5 key-value pairs give 0 % and 20 % both the first pair)."""
    here = gold_index(percent, num_items)
    return [p for p in task.positions if p != percent and gold_index(p, num_items) == here]


def _warn_same_place(task: PositionTask, percent: int, num_items: int) -> None:
    same = same_place_positions(task, percent, num_items)
    if same:
        # A warning, not an error: fewer items than positions is a legitimate small setting, but
        # those subtasks score identical prompts, and a table that pools them counts them twice.
        logger.warning(
            "%s: with %d items, gold position %d %% puts the gold item where %s %% does (item %d): those "
            "subtasks score the same prompts; give at least %d items for distinct positions",
            task.name, num_items, percent, " / ".join(map(str, same)), gold_index(percent, num_items) + 1,
            len(task.positions),
        )


def item_docs(task: PositionTask, example: Example, percent: int, sample_index: int) -> list[dict]:
    """The docs of ``example`` with the gold item at ``percent``, asked about each of its other items that
    answers something (``task.ask_item``), in the items' order: the same text, another question. Their
    ``gold_percent`` is where the asked item sits (rounded); empty for a task without ``ask_item``."""
    if task.ask_item is None:
        return []
    items, gold_at = place_gold(example, percent)
    docs = []
    for index, item in enumerate(items):
        asked = None if index == gold_at else task.ask_item(example, item)
        if asked is not None:
            docs.append(_doc(task, items, index, round(100 * index / max(len(items) - 1, 1)), asked,
                             {"sample_index": sample_index, "asked_item": index}))
    return docs


def _doc(task: PositionTask, items: list, gold_at: int, percent: int, example: Example, extra: Mapping) -> dict:
    return {
        "prompt": task.render(items, example),
        "answers": list(example.answers),
        "greedy_answers": list(example.answers) + list(example.other_forms),
        "target": example.answers[0],
        "gold_index": gold_at,
        "num_items": len(items),
        "gold_percent": percent,
        **extra,
        "position_task": task.name,
        **({"answer_prefix": task.answer_prefix(example)} if task.answer_prefix else {}),
        **example.fields,
    }


def build_docs(task: PositionTask, percent: int, options: Mapping[str, Any]) -> list[dict]:
    """lm-eval docs for one gold position: prompt, answers, target, gold index and the example's fields."""
    docs = []
    warned: set[int] = set()
    for index, example in build_examples(task, options):
        items, gold_at = place_gold(example, percent)
        if len(items) not in warned:
            warned.add(len(items))
            _warn_same_place(task, percent, len(items))
        for form in example.other_forms:
            if task.metric(form, list(example.answers)) != 1:
                raise ValueError(f"{task.name}: the answer form {form!r} does not score 1 under the task's metric")
        docs.append(_doc(task, items, gold_at, percent, example, {"sample_index": index}))
    return docs

