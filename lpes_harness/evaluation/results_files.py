"""lm-eval results files, read for the report: one :class:`Method` per ``[METHOD=]PATH`` argument.

A method's scores are merged from its results JSON files (``lm_eval --output_path``; a folder is
searched for ``results*.json``), with lm-eval's sample counts, the suites' subtasks as the results
list them, the ``lpes_scales`` of its config, and, where the run logged samples
(``--log_samples``), each position or multiple-choice subtask's per-sample scores, and each
long-context task's per-sample metrics (L-Eval, ZeroSCROLLS: their scores are not one 0/1 each).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lpes_harness.evaluation.logged_samples import logged_scores, sample_records
from lpes_harness.evaluation.search_history import ReportError
from lpes_harness.methods import Method as TableMethod
from lpes_harness.core.arg_values import parse_bool
from lpes_harness.methods import METHODS, rope_entry, run_of
from lpes_harness.core.named_path import split_named_path
from lpes_harness.core.scaling import DEFAULT, SCALINGS
from lpes_harness.tasks.suites.multiple_choice import SUITES

POSITION_SUBTASK = re.compile(r"^(?P<group>.+)_pos(?P<percent>\d+)$")
MULTIPLE_CHOICE_SUITES = tuple(SUITES)
MULTIPLE_CHOICE_PREFIXES = tuple(f"{suite}_" for suite in MULTIPLE_CHOICE_SUITES)  # their subject tasks
LONG_CONTEXT_PREFIXES = ("leval_", "zeroscrolls_")
# Metrics that are not scores: left out of the tables.
SKIPPED_METRICS = ("_stderr", "alias", "samples")


def filtered_metrics(entry: Mapping[str, Any]) -> dict[str, float]:
    """One task's numbers in an lm-eval results entry, by lm-eval's key (metric and filter, ``acc,none``),
    stderr and labels left out."""
    return {key: float(value) for key, value in entry.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            and not any(s in key for s in SKIPPED_METRICS)}


def score_metrics(entry: Mapping[str, Any]) -> dict[str, float]:
    """One task's numbers by metric name (``acc,none`` -> ``acc``), as the tables show them. A metric under
    several filters is shown once by its name, the unfiltered one (``none``), else the first lm-eval wrote;
    each other filter by name and filter (``exact_match (flexible-extract)``), so that none is lost."""
    by_name: dict[str, dict[str, float]] = {}
    for key, value in filtered_metrics(entry).items():
        name, _, filter_name = key.partition(",")
        by_name.setdefault(name, {})[filter_name] = value
    shown = {name: "none" if "none" in filters else next(iter(filters)) for name, filters in by_name.items()}
    # Names first: a caller that takes a task's first metric gets a plain name.
    metrics = {name: filters[shown[name]] for name, filters in by_name.items()}
    metrics.update({f"{name} ({filter_name})": value for name, filters in by_name.items()
                    for filter_name, value in filters.items() if filter_name != shown[name]})
    return metrics


def result_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("results*.json") if p.is_file())
        if files:
            return files
        raise ReportError(f"{str(path)!r} holds no results*.json file (lm_eval --output_path writes them)")
    raise ReportError(f"{str(path)!r} does not exist; give a results JSON file or a folder of them")


def read_results(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise ReportError(f"{path}: no 'results' object; is this an lm-eval results file?")
    return data


class Method:
    """One method's scores, merged from its results files: task -> metric -> value."""

    def __init__(self, name: str):
        self.name = name
        self.scores: dict[str, dict[str, float]] = {}
        self.task_metadata: dict[str, dict] = {}
        self.scales: list[float] | None = None
        self.suites: dict[str, list[str]] = {}  # group -> its subtasks, from the results
        self.counts: dict[str, int] = {}  # task -> samples scored (lm-eval's "n-samples")
        self.file_counts: dict[str, int] = {}  # task -> its "n-samples" summed over the files read
        self.samples: dict[str, dict[int, float]] = {}  # task -> doc_id -> score (--log_samples)
        self.records: dict[str, dict[int, dict]] = {}  # long-context task -> doc_id -> its metrics (--log_samples)
        self.files: list[Path] = []  # the results files read, in order
        # group -> how every file that scored it could have made its score from its subtasks' ("size": their
        # mean weighted by their sample counts, lm-eval's weight_by_size; "plain": their mean), to join parts
        self.group_weighting: dict[str, set[str]] = {}
        self.model: str | None = None  # lm-eval's model name (config "model"), and its --model_args
        self.model_args: dict[str, Any] = {}

    @property
    def entry(self) -> TableMethod | None:
        """What the runs were in the table of methods (its label, its description), if they were one of ours.

        An ``lpes_hf`` run is named for the factors it ran (:func:`~lpes_harness.methods.rope_entry`): one
        factor other than 1 on every layer it moved (``scales=0.8``, a search that kept its uniform start,
        ``pi=true``), position or base, is PI, whatever file it came from. A run with ``layer_type`` moved
        only that type's layers, which the results file does not list: the layers it left at 1 are taken
        as the held ones. At the identity it keeps the model's entry (vanilla through ``lpes_hf``)."""
        entry = run_of(self.model, self.model_args)
        scaling = self._rope_scaling(entry)
        if scaling is None:
            return entry
        held = unmoved_layers(self.scales, scaling) if self.model_args.get("layer_type") else ()
        pi = parse_bool("pi", self.model_args.get("pi", False))
        return rope_entry(self.scales, scaling, held, pi) or entry

    @property
    def is_plain(self) -> bool:
        """The run is the plain model: lm-eval's own ``hf``, or ``lpes_hf`` with every factor 1 (bit for
        bit the plain model, so no row or description may call it LPES). Factors the results file does not
        record (``lpes_scales``) are not taken for ones."""
        if self.model == "hf":
            return True
        scaling = self._rope_scaling(run_of(self.model, self.model_args))
        return scaling is not None and rope_entry(self.scales, scaling) is None

    def _rope_scaling(self, entry: TableMethod | None) -> str | None:
        """What the factors multiply, for a run of rope.py's install (LPES of any scaling, PI) whose
        results file records its factors; None for any other run."""
        if entry is None or entry.module != METHODS["pi"].module or not self.scales:
            return None
        return str(self.model_args.get("scaling", DEFAULT))

    def add(self, data: Mapping[str, Any], file: Path | None = None) -> None:
        """Merge one results file. A task an earlier file of this method also scored is one task run in
        parts (``lm_eval --samples`` over different documents, or the same ones scored alike): its
        logged samples are joined and its scores become their means (every suite and position task
        here aggregates by mean), its count their number; without logged samples it is refused. A group's
        score (MMLU's, C-Eval's) is made again from its joined subtasks, the way its files made it."""
        repeated = {}
        for task, entry in data["results"].items():
            metrics = score_metrics(entry)
            if self.scores.get(task) and metrics:
                repeated[task] = metrics
            else:
                self.scores.setdefault(task, {}).update(metrics)
        for group, subtasks in (data.get("group_subtasks") or {}).items():
            if subtasks:
                self.suites.setdefault(group, list(subtasks))
                if group in data["results"]:
                    made = self.group_weighting.get(group, set(GROUP_MEANS))
                    self.group_weighting[group] = made & group_weighting(data, group, subtasks)
        for task, config in (data.get("configs") or {}).items():
            self.task_metadata[task] = config.get("metadata") or {}
        config = data.get("config") or {}
        self.model = self.model or config.get("model")
        self.model_args.update(_model_args(config.get("model_args")))
        if config.get("lpes_scaling"):  # a scales file says its scaling itself
            self.model_args.setdefault("scaling", config["lpes_scaling"])
        scales = config.get("lpes_scales")
        if scales:
            self.scales = [float(s) for s in scales]
        for task, counts in (data.get("n-samples") or {}).items():
            count = (counts or {}).get("effective", (counts or {}).get("original"))
            if isinstance(count, int) and count > 0:
                self.counts[task] = count
                self.file_counts[task] = self.file_counts.get(task, 0) + count
        logged_before = {t for t in repeated if t in self.samples or t in self.records}
        logged_here = set()
        if file is not None:
            metrics = {t: m[0] for t in data["results"] if POSITION_SUBTASK.match(t) and (m := main_metric(self, t))}
            # Multiple-choice subjects too (a group has no samples file, so only subjects are read):
            # "within a point of vanilla" needs a paired interval over the same questions.
            metrics.update({t: "acc" for t in data["results"] if t.startswith(MULTIPLE_CHOICE_PREFIXES)})
            for task, scores in logged_scores(file, metrics).items():
                self._join(self.samples, task, scores, file)
                logged_here.add(task)
            long_context = [t for t in data["results"] if t.startswith(LONG_CONTEXT_PREFIXES)]
            for task, records in sample_records(file, long_context).items():
                self._join(self.records, task, {int(doc): record for doc, record in records.items()}, file)
                logged_here.add(task)
            self.files.append(file)
        for task, metrics in repeated.items():
            if task not in self.suites:
                self._rescore(task, metrics, file if task in logged_before & logged_here else None)
        self._rejoin_groups([task for task in repeated if task in self.suites])

    def _join(self, store: dict[str, dict[int, Any]], task: str, found: Mapping[int, Any], file: Path) -> None:
        """Add one file's samples of ``task``; a document both files scored must be scored alike."""
        known = store.setdefault(task, {})
        for doc, value in found.items():
            if doc in known and known[doc] != value:
                raise ReportError(f"method {self.name!r}: {task} document {doc} is scored differently in {file} and "
                                  f"in an earlier file ({', '.join(map(str, self.files))}); one method's files may "
                                  f"share a task only over different documents (lm_eval --samples) or identical runs")
            known[doc] = value
        self.counts[task] = len(known)

    def _rescore(self, task: str, metrics: Mapping[str, float], logged: Path | None) -> None:
        """A task scored by two files: its scores become the means of its joined samples, for each metric
        every sample logged (a multiple-choice subject logs only ``acc`` here: ``acc_norm`` is left out).
        ``logged``: the file, if both it and an earlier one logged their samples of the task."""
        joined = self.records.get(task) or {}
        if not joined and task in self.samples:
            metric = main_metric(self, task)[0]
            joined = {doc: {metric: score} for doc, score in self.samples[task].items()}
        names = [n for n in {**self.scores[task], **metrics} if all(n in r for r in joined.values())]
        if logged is None or not joined or not names:
            raise ReportError(f"method {self.name!r}: {task} is scored by more than one results file "
                              f"({', '.join(map(str, self.files))}), not all of which logged its samples "
                              f"(lm_eval --log_samples), so its parts cannot be joined; give one run per task")
        self.scores[task] = {name: sum(float(r[name]) for r in joined.values()) / len(joined) for name in names}

    def _rejoin_groups(self, groups: Sequence[str]) -> None:
        """Groups scored by two files: each score made again from its subtasks' joined scores, as lm-eval made
        it in the group's files (a subgroup before the group above it)."""
        pending = set(groups)
        while pending:
            for group in sorted(g for g in pending if not pending & set(self.suites[g])):
                self._rejoin(group)
                pending.discard(group)

    def _rejoin(self, group: str) -> None:
        made = self.group_weighting.get(group) or set()
        subtasks = self.suites[group]
        sizes = [self._size(task) for task in subtasks] if made else []
        # Parts whose subtasks were all one size (a --limit run) cannot tell the two means apart; joined
        # subtasks of one size need not.
        if not made or (len(made) > 1 and len(set(sizes)) > 1):
            raise ReportError(f"method {self.name!r}: the group {group} is scored by more than one results file "
                              f"({', '.join(map(str, self.files))}), and its files' scores "
                              + ("are neither the size-weighted nor the plain mean of its subtasks'" if not made else
                                 "do not tell whether it weights its subtasks by size")
                              + "; run the group in one piece")
        weights = sizes if made == {"size"} else [1] * len(subtasks)
        names = [name for name in self.scores[group]
                 if name != "sample_len" and all(name in self.scores.get(task, {}) for task in subtasks)]
        self.scores[group] = {name: sum(w * self.scores[task][name] for w, task in zip(weights, subtasks)) / sum(weights)
                              for name in names}
        self.scores[group]["sample_len"] = sum(sizes)

    def _size(self, task: str) -> int:
        """Samples a task holds once its parts are joined: a subtask's count, a group's ``sample_len``."""
        size = self.scores.get(task, {}).get("sample_len") if task in self.suites else self.counts.get(task)
        if not size:
            raise ReportError(f"method {self.name!r}: {task}'s sample count is not in its results files, so the "
                              f"group above it cannot be joined from parts; run the group in one piece")
        return int(size)

    def check_parts(self) -> None:
        """Once every file of this method is read: a results file of a record kept in parts
        (``results_<row>_0.json``) shares that record's one ``per_sample.json``, which holds every
        part's documents. Given without its other parts, its aggregate would be one part's while the
        paired test ran over all of them: refused, naming what to give."""
        for task, counted in sorted(self.file_counts.items()):
            logged = len(self.records.get(task) or self.samples.get(task) or {})
            if logged > counted:
                raise ReportError(f"method {self.name!r}: its results files scored {counted} documents of {task}, but "
                                  f"the samples beside them hold {logged}: a part of a record kept in parts, so give "
                                  f"every part's results file (results_<row>_0.json, results_<row>_1.json, ...) as this row")

    def get(self, task: str, metric: str) -> float | None:
        return self.scores.get(task, {}).get(metric)


