"""L-Eval's closed-ended tasks used by the paper: Coursera, QuALITY, TOEFL (``tpo``), SFiction (``sci_fi``).

Data: ``leval/<task>.jsonl``, one long document per line with parallel lists
``instructions`` and ``outputs`` (OpenLMLab/LEval, ``LEval-data/Closed-ended-tasks``).
Each (document, question) pair is one lm-eval doc. Docs are ordered round-robin over the
documents (question 1 of every document, then question 2, ...) so that ``--limit N`` spreads
over min(N, documents) documents instead of asking N questions about the first one.

Prompts follow L-Eval's ``Baselines`` (the per-task system prompt of ``LEval_config.py`` and the
``exam_eval`` message of ``llama2-chat-test.py``, both verbatim, typos included) without the
Llama-2 ``[INST]`` markers, which belong to one chat model; pass ``--apply_chat_template`` for
an instruct model's own format. The document keeps its beginning and is cut so the whole
prompt fits ``max_context_tokens`` (default 3,584).

Scoring follows L-Eval's ``Evaluation/auto_eval.py`` and ``em.py``:

- option tasks: the answer letter(s) are parsed from the output (Coursera may have several,
  e.g. ``BD``); exact match scores 1, and for Coursera a proper subset of the correct
  options scores 0.25;
- SFiction: the gold ``"True [fact: False]"`` holds a *loyalty* answer (by the document) and a
  *fact* answer (by real-world knowledge). Each question is asked both ways, the fact question
  without the document, as L-Eval does; ``exact_match`` is their mean.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from lpes_harness.tasks.data import TaskDataError, read_jsonl
from lpes_harness.tasks.suites.common import (
    DEFAULT_MAX_CONTEXT_TOKENS,
    as_int,
    fit_document,
    suite_dir,
    token_starts,
    tokenizer_from_metadata,
)

# lm-eval task name -> file stem under leval/
TASKS = {"leval_coursera": "coursera", "leval_quality": "quality", "leval_tpo": "tpo", "leval_sci_fi": "sci_fi"}
MULTI_ANSWER_TASKS = {"coursera"}
LEVAL_KEYS = ("input", "instructions", "outputs")

# L-Eval's LEval_config.get_sys_prompt, verbatim.
SYSTEM_PROMPTS = {
    "coursera": (
        "Now you are given a very long document. Please follow the instruction based on this document. "
        "For multi-choice questions, there could be a sinlge correct option or multiple correct options. "
        "Please only provide the letter corresponding to the answer (like A or AB) when answering. "
    ),
    "sci_fi": (
        "Now you are given a scientific fiction. I will ask you some questions and the answer should be "
        '"True" or "False". Notice that you should answer the question based on the evidence in the '
        "document instead of your background knowledge."
    ),
    # quality, tpo: the generic exam prompt
    "exam": (
        "Now you are given a very long document. Please follow the instruction based on this document. "
        "For multi-choice questions, there is only a sinlge correct option. Please only provide the letter "
        "corresponding to the answer (like A or B) when answering. For other questions, please directly give "
        "the concise and accurate answer. "
    ),
}

# llama2-chat-test.py, exam_eval branch (system block, then the context, then "\nAnswer:").
QUESTION_TEMPLATE = (
    "{system}\n\nDocument is as follows. {document} \nQuestion: {instruction}.  "
    "Please directly give the answer without any additional output or explanation \nAnswer:"
)
# The SFiction fact question, asked without the document.
FACT_FROM = "based on the world described in the document."
FACT_TO = "based on the real-world knowledge and facts up until your last training"
FACT_SUFFIX = "Please directly answer without any additional output or explanation. \nAnswer:"


def system_prompt(task: str) -> str:
    return SYSTEM_PROMPTS.get(task, SYSTEM_PROMPTS["exam"])


def question_prompt(task: str, document: str, instruction: str) -> str:
    return QUESTION_TEMPLATE.format(system=system_prompt(task), document=document, instruction=instruction)


def fact_prompt(instruction: str) -> str:
    return instruction.replace(FACT_FROM, FACT_TO) + FACT_SUFFIX


# ---------------------------------------------------------------- docs


def data_file(task: str) -> str:
    """The file of ``task`` (``coursera``, ...) in the ``leval`` folder."""
    return f"{task}.jsonl"


def read_task(task: str, data_path: str | None = None) -> list[dict]:
    path = suite_dir("leval", data_file(task), data_path) / data_file(task)
    records = read_jsonl(path, LEVAL_KEYS)
    for number, record in enumerate(records, start=1):
        if len(record["instructions"]) != len(record["outputs"]):
            raise TaskDataError(
                f"{path} record {number}: {len(record['instructions'])} instructions but {len(record['outputs'])} outputs"
            )
    return records


def round_robin(records: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """(document, question) pairs: the first question of every document, then the second, ..."""
    order = []
    longest = max(len(r["instructions"]) for r in records)
    for question in range(longest):
        order += [(doc, question) for doc, r in enumerate(records) if question < len(r["instructions"])]
    return order


def build_docs(task: str, records: Sequence[Mapping[str, Any]], tokenizer, max_context_tokens: int) -> list[dict]:
    docs = []
    starts_cache: dict[int, list[int]] = {}
    for doc_index, question_index in round_robin(records):
        record = records[doc_index]
        instruction = record["instructions"][question_index]
        gold = record["outputs"][question_index]
        if doc_index not in starts_cache:
            starts_cache[doc_index] = token_starts(tokenizer, record["input"])
        prompt, truncated = fit_document(
            tokenizer,
            lambda text, instruction=instruction: question_prompt(task, text, instruction),
            record["input"],
            max_context_tokens,
            starts=starts_cache[doc_index],
        )
        base = {"leval_task": task, "doc_index": doc_index, "question_index": question_index, "gold": gold}
        if task == "sci_fi":
            loyalty, fact = split_judgement(gold)
            docs.append({**base, "prompt": prompt, "truncated": truncated, "judgement": "loyalty", "target": loyalty})
            docs.append({**base, "prompt": fact_prompt(instruction), "truncated": False, "judgement": "fact", "target": fact})
        else:
            docs.append({**base, "prompt": prompt, "truncated": truncated, "judgement": "", "target": gold})
    return docs


def load_dataset(leval_task: str, data_path: str | None = None, max_context_tokens: Any = DEFAULT_MAX_CONTEXT_TOKENS, **metadata):
    """lm-eval ``custom_dataset`` for one L-Eval task; metadata as in the module docstring."""
    import datasets

    if leval_task not in TASKS.values():
        raise TaskDataError(f"unknown L-Eval task {leval_task!r}; accepted: {sorted(TASKS.values())}")
    budget = as_int(f"leval_{leval_task}", "max_context_tokens", max_context_tokens, minimum=1)
    records = read_task(leval_task, data_path)
    docs = build_docs(leval_task, records, tokenizer_from_metadata(metadata), budget)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


# ---------------------------------------------------------------- metrics


def parse_gold_options(gold: str) -> str:
    """``"(B) Their subconscious..."`` -> ``"B"``, ``"BD"`` -> ``"BD"``: the A-D letters of the first word."""
    words = gold.split()
    letters = re.sub(r"[^A-D]", "", words[0]) if words else ""
    return letters or "A"  # L-Eval's fallback


def parse_output_options(response: str, multiple: bool) -> str:
    """L-Eval's ``process_output_mc``: the option letter(s) a model's answer names.

    Single-answer tasks take the first A-D character anywhere. Coursera takes a leading run
    of letters (``"BD."``), else letters standing alone before the next "Question"
    (``"B and D"``), else the first run of letters; an answer naming none counts as ``A``
    (L-Eval's random guess); an empty answer as no option.
    """
    if not response.strip():
        return "None"
    if response in "ABCD":
        return response
    if not multiple:
        for char in response:
            if char in "ABCD":
                return char
    leading = ""
    for char in response:
        if char not in "ABCD":
            break
        leading += char
    if len(leading) > 1:
        return "".join(sorted(set(leading)))
    rest = response[len(leading):].split("Question")[0]
    standalone = leading + "".join(re.findall(r"\s*[A-Z](?=[\s.)])", rest))
    letters = "".join(sorted(set(re.sub(r"[^A-D]", "", standalone))))
    if not letters:
        match = re.search(r"[ABCD]+", rest)
        letters = match.group(0) if match else ""
    return letters or "A"


def exam_score(prediction: str, gold: str) -> float:
    """L-Eval ``em.exact_match_score`` on option letters: 1 if equal, 0.25 if a proper subset."""
    if prediction == gold:
        return 1.0
    if prediction and set(prediction) <= set(gold):
        return 0.25  # some but not all correct options (Coursera)
    return 0.0


def split_judgement(text: str) -> tuple[str, str]:
    """``"True [fact: False]"`` -> ``("true", "false")`` (L-Eval's ``process_gt_judge``)."""
    lowered = text.lower()
    if "[fact:" not in lowered:
        raise TaskDataError(f"SFiction answer {text!r} lacks the '[fact: ...]' part")
    loyalty, fact = lowered.split("[fact:", 1)
    return loyalty.strip(), fact.strip().rstrip("]").strip()


def parse_true_false(response: str) -> str:
    """The first word containing "true" or "false" decides; else ``<error>`` (no guessing, as L-Eval)."""
    for word in response.lower().split():
        if "true" in word:
            return "true"
        if "false" in word:
            return "false"
    return "<error>"


def score(doc: Mapping[str, Any], response: str) -> dict[str, float]:
    task = doc["leval_task"]
    if task == "sci_fi":
        correct = float(parse_true_false(response) == doc["target"])
        return {"exact_match": correct, doc["judgement"]: correct}
    prediction = parse_output_options(response, multiple=task in MULTI_ANSWER_TASKS)
    return {"exact_match": exam_score(prediction, parse_gold_options(doc["target"]))}


def process_results(doc: Mapping[str, Any], results: Sequence[str]) -> dict[str, float]:
    """lm-eval ``process_results``."""
    return score(doc, results[0])
