"""Multi-key needles: several "special magic numbers", one per city, hidden among filler.

A retrieval test a small chat model can actually do. ``num_needles`` needles, each
"The special magic number for <city> is <7 digits>.", sit among ``num_sentences`` filler
sentences; the question asks for one city's number. The other needles are distractors of
the same form (a model that copies *a* number scores 0), and they sit at fixed, evenly
spread places, so that only the gold needle moves between positions: a sample is the same
text at every gold position except where the gold needle is.

Measured on the bundled SmolLM2-135M-Instruct (``docs/position_tasks.md``): with the chat
template it shows the lost-in-the-middle U-curve with room to gain, and 0 % with the gold
needle removed, i.e. it measures retrieval. ``kv_retrieval`` does not, on that model.

The answer is opened for the model (lm-eval's ``gen_prefix``): "The special magic number for
<city> is", so greedy decoding and teacher-forced scoring read the same few digit tokens.
"""

import re
from collections.abc import Mapping
from typing import Any

from lpes_harness.tasks.metrics import substring_accuracy
from lpes_harness.tasks.needle import OBJECTS, SUBJECTS, VERBS, needle_number
from lpes_harness.tasks.position import Example, PositionTask, Sample, TaskDataError, as_int, register_position_task

# Capitals with one-word names, so a key is a single clear word.
CITIES = (
    "Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Quito", "Tbilisi", "Cairo", "Dublin", "Madrid",
    "Vienna", "Prague", "Warsaw", "Budapest", "Athens", "Helsinki", "Stockholm", "Copenhagen", "Berlin", "Paris",
    "Rome", "Ottawa", "Canberra", "Tokyo", "Seoul", "Bangkok", "Jakarta", "Manila", "Santiago", "Bogota",
    "Caracas", "Havana", "Dakar", "Accra", "Kampala", "Lusaka", "Harare", "Tunis", "Rabat", "Amman",
)  # fmt: skip

QUESTION = "What is the special magic number for {city}?"
PROMPT_TEMPLATE = (
    "Below is a text with several special magic numbers hidden in it, each for a different city. "
    "Read it and answer the question.\n\n{haystack}\n\n" + QUESTION
)
ANSWER_PREFIX = "The special magic number for {city} is"


def needle(city: str, number: str) -> str:
    return f"The special magic number for {city} is {number}."


def distractor_slots(num_filler: int, num_distractors: int) -> list[int]:
    """Fixed, evenly spread indices of the distractor needles in the list without the gold one.

    Slot j sits at the middle of the j-th of ``num_distractors`` equal stretches of the
    final list, so no distractor is first or last and none moves with the gold needle.
    """
    total = num_filler + num_distractors
    return [int((j + 0.5) * total / num_distractors) for j in range(num_distractors)]


def make_example(sample: Sample, options: Mapping[str, Any]) -> Example:
    rng = sample.rng  # everything from here: keys, values, filler and needle order
    count = options["num_needles"]
    cities = rng.sample(CITIES, count)  # distinct keys; the first one is asked for
    numbers: list[str] = []
    while len(numbers) < count:
        number = str(rng.randrange(1_000_000, 10_000_000))
        if number not in numbers:
            numbers.append(number)
    filler = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(options["num_sentences"])]
    items = list(filler)
    for slot, (city, number) in zip(distractor_slots(len(filler), count - 1), list(zip(cities, numbers))[1:]):
        items.insert(slot, needle(city, number))
    return Example(
        gold=needle(cities[0], numbers[0]),
        distractors=items,
        answers=[numbers[0]],
        fields={"city": cities[0], "distractor_cities": ",".join(cities[1:])},
    )


def ask_item(example: Example, item) -> Example | None:
    """The example asked about another needle (``PositionTask.ask_item``): its city's question and number."""
    match = _NEEDLE.match(item)
    if match is None:  # filler
        return None
    city, number = match.groups()
    return Example(gold=item, distractors=(), answers=[number], fields={**example.fields, "city": city})


_NEEDLE = re.compile(r"^The special magic number for (\w+) is (\d+)\.$")


def render_prompt(items, example: Example) -> str:
    return PROMPT_TEMPLATE.format(haystack=" ".join(items), city=example.fields["city"])


def answer_prefix(example: Example) -> str:
    return ANSWER_PREFIX.format(city=example.fields["city"])


def check_options(options: dict, given: set[str]) -> None:
    options["num_sentences"] = as_int("multi_needle", "num_sentences", options["num_sentences"], minimum=1)
    options["num_needles"] = as_int("multi_needle", "num_needles", options["num_needles"], minimum=1)
    if options["num_needles"] > len(CITIES):
        raise TaskDataError(f"multi_needle: num_needles={options['num_needles']} exceeds the {len(CITIES)} cities available")


MULTI_NEEDLE = register_position_task(
    PositionTask(
        name="multi_needle",
        positions=(0, 25, 50, 75, 100),
        make_example=make_example,
        render=render_prompt,
        metric=substring_accuracy,
        metric_name="acc",
        options={"num_needles": 8, "num_sentences": 60},
        check_options=check_options,
        generation_kwargs={"until": ["\n"], "max_gen_toks": 12, "do_sample": False},
        answer_prefix=answer_prefix,
        # Every position in between is "middle": the U-curve's trough may sit at 25 or 75 %,
        # and a search scored only at 50 % could trade the others away.
        roles={"begin": (0,), "middle": (25, 50, 75), "end": (100,)},
        chat_template=True,
        item_answer=needle_number,
        ask_item=ask_item,
    )
)
