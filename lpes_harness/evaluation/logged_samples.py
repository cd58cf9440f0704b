"""Per-sample scores that ``lm_eval --log_samples`` wrote next to a results file.

lm-eval's tracker names one run's files by the same timestamp: ``results_<date>.json`` and, per
task, ``samples_<task>_<date>.jsonl`` (one JSON object per sample with ``doc_id`` and each
metric's value). Two runs over the same split pair up by ``doc_id``, which is what a paired test
of two methods needs; the aggregated results alone only allow an interval per method.

A committed record (``lpes-report --keep-samples``) keeps those scores without the samples files:
``results_<method>.json`` beside a ``per_sample.json`` (method -> task -> doc_id -> record). A
results file read from such a record is paired from it, so a row can be added to a committed
report after the run folders it was made from are gone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

RESULTS_PREFIX = "results_"
KEPT_SAMPLES = "per_sample.json"


def kept_stem(method: str) -> str:
    """The file-name form of a method's name in a kept record (a name may hold spaces or slashes)."""
    return re.sub(r"[^\w.-]+", "_", method)


def samples_file(results_file: Path, task: str) -> Path | None:
    """The ``samples_<task>_<date>.jsonl`` written with ``results_<date>.json``, if there is one."""
    stem = results_file.stem
    if not stem.startswith(RESULTS_PREFIX):
        return None
    path = results_file.with_name(f"samples_{task}_{stem[len(RESULTS_PREFIX):]}.jsonl")
    return path if path.is_file() else None


def logged_rows(path: Path):
    """(line number, sample) for each logged sample of one samples file; a line that is not JSON
    is a ValueError naming the file and line."""
    # Split on "\n" only: str.splitlines() also splits on U+2028 / U+0085, which JSON leaves
    # unescaped inside strings (MMLU questions have them), cutting a sample in two.
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from None


def read_scores(path: Path, metric: str) -> dict[int, float]:
    """``doc_id`` -> the sample's ``metric`` from one samples file."""
    scores: dict[int, float] = {}
    for number, row in logged_rows(path):
        if metric not in row or "doc_id" not in row:
            raise ValueError(f"{path}:{number}: a logged sample needs 'doc_id' and {metric!r}, got {sorted(row)[:8]}")
        scores[int(row["doc_id"])] = float(row[metric])
    return scores


def logged_scores(results_file: Path, metrics: Mapping[str, str]) -> dict[str, dict[int, float]]:
    """task -> doc_id -> score, for each ``task: metric`` whose samples file sits next to
    ``results_file``, or, for a results file of a kept record, from its ``per_sample.json``."""
    found = {}
    for task, metric in metrics.items():
        path = samples_file(results_file, task)
        if path is not None:
            found[task] = read_scores(path, metric)
    missing = {task: metric for task, metric in metrics.items() if task not in found}
    if missing:
        found.update(kept_scores(results_file, missing))
    return found


def kept_records(results_file: Path) -> dict[str, dict[str, dict]]:
    """task -> doc_id -> record, from the ``per_sample.json`` beside a kept
    ``results_<method>[_<n>].json`` (empty when ``results_file`` is not part of a kept record)."""
    record_file = results_file.with_name(KEPT_SAMPLES)
    if not record_file.is_file():
        return {}
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{record_file}: not JSON ({err.msg}, line {err.lineno})") from None
    stem = results_file.stem
    # results_<stem>.json, or results_<stem>_<n>.json for a method kept from several results files
    method = next((m for m in record if stem == f"{RESULTS_PREFIX}{kept_stem(m)}"), None) or next(
        (m for m in record if re.fullmatch(re.escape(f"{RESULTS_PREFIX}{kept_stem(m)}") + r"_\d+", stem)), None)
    return record[method] if method is not None else {}


def kept_scores(results_file: Path, metrics: Mapping[str, str]) -> dict[str, dict[int, float]]:
    """task -> doc_id -> score, for each ``task: metric`` a kept record holds for ``results_file``."""
    records, found = kept_records(results_file), {}
    for task, metric in metrics.items():
        if not records.get(task):
            continue
        try:
            found[task] = {int(doc): float(sample[metric]) for doc, sample in records[task].items()}
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{results_file.with_name(KEPT_SAMPLES)}: {results_file.name} / {task}: every kept "
                             f"sample needs a numeric {metric!r}") from None
    return found


def sample_records(results_file: Path, tasks) -> dict[str, dict[str, dict]]:
    """task -> doc_id -> what a committed record keeps of each logged sample: its metrics, the
    document's hash and the answer (a generation's filtered text). The prompt and the document are
    left out: they are most of the bytes, and the task regenerates them from its metadata. A
    results file of a kept record passes its records on (a report re-kept with a row added)."""
    found, kept = {}, None
    for task in tasks:
        path = samples_file(results_file, task)
        if path is None:
            kept = kept_records(results_file) if kept is None else kept
            if kept.get(task):
                found[task] = kept[task]
            continue
        records = {}
        for _, row in logged_rows(path):
            record = {metric: row[metric] for metric in row.get("metrics") or () if metric in row}
            record["doc_hash"] = row.get("doc_hash")
            answers = row.get("filtered_resps") or []
            if answers and isinstance(answers[0], str):
                record["answer"] = answers[0]
            records[str(row["doc_id"])] = record
        found[task] = dict(sorted(records.items(), key=lambda item: int(item[0])))
    return found
