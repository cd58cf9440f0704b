"""Multi-document QA (LitM): answer a Natural Questions question from N documents, one of them gold.

Built from LitM's ``nq-open-oracle.jsonl.gz`` (question, answers, the gold passage in
``ctxs``): each example is the gold passage plus N-1 distractors, the passages of *other*
questions ranked by BM25 (rank-bm25) against the question, skipping any passage that
contains a normalised answer. This approximates LitM's retrieved hard negatives, which
were Contriever results over Wikipedia that we cannot reproduce offline.

A LitM prebuilt MDQA file (``nq-open-20_total_documents_gold_at_*.jsonl.gz``: ``ctxs`` with
many documents, one ``isgold``) is read as is: its distractors keep their order.
"""

import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lpes_harness.tasks.data import TaskDataError, find_shared_file, read_jsonl
from lpes_harness.tasks.metrics import best_subspan_em, normalize_answer
from lpes_harness.tasks.position import Example, PositionTask, Sample, as_int, register_position_task

NAME = "mdqa"
POSITIONS = (0, 25, 50, 75, 100)
DEFAULT_DATA_FILE = "lost_in_the_middle/nq-open-oracle.jsonl.gz"
DEFAULT_NUM_DOCS = 10  # LitM used 10, 20 and 30; 10 keeps CPU runs short
REQUIRED_KEYS = ("question", "answers", "ctxs")

# LitM's qa.prompt, verbatim.
PROMPT_TEMPLATE = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant).\n"
    "\n"
    "{search_results}\n"
    "\n"
    "Question: {question}\n"
    "Answer:"
)

OPTIONS = {"num_docs": None}  # None: 10 when building from the oracle file, all documents of a prebuilt file


def format_documents(documents: Sequence[Mapping[str, str]]) -> str:
    return "\n".join(
        f"Document [{number}](Title: {doc['title']}) {doc['text']}" for number, doc in enumerate(documents, start=1)
    )


def document_text(document: Mapping[str, str]) -> str:
    return f"{document['title']} {document['text']}"


def render_prompt(items, example: Example) -> str:
    return PROMPT_TEMPLATE.format(search_results=format_documents(items), question=example.fields["question"])


def _tokenize(text: str) -> list[str]:
    return normalize_answer(text).split()


def contains_answer(passage: Mapping[str, str], answers: Sequence[str]) -> bool:
    """Whether a normalised answer occurs in the passage's normalised title or text."""
    haystack = normalize_answer(f"{passage['title']} {passage['text']}")
    # An answer that normalises to "" (e.g. "The") would match everything; it cannot mark a passage.
    return any(norm and norm in haystack for norm in (normalize_answer(a) for a in answers))


class PassageIndex:
    """BM25 over the gold passages of every question of the oracle file."""

    def __init__(self, records: Sequence[Mapping[str, Any]]):
        from rank_bm25 import BM25Okapi

        self.passages: list[dict] = []
        self.owner: list[int] = []  # the record whose gold passage this is
        seen: dict[tuple[str, str], int] = {}
        for record_index, record in enumerate(records):
            for ctx in record["ctxs"]:
                key = (ctx["title"], ctx["text"])
                if key in seen:  # several questions can share one passage: index it once
                    continue
                seen[key] = len(self.passages)
                self.passages.append({"title": ctx["title"], "text": ctx["text"]})
                self.owner.append(record_index)
        self.bm25 = BM25Okapi([_tokenize(f"{p['title']} {p['text']}") for p in self.passages])

    def distractors(self, question: str, answers: Sequence[str], gold: Mapping[str, str], count: int) -> list[dict]:
        """The ``count`` best-ranked passages that are not the gold one and hold no answer."""
        scores = self.bm25.get_scores(_tokenize(question))
        ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        chosen = []
        for i in ranked:
            passage = self.passages[i]
            if passage["text"] == gold["text"] or contains_answer(passage, answers):
                continue
            chosen.append(passage)
            if len(chosen) == count:
                return chosen
        raise TaskDataError(f"{NAME}: only {len(chosen)} answer-free distractors for {question!r}; asked for {count}")


@functools.lru_cache(maxsize=2)
def _passage_index(path: str, _mtime_ns: int) -> PassageIndex:
    return PassageIndex(read_jsonl(path, REQUIRED_KEYS))


def passage_index(path: str) -> PassageIndex:
    return _passage_index(str(Path(path).resolve()), os.stat(path).st_mtime_ns)


def data_path(options: Mapping[str, Any]) -> str:
    if options["data_path"] is not None:
        return options["data_path"]
    return str(find_shared_file(DEFAULT_DATA_FILE))


def is_prebuilt(records: Sequence[Mapping[str, Any]]) -> bool:
    """LitM's prebuilt MDQA files carry all documents; the oracle file only the gold one."""
    return len(records[0]["ctxs"]) > 1


def _gold_ctx(record: Mapping[str, Any], where: str) -> dict:
    golds = [ctx for ctx in record["ctxs"] if ctx.get("isgold")]
    if len(golds) != 1:
        raise TaskDataError(f"{where}: expected exactly one ctx with isgold true, found {len(golds)}")
    return {"title": golds[0]["title"], "text": golds[0]["text"]}


def make_example(sample: Sample, options: Mapping[str, Any]) -> Example:
    path = data_path(options)
    records = read_jsonl(path, REQUIRED_KEYS)
    record = records[sample.index]
    where = f"{path} record {sample.index + 1}"
    gold = _gold_ctx(record, where)
    answers = list(record["answers"])
    if is_prebuilt(records):
        others = [{"title": c["title"], "text": c["text"]} for c in record["ctxs"] if not c.get("isgold")]
        num_docs = options["num_docs"] or len(others) + 1
        if num_docs - 1 > len(others):
            raise TaskDataError(f"{where}: num_docs={num_docs} but the record has {len(others) + 1} documents")
        distractors = others[: num_docs - 1]
    else:
        num_docs = options["num_docs"] or DEFAULT_NUM_DOCS
        distractors = passage_index(path).distractors(record["question"], answers, gold, num_docs - 1)
    return Example(gold=gold, distractors=distractors, answers=answers, fields={"question": record["question"]})


def count_records(options: Mapping[str, Any]) -> int:
    return len(read_jsonl(data_path(options), REQUIRED_KEYS))


def check_options(options: dict, given: set[str]) -> None:
    if options["num_docs"] is not None:
        options["num_docs"] = as_int(NAME, "num_docs", options["num_docs"], minimum=2)


MDQA = register_position_task(
    PositionTask(
        name=NAME,
        positions=POSITIONS,
        make_example=make_example,
        render=render_prompt,
        metric=best_subspan_em,
        metric_name="best_subspan_em",  # LitM's name for this metric
        options=OPTIONS,
        count_records=count_records,
        check_options=check_options,
        item_text=document_text,
    )
)
