"""MMLU and C-Eval from their CSV files, in lm-eval's ``mmlu`` / ``ceval-valid`` format (and MMLU's continuation form).

One lm-eval task per subject (``mmlu_local_<subject>``, ``ceval_local_<subject>``), scored by
the log-likelihood of the answer letter after ``Answer:`` / ``答案：``, 5-shot from the
subject's dev split taken in file order (lm-eval's ``first_n`` sampler). Subjects and their
categories come from the suite's ``mapping.json``. ``mmlu_continuation_local_<subject>`` is
lm-eval's ``mmlu_continuation``: 0-shot, ``Question: ...\nAnswer:``, each option's text scored
(``acc`` and the length-normalised ``acc_norm``).

Files (see the shared data README):

- MMLU ``mmlu/{test,dev}/<subject>_{test,dev}.csv``: no header, ``question,A,B,C,D,answer``.
- C-Eval ``ceval/{val,dev}/<subject>_{val,dev}.csv``: header ``id,question,A,B,C,D,answer``
  (dev adds ``explanation``, unused: the standard prompt has no chain of thought).

Every doc is ``{"question", "choices": [A, B, C, D], "answer": index, "subject"}``.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lpes_harness.tasks.data import TaskDataError
from lpes_harness.tasks.suites.common import suite_dir

LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class MultipleChoiceSuite:
    name: str  # lm-eval group name, also the prefix of every subject task
    folder: str  # folder under the data root
    eval_split: str  # the split scored (MMLU: test, C-Eval: val; C-Eval's test has no answers)
    header: bool  # whether the CSV files have a header row
    description: str  # lm-eval's per-subject description; {name} is the subject's display name
    answer_cue: str  # what ends each question, before the letter
    # "letters": the options are listed and the answer letter is scored (lm-eval's mmlu);
    # "continuation": no options shown, each option's *text* is scored as the continuation
    # (lm-eval's mmlu_continuation, the "cloze" form). Small models answer the letter form at
    # chance (SmolLM2-135M picks A or C whatever the question) and rise above it only here.
    style: str = "letters"
    num_fewshot: int = 5


MMLU = MultipleChoiceSuite(
    name="mmlu_local",
    folder="mmlu",
    eval_split="test",
    header=False,
    description="The following are multiple choice questions (with answers) about {name}.\n\n",
    answer_cue="Answer:",
)

# The same files and split as MMLU, in lm-eval's mmlu_continuation form.
MMLU_CONTINUATION = dataclasses.replace(
    MMLU,
    name="mmlu_continuation_local",
    description="The following are questions (with answers) about {name}.\n\n",
    style="continuation",
    num_fewshot=0,
)

CEVAL = MultipleChoiceSuite(
    name="ceval_local",
    folder="ceval",
    eval_split="val",
    header=True,
    description="以下是中国关于{name}考试的单项选择题，请选出其中的正确答案。\n\n",
    answer_cue="答案：",
)

SUITES = {suite.name: suite for suite in (MMLU, MMLU_CONTINUATION, CEVAL)}
# Every subject of a suite is read through this file (subject -> name, category) in its folder.
MAPPING_FILE = "mapping.json"


def read_mapping(suite: MultipleChoiceSuite, data_path: str | None = None) -> dict[str, dict[str, str]]:
    """subject -> {"name", "category"} from the suite's ``mapping.json``."""
    path = suite_dir(suite.folder, MAPPING_FILE, data_path) / MAPPING_FILE
    try:
        mapping = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise TaskDataError(f"{path}: malformed JSON ({err.msg}, line {err.lineno})") from None
    for subject, entry in mapping.items():
        if not isinstance(entry, dict) or not {"name", "category"} <= set(entry):
            raise TaskDataError(f"{path}: subject {subject!r} needs 'name' and 'category', got {entry!r}")
    return mapping


