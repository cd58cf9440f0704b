"""ZeroSCROLLS, the 7 tasks with local data: 4 summarisation / query-based summarisation, 2 QA, QuALITY.

Data: ``zeroscrolls/<task>.validation.jsonl`` with ``id``, ``input`` (the complete prompt:
instruction, ``<Header>:`` line, document, query, closing ``Answer:`` or ``Summary:``) and
``output`` (ONE reference).

Truncation follows ZeroSCROLLS' ``run_hf_model.py``: when the prompt exceeds the budget
(``max_context_tokens``, default 3,584) the document keeps its beginning, followed by
``... [The rest of the <header> is omitted]\\n\\n`` and the untouched query part. The local
files have no ``query_start_index``, so the query is found as the last ``\\n\\nQuestion:``,
``\\n\\nQuestion and Possible Answers:``, ``\\n\\nQuery:`` or ``\\n\\nSummary:`` block.

Metrics (per example, averaged over examples as ZeroSCROLLS does):

- gov_report, summ_screen_fd, qmsum, squality: ROUGE-1/2/L F-measure (``rouge-score``, Porter
  stemming), as ``rouge1``, ``rouge2``, ``rougeL``; the ZeroSCROLLS task score is their
  geometric mean, which ``lpes-report`` computes;
- qasper, narrative_qa: SQuAD-style token F1 (``f1``). The official sets have several
  references per question and take the max; these files keep one, so the scores are
  **single-reference** and not comparable to the leaderboard. The task metadata says
  ``single_reference: true`` and the report marks them;
- quality: accuracy (``acc``) of the first option letter in the answer.
"""

from __future__ import annotations

import collections
import functools
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from lpes_harness.tasks.data import TaskDataError, read_jsonl
from lpes_harness.tasks.suites.common import DEFAULT_MAX_CONTEXT_TOKENS, as_int, fit_document, suite_dir, tokenizer_from_metadata

ROUGE_TASKS = ("gov_report", "summ_screen_fd", "qmsum", "squality")
F1_TASKS = ("qasper", "narrative_qa")
ACCURACY_TASKS = ("quality",)
TASKS = ROUGE_TASKS + F1_TASKS + ACCURACY_TASKS
SINGLE_REFERENCE_TASKS = F1_TASKS

QUERY_MARKERS = ("\n\nQuestion and Possible Answers:\n", "\n\nQuestion:\n", "\n\nQuery:\n", "\n\nSummary:\n")
HEADER = re.compile(r"\n\n([^\n]{1,40}):\n")  # "Report:", "Episode Script:", "Story:", ...
SEPARATOR = "... [The rest of the {noun} is omitted]\n\n"


def task_name(task: str) -> str:
    return f"zeroscrolls_{task}"


def metric_names(task: str) -> tuple[str, ...]:
    if task in ROUGE_TASKS:
        return ("rouge1", "rouge2", "rougeL")
    if task in F1_TASKS:
        return ("f1",)
    return ("acc",)


def split_input(text: str, where: str) -> tuple[str, str, str, str]:
    """(head up to the document, document, query part from the marker on, header noun)."""
    header = HEADER.search(text)
    if header is None:
        raise TaskDataError(f"{where}: no '<Header>:' line after the instruction")
    ends = [text.rfind(marker) for marker in QUERY_MARKERS]
    query_start = max(ends)
    if query_start < header.end():
        raise TaskDataError(f"{where}: no query block ({', '.join(repr(m.strip()) for m in QUERY_MARKERS)}) after the document")
    query_start += 2  # the separator ends with its own blank line
    return text[: header.end()], text[header.end() : query_start], text[query_start:], header.group(1).lower()


def build_docs(task: str, records: Sequence[Mapping[str, Any]], tokenizer, max_context_tokens: int, path: str) -> list[dict]:
    docs = []
    for number, record in enumerate(records, start=1):
        head, document, query, noun = split_input(record["input"], f"{path} record {number}")
        document = document[:-2] if document.endswith("\n\n") else document
        prompt, truncated = fit_document(
            tokenizer,
            lambda text, head=head, query=query: head + text + ("\n\n" if not text.endswith("\n\n") else "") + query,
            document,
            max_context_tokens,
            separator=SEPARATOR.format(noun=noun),
        )
        docs.append(
            {"id": str(record["id"]), "zeroscrolls_task": task, "prompt": prompt, "target": record["output"], "truncated": truncated}
        )
    return docs


def data_file(task: str) -> str:
    """The file of ``task`` (``qasper``, ...) in the ``zeroscrolls`` folder."""
    return f"{task}.validation.jsonl"


def load_dataset(zeroscrolls_task: str, data_path: str | None = None, max_context_tokens: Any = DEFAULT_MAX_CONTEXT_TOKENS, **metadata):
    """lm-eval ``custom_dataset`` for one ZeroSCROLLS task."""
    import datasets

    if zeroscrolls_task not in TASKS:
        raise TaskDataError(f"unknown ZeroSCROLLS task {zeroscrolls_task!r}; accepted: {list(TASKS)}")
    budget = as_int(task_name(zeroscrolls_task), "max_context_tokens", max_context_tokens, minimum=1)
    path = suite_dir("zeroscrolls", data_file(zeroscrolls_task), data_path) / data_file(zeroscrolls_task)
    records = read_jsonl(path, ("id", "input", "output"))
    docs = build_docs(zeroscrolls_task, records, tokenizer_from_metadata(metadata), budget, str(path))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


# ---------------------------------------------------------------- metrics


@functools.lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    scores = _rouge_scorer().score(reference, prediction)
    return {name: value.fmeasure for name, value in scores.items()}


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(char for char in text if char not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((collections.Counter(predicted) & collections.Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def first_option_letter(response: str) -> str | None:
    """The option a QuALITY answer names: ``"(B) ..."``, ``"B"``, ``"The answer is B."``."""
    match = re.match(r"\s*\(?([A-D])\b", response) or re.search(r"\(([A-D])\)", response) or re.search(r"\b([A-D])\b", response)
    return match.group(1) if match else None


def score(doc: Mapping[str, Any], response: str) -> dict[str, float]:
    task, reference = doc["zeroscrolls_task"], doc["target"]
    if task in ROUGE_TASKS:
        return rouge(response, reference)
    if task in F1_TASKS:
        return {"f1": token_f1(response, reference)}
    return {"acc": float(first_option_letter(response) == first_option_letter(reference))}


def process_results(doc: Mapping[str, Any], results: Sequence[str]) -> dict[str, float]:
    """lm-eval ``process_results``."""
    return score(doc, results[0].strip())