GROUP_MEANS = ("size", "plain")


def group_weighting(data: Mapping[str, Any], group: str, subtasks: Sequence[str]) -> set[str]:
    """How one results file's score of ``group`` may have been made from its subtasks' (the file does not
    say: lm-eval's ``weight_by_size`` lives in the group's YAML): "size", their mean weighted by their sample
    counts, and "plain", their plain mean, whichever it equals (both where the subtasks are of one size;
    none where neither, or the file lacks what tells)."""
    results, counts = data["results"], data.get("n-samples") or {}

    def size(task):
        count = counts.get(task) or {}
        return count.get("effective", count.get("original")) or (results.get(task) or {}).get("sample_len")

    sizes = [size(task) for task in subtasks]
    # By metric and filter: a subtask's other filter of the same metric (strict-match beside none) is
    # another number, which the group's does not average.
    for key, value in filtered_metrics(results[group]).items():
        if key.split(",")[0] == "sample_len":
            continue
        values = [filtered_metrics(results.get(task) or {}).get(key) for task in subtasks]
        if None in values or not all(sizes):
            return set()
        means = {"size": sum(n * v for n, v in zip(sizes, values)) / sum(sizes), "plain": sum(values) / len(values)}
        return {name for name, mean in means.items() if abs(mean - value) <= 1e-9 * max(1.0, abs(value))}
    return set()


