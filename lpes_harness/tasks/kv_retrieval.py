"""KV retrieval (LitM): find the value of one key among N key-value pairs of a JSON object.

Data is LitM's format, one JSON object per line: ``ordered_kv_records`` (a list of
``[key, value]``), ``key`` and ``value`` (the gold pair). It comes either from a seeded
generator (``num_pairs`` pairs whose keys and values are ``value_format`` strings) or from
any LitM-format file named by ``data_path`` (e.g. LitM's ``kv-retrieval-75_keys.jsonl.gz``).

Defaults are chosen for the bundled SmolLM2-135M: it scores 0 on UUIDs at every position,
but with 30 pairs of 8-hex-digit keys and values it retrieves well at the start and badly
elsewhere, which is the bias the search has to remove.
"""

import uuid
from collections.abc import Mapping
from typing import Any

from lpes_harness.tasks.data import TaskDataError, read_jsonl
from lpes_harness.tasks.metrics import substring_accuracy
from lpes_harness.tasks.position import Example, PositionTask, Sample, as_int, register_position_task

NAME = "kv_retrieval"
POSITIONS = (0, 20, 40, 60, 80, 100)  # the paper's gold positions
LITM_KEYS = ("ordered_kv_records", "key", "value")

# LitM's kv_retrieval.prompt, verbatim.
PROMPT_TEMPLATE = (
    "Extract the value corresponding to the specified key in the JSON object below.\n"
    "\n"
    "JSON data:\n"
    "{formatted_kv_records}\n"
    "\n"
    'Key: "{key}"\n'
    "Corresponding value:"
)


def _uuid(rng) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _hex8(rng) -> str:
    return f"{rng.getrandbits(32):08x}"


VALUE_FORMATS = {"uuid": _uuid, "hex8": _hex8}

OPTIONS = {"num_pairs": 30, "value_format": "hex8"}


def generate_kv_record(rng, num_pairs: int, value_format: str) -> dict:
    """A LitM-format record: ``num_pairs`` pairs of distinct strings, one of them the gold pair."""
    make = VALUE_FORMATS[value_format]
    seen: set[str] = set()
    pairs = []
    while len(pairs) < num_pairs:
        key, value = make(rng), make(rng)
        # All 2N strings distinct: no key doubles as a value, and the gold value is unambiguous.
        if key in seen or value in seen or key == value:
            continue
        seen.update((key, value))
        pairs.append([key, value])
    key, value = pairs[rng.randrange(num_pairs)]
    return {"ordered_kv_records": pairs, "key": key, "value": value}


def format_kv_records(pairs) -> str:
    """LitM's layout: ``{"k": "v",`` then one `` "k": "v",`` per line, closing ``}``."""
    lines = []
    for index, (key, value) in enumerate(pairs):
        start = "{" if index == 0 else " "
        end = "}" if index == len(pairs) - 1 else ","
        lines.append(f'{start}"{key}": "{value}"{end}')
    return "\n".join(lines)


def pair_value(pair) -> str:
    return pair[1]


def render_prompt(items, example: Example) -> str:
    return PROMPT_TEMPLATE.format(formatted_kv_records=format_kv_records(items), key=example.fields["key"])


def example_from_record(record: Mapping[str, Any], where: str) -> Example:
    """Split a LitM record into the gold pair and the other pairs, keeping their order."""
    pairs = [tuple(pair) for pair in record["ordered_kv_records"]]
    gold = (record["key"], record["value"])
    keys = [key for key, _ in pairs]
    if keys.count(gold[0]) != 1 or gold not in pairs:
        raise TaskDataError(f"{where}: the gold pair {list(gold)} must occur exactly once in ordered_kv_records")
    if len(pairs) < 2:
        raise TaskDataError(f"{where}: needs at least 2 key-value pairs, got {len(pairs)}")
    distractors = [pair for pair in pairs if pair != gold]
    return Example(
        gold=gold,
        distractors=distractors,
        answers=[gold[1]],
        fields={"key": gold[0], "value": gold[1]},
        other_forms=[f'"{gold[1]}"'],  # the value as the JSON data writes it, which the model often copies
    )


def make_example(sample: Sample, options: Mapping[str, Any]) -> Example:
    if options["data_path"] is not None:
        records = read_jsonl(options["data_path"], LITM_KEYS)
        return example_from_record(records[sample.index], f"{options['data_path']} record {sample.index + 1}")
    record = generate_kv_record(sample.rng, options["num_pairs"], options["value_format"])
    return example_from_record(record, "generated record")


def count_records(options: Mapping[str, Any]) -> int | None:
    if options["data_path"] is None:
        return None
    return len(read_jsonl(options["data_path"], LITM_KEYS))


def check_options(options: dict, given: set[str]) -> None:
    if options["data_path"] is not None:
        fixed = sorted(given & {"num_pairs", "value_format"})
        if fixed:
            raise TaskDataError(
                f"{NAME}: {fixed} apply to generated data only; data_path={options['data_path']!r} fixes the pairs"
            )
    options["num_pairs"] = as_int(NAME, "num_pairs", options["num_pairs"], minimum=2)
    if options["value_format"] not in VALUE_FORMATS:
        raise TaskDataError(
            f"{NAME}: value_format={options['value_format']!r} is not one of {sorted(VALUE_FORMATS)}"
        )


KV_RETRIEVAL = register_position_task(
    PositionTask(
        name=NAME,
        positions=POSITIONS,
        make_example=make_example,
        render=render_prompt,
        metric=substring_accuracy,
        metric_name="accuracy",  # LitM's name for this metric
        options=OPTIONS,
        count_records=count_records,
        check_options=check_options,
        # A UUID value is about 25 tokens; the answer line ends well within 48.
        generation_kwargs={"until": ["\n"], "max_gen_toks": 48, "do_sample": False},
        item_answer=pair_value,
    )
)
