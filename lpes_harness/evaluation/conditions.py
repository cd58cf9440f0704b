"""A condition: one position task with one set of options, as a user's inputs might come.

``NAME={json}`` on the command line (``lpes-search --condition``, ``commands.transfer --condition``):
a name, and a JSON object of task options (``--metadata`` keys) plus two keys of its own, ``task``
(a registered position task) and ``chat_template`` (on / off / auto). A search over several
conditions scores every individual on the same samples of each one; a transfer table scores
searched curves on conditions no search saw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

OWN_KEYS = ("task", "chat_template")
CHAT_TEMPLATE_VALUES = ("auto", "on", "off")


def apply_chat_template(value: str) -> bool | None:
    """A ``--chat-template`` / condition value as the scorers take it: ``on`` True, ``off`` False, ``auto`` None
    (the task's own default: the bundled model's tasks apply it)."""
    if value not in CHAT_TEMPLATE_VALUES:
        raise ValueError(f"chat template {value!r}: must be on, off or auto")
    return {"auto": None, "on": True, "off": False}[value]


def parse_condition(text: str) -> tuple[str, dict]:
    """``NAME={json}`` -> (name, options)."""
    name, sep, options = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--condition {text!r}: expected NAME={{json options}}, e.g. '2x length={{\"num_sentences\": 120}}'")
    try:
        parsed, problem = json.loads(options), None
    except json.JSONDecodeError as err:
        parsed, problem = None, f"not valid JSON ({err.msg})"
    if problem is None and not isinstance(parsed, dict):
        problem = "must be a JSON object"
    elif problem is None and parsed.get("chat_template", "auto") not in CHAT_TEMPLATE_VALUES:
        problem = "chat_template must be on, off or auto"
    if problem:
        raise ValueError(f"--condition {name.strip()!r}: options {problem}")
    return name.strip(), parsed


SET_BY_COMMAND = ("split", "num_samples")  # which samples a command scores: its own choice, never a task option


def refuse_own_keys(metadata: Mapping, where: str, by: str) -> None:
    """A ValueError (one line) where ``metadata`` sets ``split`` or ``num_samples``, which ``by`` sets itself: the
    scorer would override them without a word (a paired table asked for the validation split scored the held-out one)."""
    for key in SET_BY_COMMAND:
        if key in metadata:
            raise ValueError(f"{where}: {key!r} is set by {by} itself (drop it; --num-samples sets the count)")


def slug(name: str) -> str:
    """A condition's folder name: lower case, runs of other characters as one '_'."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "condition"


def task_metadata(options: Mapping) -> dict:
    """A condition's task options, without the two keys that are not task options."""
    return {key: value for key, value in options.items() if key not in OWN_KEYS}


@dataclass(frozen=True)
class Condition:
    """A search condition: ``task`` with ``metadata``, and whether to apply the chat template."""

    name: str
    task: str
    metadata: dict = field(default_factory=dict)
    chat_template: str = "auto"

    def to_dict(self) -> dict:
        return {"name": self.name, "task": self.task, "metadata": dict(self.metadata),
                "chat_template": self.chat_template}


def search_conditions(texts: Sequence[str], task: str, metadata: Mapping, chat_template: str) -> list[Condition]:
    """The conditions of ``--condition`` texts, each on top of the run's own ``--task``,
    ``--metadata`` and ``--chat-template`` (a condition states only what differs).

    Raises ``ValueError`` (one line) for a bad text, two names with the same folder, or options
    the condition's task does not accept."""
    from lpes_harness.tasks.data import TaskDataError
    from lpes_harness.tasks.position import resolve_options, resolve_task

    conditions = []
    for text in dict.fromkeys(texts):  # the same condition given twice is one condition
        name, options = parse_condition(text)
        condition = Condition(name=name, task=str(options.get("task", task)),
                              metadata={**metadata, **task_metadata(options)},
                              chat_template=str(options.get("chat_template", chat_template)))
        refuse_own_keys(condition.metadata, f"--condition {name!r}", "the search")
        try:
            resolve_options(resolve_task(condition.task), {**condition.metadata, "split": "search", "num_samples": 1})
        except TaskDataError as err:
            raise ValueError(f"--condition {name!r}: {err}") from None
        conditions.append(condition)
    slugs = [slug(c.name) for c in conditions]
    if len(set(slugs)) != len(slugs):
        raise ValueError("--condition: two conditions share a name (after lower-casing and dropping punctuation): "
                         + ", ".join(c.name for c in conditions))
    return conditions
