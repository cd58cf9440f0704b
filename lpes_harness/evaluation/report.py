"""``lpes-report``'s report: lm-eval results files (+ a search's history) read, ``report.md`` and the PNGs written.

:func:`write_report` reads every input first (:mod:`~lpes_harness.evaluation.results_files` for the
results, :mod:`~lpes_harness.evaluation.search_history` for the search, :func:`read_scales_argument`
for extra curves), so that a bad input leaves no folder behind; then it writes the sections of
:mod:`~lpes_harness.evaluation.report_tables`, the figures of :mod:`~lpes_harness.evaluation.plots` and,
with ``keep_samples``, what a committed record needs to be re-checked without the run's folder
(:func:`kept_record`). The command is ``lpes-report`` (:mod:`lpes_harness.commands.report`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from lpes_harness.evaluation import plots
from lpes_harness.evaluation.logged_samples import KEPT_SAMPLES
from lpes_harness.evaluation.report_tables import (
    baseline_method,
    covered_tasks,
    leval_section,
    methods_section,
    multiple_choice_section,
    other_section,
    position_groups,
    position_section,
    search_section,
    zeroscrolls_section,
)
from lpes_harness.evaluation.results_files import load_methods, main_metric
from lpes_harness.evaluation.search_history import (
    ReportError,
    best_individual,
    history_by_generation,
    population_stats,
    read_history,
)
from lpes_harness.core.files import atomic_write_json
from lpes_harness.core.named_path import require_named_path

def read_scales_argument(text: str) -> list[tuple[str, list[float]]]:
    """``--scales NAME=FILE``: its curve, or a ``both`` file's two (``NAME position``, ``NAME base``)."""
    name, path = require_named_path(text, "--scales", "NAME=FILE (a JSON list or a scales file)", ReportError)
    from lpes_harness.core.scales_file import read_scales_and_scaling
    from lpes_harness.core.scaling import scaling_of

    scales, scaling = read_scales_and_scaling(path)
    kind = scaling_of(scaling)
    if kind.paired:
        return [(f"{name} {axis}", curve) for axis, curve in zip(kind.axes, kind.halves(scales))]
    return [(name, scales)]


def write_report(
    sources: Sequence[str],
    out: str | os.PathLike,
    history: str | os.PathLike | None = None,
    scales: Sequence[str] = (),
    title: str = "LPES report",
    keep_samples: bool = False,
    baseline: str | None = None,
) -> Path:
    """Build ``report.md`` and the PNGs in ``out``; returns the report's path."""
    out = Path(out)
    # Every input is read before anything is written: a bad input leaves no folder behind.
    methods = load_methods(sources)
    records = read_history(history) if history is not None else None
    extra_curves = [curve for text in scales for curve in read_scales_argument(text)]
    if baseline is not None:
        baseline_method(methods, baseline)  # a name no method has stops here, before anything is written
    kept = kept_record(methods) if keep_samples else {}
    out.mkdir(parents=True, exist_ok=True)
    for name, content in kept.items():
        atomic_write_json(out / name, content, indent=1 if name == KEPT_SAMPLES else 2)
    sections = [f"# {title}\n", methods_section(methods)]

    groups = position_groups(methods)
    if groups:
        sections.append("## Position bias\n")
        for group, percents in groups.items():
            sections.append(position_section(methods, group, percents, baseline))
            series = {m.name: [(p, v[1]) for p in percents if (v := main_metric(m, f"{group}_pos{p}")) is not None]
                      for m in methods}
            plots.plot_positions(series, group, out / f"position_{group}.png")

    general = [s for s in (multiple_choice_section(methods, "mmlu_local", "MMLU, 5-shot", baseline),
                           multiple_choice_section(methods, "mmlu_continuation_local", "MMLU continuation, 0-shot", baseline),
                           multiple_choice_section(methods, "ceval_local", "C-Eval, 5-shot", baseline)) if s]
    if general:
        sections += ["## General ability\n", *general]
    long_context = [s for s in (leval_section(methods, baseline), zeroscrolls_section(methods, baseline)) if s]
    if long_context:
        sections += ["## Long context\n", *long_context]
    other = other_section(methods, covered_tasks(methods, groups))
    if other:
        sections.append(other)

    curves = {m.name: m.scales for m in methods if m.scales and any(s != 1.0 for s in m.scales)}
    if history is not None:
        rows = population_stats(Path(history).with_name("generations.jsonl")) or history_by_generation(records)
        best = best_individual(records)
        if best.get("scales"):
            curves.setdefault("search best", [float(s) for s in best["scales"]])
        sections.append(search_section(rows, best))
        plots.plot_search(rows, out / "search.png")
    for name, values in extra_curves:
        curves[name] = values
    if curves:
        plots.plot_scales(curves, out / "scales.png")
        sections.append("### Layer scales\n\n![scales](scales.png)\n")

    report = out / "report.md"
    tmp = report.with_name(report.name + ".tmp")
    tmp.write_text("\n".join(sections), encoding="utf-8")
    tmp.replace(report)
    return report


def kept_record(methods) -> dict[str, dict]:
    """``--keep-samples``: file name in ``--out`` -> content. Each method's results file(s), and
    ``per_sample.json`` (method -> subtask -> doc_id -> record) from the samples files beside them;
    each results file is read once, and all before anything is written. A task a method ran in parts
    (``lm_eval --samples``) keeps each part's results file and one joined set of samples."""
    from lpes_harness.evaluation.logged_samples import kept_stem, sample_records
    from lpes_harness.evaluation.results_files import read_results

    stems = {}
    for method in methods:
        other = stems.setdefault(kept_stem(method.name), method.name)
        if other != method.name:  # one would overwrite the other's results file
            raise ReportError(f"--keep-samples: methods {other!r} and {method.name!r} would both be kept as "
                              f"results_{kept_stem(method.name)}.json; rename one")
    files, per_sample = {}, {}
    for method in methods:
        stem = kept_stem(method.name)
        for index, file in enumerate(method.files):
            data = read_results(file)
            files[f"results_{stem}{f'_{index}' if len(method.files) > 1 else ''}.json"] = data
            for task, records in sample_records(file, data["results"]).items():  # a task run in parts: joined
                per_sample.setdefault(method.name, {}).setdefault(task, {}).update(records)
    for tasks in per_sample.values():
        for task, records in tasks.items():
            tasks[task] = dict(sorted(records.items(), key=lambda item: int(item[0])))
    return {**files, KEPT_SAMPLES: per_sample}
