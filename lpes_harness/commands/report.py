"""``lpes-report``: lm-eval results JSON files (+ a search's ``history.jsonl``) -> ``report.md`` and PNGs.

    python -m lpes_harness.commands.report vanilla=runs/vanilla lpes=runs/lpes --history search/history.jsonl --out results/

Each positional argument is ``[METHOD=]PATH``: a results JSON written by ``lm_eval
--output_path`` or a folder searched for ``results*.json``. Several files of one method
(e.g. one per suite) are merged; a task run in parts over different documents (``lm_eval
--samples``, e.g. the rest of a ``--limit`` run) is joined from its logged samples. Without ``METHOD=`` the method is the given folder's name, or
the file's name.

Written into ``--out``:

- ``report.md``: the methods, each with its label and description from the table of methods
  (:data:`lpes_harness.methods.METHODS`) where lm-eval ran one of ours; paper-style tables (methods x tasks, in percent): position tasks by gold
  position, each cell with its 95 % Wilson interval (from lm-eval's sample counts) and, where
  the runs were made with ``--log_samples``, the difference from the baseline method (``vanilla``
  if given, else the first) with an exact McNemar p on the same samples; only a significant
  difference is bold. Then MMLU / C-Eval by category, L-Eval, ZeroSCROLLS (summaries scored by
  the geometric mean of ROUGE-1/2/L, as ZeroSCROLLS does; single-reference F1 marked with a
  dagger), and every other task's metrics; these are not tested, so nothing there is bold;
- ``position_<task>.png``: accuracy by gold position, one line per method;
- ``scales.png``: each method's layer scales (from ``config.lpes_scales`` in its results, the
  search's best individual, or ``--scales NAME=FILE``);
- ``search.png``: best and mean fitness and smoothness by generation (``--history``);
- with ``--keep-samples``, what a committed record needs to be re-checked without the run's
  output folder: each method's results file(s) as ``results_<method>[_<n>].json``, and
  ``per_sample.json`` (method -> subtask -> doc_id -> metrics, doc hash and answer; the prompts,
  which the tasks regenerate, left out).

Reading the results is :mod:`lpes_harness.evaluation.results_files`, the tables are
:mod:`lpes_harness.evaluation.report_tables`; this module writes the report and is the command line.
"""

from __future__ import annotations

import argparse
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
    from lpes_harness.core.scaling import split_both

    scales, scaling = read_scales_and_scaling(path)
    if scaling == "both":
        return list(zip((f"{name} position", f"{name} base"), split_both(scales)))
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lpes-report", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="[METHOD=]PATH: an lm-eval results JSON file or a folder of them")
    parser.add_argument("--out", default="report", help="output folder (default: ./report)")
    parser.add_argument("--history", default=None, help="a search's history.jsonl: fitness and smoothness by generation")
    parser.add_argument("--scales", action="append", default=[], help="NAME=FILE: another scales curve to plot (repeatable)")
    parser.add_argument("--title", default="LPES report")
    parser.add_argument("--baseline", default=None, metavar="METHOD",
                        help="the method every other is tested against (default: vanilla if given, else the first), "
                             "e.g. a PI or tuned-baseline row to test a curve against it on the same samples")
    parser.add_argument("--keep-samples", action="store_true",
                        help="also copy each method's results file(s) and write per_sample.json (metrics, doc hash "
                             "and answer per logged sample) into --out, for a record that outlives the run's folder")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.results, args.out, args.history, args.scales, args.title, args.keep_samples, args.baseline)
    except (ReportError, OSError, ValueError) as err:  # ValueError: a malformed scales file
        parser.error(str(err))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