def read_rows(path: Path, header: bool) -> list[dict[str, Any]]:
    """Docs of one CSV file; errors name ``file:line``."""
    if not path.is_file():
        raise TaskDataError(f"{path} does not exist")
    docs = []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        columns = None
        if header:
            columns = next(reader, None)
            missing = [c for c in ("question", *LETTERS, "answer") if c not in (columns or [])]
            if missing:
                raise TaskDataError(f"{path}:1: header {columns} lacks {missing}")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if columns is not None:
                if len(row) != len(columns):
                    raise TaskDataError(f"{path}:{line}: {len(row)} fields, the header has {len(columns)}")
                record = dict(zip(columns, row))
                question, choices, letter = record["question"], [record[x] for x in LETTERS], record["answer"]
            else:
                if len(row) != 6:
                    raise TaskDataError(f"{path}:{line}: expected 6 fields (question,A,B,C,D,answer), got {len(row)}")
                question, choices, letter = row[0], row[1:5], row[5]
            letter = letter.strip()
            if letter not in LETTERS:
                raise TaskDataError(f"{path}:{line}: answer {letter!r} is not one of {list(LETTERS)}")
            docs.append({"question": question, "choices": choices, "answer": LETTERS.index(letter)})
    if not docs:
        raise TaskDataError(f"{path}: no questions")
    return docs


@functools.lru_cache(maxsize=256)
def _subject_docs(suite_name: str, folder: str, subject: str, split: str) -> tuple[dict, ...]:
    suite = SUITES[suite_name]
    docs = read_rows(Path(folder) / split / f"{subject}_{split}.csv", suite.header)
    return tuple({**doc, "subject": subject} for doc in docs)


def subject_docs(suite: MultipleChoiceSuite, subject: str, split: str, data_path: str | None = None) -> list[dict]:
    folder = suite_dir(suite.folder, MAPPING_FILE, data_path)
    mapping = read_mapping(suite, data_path)
    if subject not in mapping:
        raise TaskDataError(f"{suite.name}: unknown subject {subject!r}; mapping.json lists {sorted(mapping)}")
    return [dict(doc) for doc in _subject_docs(suite.name, str(folder), subject, split)]


def load_dataset(suite: str, subject: str, data_path: str | None = None, **metadata) -> Any:
    """lm-eval ``custom_dataset``: the subject's scored split and its dev split (for the shots)."""
    import datasets

    if suite not in SUITES:
        raise TaskDataError(f"unknown multiple-choice suite {suite!r}; accepted: {sorted(SUITES)}")
    spec = SUITES[suite]
    return datasets.DatasetDict(
        {
            spec.eval_split: datasets.Dataset.from_list(subject_docs(spec, subject, spec.eval_split, data_path)),
            "dev": datasets.Dataset.from_list(subject_docs(spec, subject, "dev", data_path)),
        }
    )


def doc_to_text(suite: MultipleChoiceSuite, doc: dict) -> str:
    """The question as lm-eval's mmlu/ceval (or mmlu_continuation) templates write it (the YAML holds the same)."""
    if suite.style == "continuation":
        return f"Question: {doc['question'].strip()}\n{suite.answer_cue}"
    options = "".join(f"\n{letter}. {choice}" for letter, choice in zip(LETTERS, doc["choices"]))
    return f"{doc['question'].strip()}{options}\n{suite.answer_cue}"


def doc_to_text_jinja(suite: MultipleChoiceSuite) -> str:
    """The same template as :func:`doc_to_text`, in lm-eval's Jinja, for the YAML files."""
    if suite.style == "continuation":
        return f"Question: {{{{question.strip()}}}}\n{suite.answer_cue}"
    options = "".join(f"\n{letter}. {{{{choices[{i}]}}}}" for i, letter in enumerate(LETTERS))
    return f"{{{{question.strip()}}}}{options}\n{suite.answer_cue}"


def doc_to_choice_yaml(suite: MultipleChoiceSuite) -> list[str] | str:
    """The letters, or (continuation) the options' own texts."""
    return "{{choices}}" if suite.style == "continuation" else list(LETTERS)