def unmoved_layers(scales: Sequence[float], scaling: str) -> tuple[int, ...]:
    """The layers whose every factor is 1 (under scaling both, both of its factors): a ``layer_type``
    run's held layers, as far as its results file tells (it does not list the layer types)."""
    curves = SCALINGS[scaling].halves(scales)
    return tuple(layer for layer in range(len(curves[0])) if all(curve[layer] == 1.0 for curve in curves))


def _model_args(value) -> dict[str, Any]:
    """lm-eval's record of ``--model_args``: a dict, or the ``k=v,k=v`` text."""
    if isinstance(value, Mapping):
        return dict(value)
    pairs = (part.split("=", 1) for part in str(value or "").split(",") if "=" in part)
    return {key.strip(): text.strip() for key, text in pairs}


def suite_tasks(methods: Sequence[Method], group: str, default: Sequence[str]) -> tuple[str, ...]:
    """The subtasks of suite ``group`` as the results list them (lm-eval's ``group_subtasks``), else ``default``."""
    for method in methods:
        if method.suites.get(group):
            return tuple(method.suites[group])
    return tuple(default)


def load_methods(sources: Sequence[str]) -> list[Method]:
    """One method per name; a source without ``METHOD=`` is named after its folder or file."""
    methods: dict[str, Method] = {}
    for source in sources:
        name, path = split_named_path(source)
        path = Path(path)
        for file in result_files(path):
            method_name = name or (path.name if path.is_dir() else file.stem)
            methods.setdefault(method_name, Method(method_name)).add(read_results(file), file)
    if not methods:
        raise ReportError("no results given; pass one or more [METHOD=]PATH arguments")
    for method in methods.values():
        method.check_parts()
    return list(methods.values())


def main_metric(method: Method, task: str) -> tuple[str, float] | None:
    """A task's headline metric (name, value): accuracy, exact match, F1, ZeroSCROLLS' ROUGE mean, else the first."""
    metrics = method.scores.get(task) or {}
    columns = headline_columns(metrics)
    if len(columns) == 1:
        return columns[0], metrics[columns[0]]
    if columns:
        return "rouge_gm", rouge_geometric_mean(metrics)
    return next(iter(metrics.items()), None)


def headline_columns(metrics) -> tuple[str, ...]:
    """The per-sample metrics a task's headline (:func:`main_metric`) is made from, in ``metrics``."""
    for name in ("accuracy", "acc", "exact_match", "f1"):
        if name in metrics:
            return (name,)
    if {"rouge1", "rouge2", "rougeL"} <= set(metrics):
        return ("rouge1", "rouge2", "rougeL")
    return ()


def rouge_geometric_mean(metrics: Mapping[str, float]) -> float:
    """ZeroSCROLLS' summary score: the geometric mean of ROUGE-1, -2 and -L."""
    values = [max(metrics[k], 0.0) for k in ("rouge1", "rouge2", "rougeL")]
    return (values[0] * values[1] * values[2]) ** (1 / 3)
