"""Needle in a haystack: the worked example of the register-a-position-task recipe.

The context is ``num_sentences`` filler sentences; one of them, the needle, states a
"special magic number" for a city. The model is asked for that number. The filler has no
digits, so only the needle holds the answer. See ``docs/position_tasks.md``.
"""

import re
from collections.abc import Mapping
from typing import Any

from lpes_harness.tasks.metrics import substring_accuracy
from lpes_harness.tasks.position import Example, PositionTask, Sample, as_int, register_position_task

CITIES = ("Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Quito", "Tbilisi", "Perth", "Cairo", "Osaka")
SUBJECTS = ("The old farmer", "A quiet river", "The blue kite", "Every morning bell", "The tall lighthouse", "A small cat")
VERBS = ("drifted past", "waited beside", "sang about", "looked at", "walked toward", "dreamed of")
OBJECTS = ("the green hills", "a wooden bridge", "the empty market", "an open window", "the winter garden", "a paper boat")

PROMPT_TEMPLATE = (
    "There is a special magic number hidden in the text below. Find it and remember it.\n"
    "\n"
    "{haystack}\n"
    "\n"
    "Question: What is the special magic number for {city}?\n"
    "Answer: The special magic number for {city} is"
)


def make_example(sample: Sample, options: Mapping[str, Any]) -> Example:
    rng = sample.rng  # all randomness from here: the same sample at every position
    filler = [
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(options["num_sentences"] - 1)
    ]
    city, number = rng.choice(CITIES), str(rng.randrange(1_000_000, 10_000_000))
    needle = f"The special magic number for {city} is {number}."
    return Example(gold=needle, distractors=filler, answers=[number], fields={"city": city})


_NEEDLE_NUMBER = re.compile(r"^The special magic number for \w+ is (\d+)\.$")


def needle_number(item: str) -> str | None:
    """The number a needle sentence holds; None for filler."""
    match = _NEEDLE_NUMBER.match(item)
    return match.group(1) if match else None


def render_prompt(items, example: Example) -> str:
    return PROMPT_TEMPLATE.format(haystack=" ".join(items), city=example.fields["city"])


def check_options(options: dict, given: set[str]) -> None:
    options["num_sentences"] = as_int("needle", "num_sentences", options["num_sentences"], minimum=2)


NEEDLE = register_position_task(
    PositionTask(
        name="needle",
        positions=(0, 25, 50, 75, 100),
        make_example=make_example,
        render=render_prompt,
        metric=substring_accuracy,
        metric_name="acc",
        options={"num_sentences": 40},
        check_options=check_options,
        item_answer=needle_number,
    )
)
