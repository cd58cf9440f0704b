"""``lpes-report``: lm-eval results JSON files (+ a search's ``history.jsonl``) -> ``report.md`` and PNGs.

    python -m lpes_harness.report vanilla=runs/vanilla lpes=runs/lpes --history search/history.jsonl --out results/

Each positional argument is ``[METHOD=]PATH``: a results JSON written by ``lm_eval
--output_path`` or a folder searched for ``results*.json``. Several files of one method
(e.g. one per suite) are merged. Without ``METHOD=`` the method is the given folder's name, or
the file's name.

Written into ``--out``:

- ``report.md``: paper-style tables (methods x tasks, in percent): position tasks by gold
  position, each cell with its 95 % Wilson interval (from lm-eval's sample counts) and, where
  the runs were made with ``--log_samples``, the difference from the baseline method (``vanilla``
  if given, else the first) with an exact McNemar p on the same samples; only a significant
  difference is bold. Then MMLU / C-Eval by category, L-Eval, ZeroSCROLLS (summaries scored by
  the geometric mean of ROUGE-1/2/L, as ZeroSCROLLS does; single-reference F1 marked with a
  dagger), and every other task's metrics; these are not tested, so nothing there is bold;
- ``position_<task>.png``: accuracy by gold position, one line per method;
- ``scales.png``: each method's layer scales (from ``config.lpes_scales`` in its results, the
  search's best individual, or ``--scales NAME=FILE``);
- ``search.png``: best and mean fitness and smoothness by generation (``--history``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lpes_harness import plots
from lpes_harness.analysis.logged_samples import logged_scores
from lpes_harness.analysis.stats import compare_paired, format_p, wilson_interval
from lpes_harness.analysis.search_history import (  # noqa: F401 (re-exported)
    ReportError,
    best_individual,
    history_by_generation,
    population_stats,
    read_history,
    smoothness,
)

POSITION_SUBTASK = re.compile(r"^(?P<group>.+)_pos(?P<percent>\d+)$")
# The suites' subtasks, in table order, for results that do not list them (no "group_subtasks").
LEVAL_TASKS = ("leval_coursera", "leval_quality", "leval_tpo", "leval_sci_fi")
LEVAL_COLUMNS = {"leval_coursera": "Coursera", "leval_quality": "QuALITY", "leval_tpo": "TOEFL", "leval_sci_fi": "SFiction"}
ZEROSCROLLS_TASKS = (
    "zeroscrolls_gov_report",
    "zeroscrolls_summ_screen_fd",
    "zeroscrolls_qmsum",
    "zeroscrolls_squality",
    "zeroscrolls_qasper",
    "zeroscrolls_narrative_qa",
    "zeroscrolls_quality",
)
CATEGORIES = ("stem", "humanities", "social_sciences", "other")
MULTIPLE_CHOICE_SUITES = ("mmlu_local", "mmlu_continuation_local", "ceval_local")
MULTIPLE_CHOICE_PREFIXES = tuple(f"{suite}_" for suite in MULTIPLE_CHOICE_SUITES)  # their subject tasks
# Metrics that are not scores: left out of the tables.
SKIPPED_METRICS = ("_stderr", "alias", "samples")
# A difference is bold when its paired test gives p below this.
ALPHA = 0.05
BASELINE = "vanilla"


# ---------------------------------------------------------------- reading


def parse_source(text: str) -> tuple[str | None, Path]:
    method, sep, path = text.partition("=")
    if not sep or os.sep in method or not method:
        return None, Path(text)
    return method, Path(path)


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
        self.samples: dict[str, dict[int, float]] = {}  # task -> doc_id -> score (--log_samples)

    def add(self, data: Mapping[str, Any], file: Path | None = None) -> None:
        for task, entry in data["results"].items():
            metrics = self.scores.setdefault(task, {})
            for key, value in entry.items():
                if not isinstance(value, (int, float)) or isinstance(value, bool) or any(s in key for s in SKIPPED_METRICS):
                    continue
                metrics[key.split(",")[0]] = float(value)
        for group, subtasks in (data.get("group_subtasks") or {}).items():
            if subtasks:
                self.suites.setdefault(group, list(subtasks))
        for task, config in (data.get("configs") or {}).items():
            self.task_metadata[task] = config.get("metadata") or {}
        scales = (data.get("config") or {}).get("lpes_scales")
        if scales:
            self.scales = [float(s) for s in scales]
        for task, counts in (data.get("n-samples") or {}).items():
            count = (counts or {}).get("effective", (counts or {}).get("original"))
            if isinstance(count, int) and count > 0:
                self.counts[task] = count
        if file is not None:
            metrics = {t: m[0] for t in data["results"] if POSITION_SUBTASK.match(t) and (m := main_metric(self, t))}
            # Multiple-choice subjects too (a group has no samples file, so only subjects are read):
            # "within a point of vanilla" needs a paired interval over the same questions.
            metrics.update({t: "acc" for t in data["results"] if t.startswith(MULTIPLE_CHOICE_PREFIXES)})
            self.samples.update(logged_scores(file, metrics))

    def get(self, task: str, metric: str) -> float | None:
        return self.scores.get(task, {}).get(metric)


def suite_tasks(methods: Sequence[Method], group: str, default: Sequence[str]) -> tuple[str, ...]:
    """The subtasks of suite ``group`` as the results list them (lm-eval's ``group_subtasks``), else ``default``."""
    for method in methods:
        if method.suites.get(group):
            return tuple(method.suites[group])
    return tuple(default)


def load_methods(sources: Sequence[str]) -> list[Method]:
    methods: dict[str, Method] = {}
    for source in sources:
        name, path = parse_source(source)
        for file in result_files(path):
            method_name = name or (path.name if path.is_dir() else file.stem)
            methods.setdefault(method_name, Method(method_name)).add(read_results(file), file)
    if not methods:
        raise ReportError("no results given; pass one or more [METHOD=]PATH arguments")
    return list(methods.values())


# ---------------------------------------------------------------- tables


def percent(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def markdown_table(header: Sequence[str], rows: Sequence[tuple[str, Sequence[float | None]]]) -> str:
    """Methods as rows, values in percent. Nothing is bold: these tables carry no test of a difference."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [f"| {name} | " + " | ".join(percent(v) for v in values) + " |" for name, values in rows]
    return "\n".join(lines)


def position_groups(methods: Sequence[Method]) -> dict[str, list[int]]:
    """Position task -> its gold percents, found from ``<task>_pos<percent>`` subtasks."""
    groups: dict[str, set[int]] = {}
    for method in methods:
        for task in method.scores:
            match = POSITION_SUBTASK.match(task)
            if match:
                groups.setdefault(match["group"], set()).add(int(match["percent"]))
    return {group: sorted(percents) for group, percents in sorted(groups.items())}


def main_metric(method: Method, task: str) -> tuple[str, float] | None:
    metrics = method.scores.get(task) or {}
    for name in ("accuracy", "acc", "exact_match", "f1"):
        if name in metrics:
            return name, metrics[name]
    if {"rouge1", "rouge2", "rougeL"} <= set(metrics):
        return "rouge_gm", rouge_geometric_mean(metrics)
    return next(iter(metrics.items()), None)


def rouge_geometric_mean(metrics: Mapping[str, float]) -> float:
    """ZeroSCROLLS' summary score: the geometric mean of ROUGE-1, -2 and -L."""
    values = [max(metrics[k], 0.0) for k in ("rouge1", "rouge2", "rougeL")]
    return (values[0] * values[1] * values[2]) ** (1 / 3)


def baseline_method(methods: Sequence[Method]) -> Method:
    """The method every other is tested against: ``vanilla`` if given, else the first."""
    return next((m for m in methods if m.name == BASELINE), methods[0])


def _interval_text(value: float, count: int | None) -> str:
    # Position tasks score each sample 0/1, so accuracy x n is the number correct.
    if not count:
        return percent(value)
    low, high = wilson_interval(round(value * count), count)
    return f"{percent(value)} [{percent(low)}, {percent(high)}]"


def _tested_cell(text: str, mine: Mapping, base: Mapping) -> str | None:
    """``text`` with a second line of the paired test against the baseline (bold if significant); None if untestable."""
    common = sorted(set(mine) & set(base))
    if not common:
        return None
    try:
        test = compare_paired([mine[k] for k in common], [base[k] for k in common])
    except ValueError:  # a score that is not 0/1: no McNemar
        return None
    sign = "+" if test["difference"] >= 0 else "−"
    cell = f"{text}<br>{sign}{abs(test['difference']) * 100:.1f}, +{test['gained']}/−{test['lost']}, p={format_p(test['p'])}"
    return f"**{cell}**" if test["p"] < ALPHA else cell


def position_section(methods: Sequence[Method], group: str, percents: Sequence[int]) -> str:
    """Accuracy [95 % interval] by gold position; with logged samples, a paired test against the baseline."""
    baseline = baseline_method(methods)
    tasks = [f"{group}_pos{p}" for p in percents]
    header = ["method", *[f"{p}%" for p in percents], "avg"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    tested = False
    for method in methods:
        cells = []
        values = [None if (v := main_metric(method, t)) is None else v[1] for t in tasks]
        for task, value in zip(tasks, values):
            if value is None:
                cells.append(percent(None))
                continue
            text = _interval_text(value, method.counts.get(task))
            cell = None
            if method is not baseline and task in method.samples and task in baseline.samples:
                cell = _tested_cell(text, method.samples[task], baseline.samples[task])
            tested = tested or cell is not None
            cells.append(cell or text)
        cells.append(_average_cell(method, baseline, tasks, values))
        lines.append(f"| {method.name} | " + " | ".join(cells) + " |")
    if tested:
        note = (f"[..]: 95 % Wilson interval. Second line: difference from `{baseline.name}` in points, samples "
                f"gained/lost and exact McNemar p, on the same samples (lm-eval's `--log_samples` files); "
                f"bold: p < {ALPHA}. The average pools every position's samples.")
    else:
        note = ("[..]: 95 % Wilson interval. No per-sample logs were found next to the results (run `lm_eval` "
                "with `--log_samples`), so no difference is tested and nothing is bold.")
    return f"### {group}: accuracy by gold position\n\n" + "\n".join(lines) + f"\n\n{note}\n\n![{group}](position_{group}.png)\n"


def _average_cell(method: Method, baseline: Method, tasks: Sequence[str], values: Sequence[float | None]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return percent(None)
    average = sum(present) / len(present)
    counts = [method.counts.get(t) for t in tasks]
    # Pooled over positions; an interval only when every position has the same count (then
    # the pooled accuracy is the average).
    text = percent(average)
    if len(present) == len(values) and counts[0] and len(set(counts)) == 1:
        text = _interval_text(average, counts[0] * len(tasks))
    if method is not baseline and all(t in method.samples and t in baseline.samples for t in tasks):
        mine = {(t, k): v for t in tasks for k, v in method.samples[t].items()}
        base = {(t, k): v for t in tasks for k, v in baseline.samples[t].items()}
        text = _tested_cell(text, mine, base) or text
    return text


def multiple_choice_section(methods: Sequence[Method], suite: str, title: str) -> str | None:
    if not any(suite in m.scores or any(t.startswith(f"{suite}_") for t in m.scores) for m in methods):
        return None
    header = ["method", title, *[c.replace("_", " ") for c in CATEGORIES]]
    rows = []
    for method in methods:
        tasks = [suite, *[f"{suite}_{c}" for c in CATEGORIES]]
        rows.append((method.name, [method.get(t, "acc") for t in tasks]))
    return f"### {title} (acc, %)\n\n" + markdown_table(header, rows) + "\n" + multiple_choice_tests(methods, suite)


def multiple_choice_tests(methods: Sequence[Method], suite: str) -> str:
    """Each method against the baseline on the questions both answered, pooled over subjects (``--log_samples``)."""
    baseline = baseline_method(methods)
    mine = {m.name: {(t, k): v for t, doc in m.samples.items() if t.startswith(f"{suite}_") for k, v in doc.items()}
            for m in methods}
    lines = []
    for method in methods:
        common = sorted(mine[method.name].keys() & mine[baseline.name].keys())
        if method is baseline or not common:
            continue
        test = compare_paired([mine[method.name][k] for k in common], [mine[baseline.name][k] for k in common])
        low, high = (100 * v for v in test["difference_interval"])
        subjects = len({task for task, _ in common})
        lines.append(f"- {method.name}: {100 * test['accuracy']:.1f} against {100 * test['baseline_accuracy']:.1f}, "
                     f"{100 * test['difference']:+.1f} points [{low:+.1f}, {high:+.1f}], +{test['gained']}/−{test['lost']}, "
                     f"exact McNemar p = {format_p(test['p'])} ({test['n']} questions, {subjects} subjects)")
    if not lines:
        return ""
    return (f"\nPaired with `{baseline.name}` on the same questions (lm-eval's `--log_samples` files), pooled over "
            f"subjects; [..]: 95 % interval of the difference (Wald, paired):\n\n" + "\n".join(lines) + "\n")


def leval_section(methods: Sequence[Method]) -> str | None:
    tasks = suite_tasks(methods, "leval", LEVAL_TASKS)
    if not any(any(t in m.scores for t in tasks) for m in methods):
        return None
    header = ["method", *[LEVAL_COLUMNS.get(t, t.removeprefix("leval_")) for t in tasks], "avg"]
    rows = []
    for method in methods:
        values = [method.get(t, "exact_match") for t in tasks]
        present = [v for v in values if v is not None]
        rows.append((method.name, [*values, sum(present) / len(present) if len(present) == len(values) else None]))
    note = "Exact match in %, L-Eval's scoring (Coursera: 0.25 for a proper subset of the correct options; SFiction: mean of loyalty and fact)."
    return "### L-Eval (closed-ended)\n\n" + markdown_table(header, rows) + f"\n\n{note}\n"


def zeroscrolls_section(methods: Sequence[Method]) -> str | None:
    tasks = suite_tasks(methods, "zeroscrolls", ZEROSCROLLS_TASKS)
    if not any(any(t in m.scores for t in tasks) for m in methods):
        return None
    single_reference = set()
    for method in methods:
        single_reference |= {t for t, meta in method.task_metadata.items() if meta.get("single_reference")}
    names = []
    for task in tasks:
        short = task.removeprefix("zeroscrolls_")
        names.append(short + ("†" if task in single_reference or short in ("qasper", "narrative_qa") else ""))
    header = ["method", *names, "avg"]
    rows = []
    for method in methods:
        values = [None if main_metric(method, t) is None else main_metric(method, t)[1] for t in tasks]
        present = [v for v in values if v is not None]
        rows.append((method.name, [*values, sum(present) / len(present) if len(present) == len(values) else None]))
    note = (
        "Summaries (gov_report, summ_screen_fd, qmsum, squality): geometric mean of ROUGE-1/2/L F1; "
        "qasper, narrative_qa: token F1; quality: accuracy; all in %. "
        "† single reference per question (the local files keep one): not comparable to the official multi-reference scores."
    )
    return "### ZeroSCROLLS (validation)\n\n" + markdown_table(header, rows) + f"\n\n{note}\n"


def covered_tasks(methods: Sequence[Method], groups: Mapping[str, Sequence[int]]) -> set[str]:
    covered = {"leval", "zeroscrolls"}
    covered |= set(suite_tasks(methods, "leval", LEVAL_TASKS)) | set(suite_tasks(methods, "zeroscrolls", ZEROSCROLLS_TASKS))
    for group, percents in groups.items():
        covered |= {group, *(f"{group}_pos{p}" for p in percents)}
    for method in methods:
        covered |= {t for t in method.scores if t.startswith(MULTIPLE_CHOICE_SUITES)}
    return covered


def other_section(methods: Sequence[Method], covered: set[str]) -> str | None:
    rows = []
    for task in sorted({t for m in methods for t in m.scores} - covered):
        for metric in sorted({k for m in methods for k in m.scores.get(task, {})}):
            rows.append((f"{task} / {metric}", [m.get(task, metric) for m in methods]))
    if not rows:
        return None
    header = ["task / metric", *[m.name for m in methods]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [f"| {name} | " + " | ".join(percent(v) for v in values) + " |" for name, values in rows]
    return "### Other tasks (%)\n\n" + "\n".join(lines) + "\n"


def search_section(rows: Sequence[Mapping[str, float]], best: Mapping[str, Any]) -> str:
    lines = ["| generation | best fitness | mean fitness | best smoothness | mean smoothness |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['generation']} | {row['best_fitness']:.4f} | {row['mean_fitness']:.4f} | "
            f"{row['best_smoothness']:.4f} | {row['mean_smoothness']:.4f} |"
        )
    accuracy = best.get("accuracy") or {}
    best_line = f"Best individual: generation {best['generation']}, fitness {float(best['fitness']):.4f}"
    if accuracy:
        best_line += ", accuracy " + ", ".join(f"{k} {percent(float(v))}" for k, v in accuracy.items())
    if best.get("genome") is not None:
        best_line += f", control points {best['genome']}"
    return "### Search\n\n" + "\n".join(lines) + f"\n\n{best_line}.\n\n![search](search.png)\n"


# ---------------------------------------------------------------- the report


def read_scales_argument(text: str) -> tuple[str, list[float]]:
    name, sep, path = text.partition("=")
    if not sep:
        raise ReportError(f"--scales {text!r}: expected NAME=FILE (a JSON list or a scales file)")
    from lpes_harness.scales_file import read_scales_file

    return name, [float(s) for s in read_scales_file(path)]


def write_report(
    sources: Sequence[str],
    out: str | os.PathLike,
    history: str | os.PathLike | None = None,
    scales: Sequence[str] = (),
    title: str = "LPES report",
) -> Path:
    """Build ``report.md`` and the PNGs in ``out``; returns the report's path."""
    out = Path(out)
    # Every input is read before anything is written: a bad input leaves no folder behind.
    methods = load_methods(sources)
    records = read_history(history) if history is not None else None
    extra_curves = [read_scales_argument(text) for text in scales]
    out.mkdir(parents=True, exist_ok=True)
    sections = [f"# {title}\n", "Methods: " + ", ".join(f"`{m.name}`" for m in methods) + ".\n"]

    groups = position_groups(methods)
    if groups:
        sections.append("## Position bias\n")
        for group, percents in groups.items():
            sections.append(position_section(methods, group, percents))
            series = {m.name: [(p, v[1]) for p in percents if (v := main_metric(m, f"{group}_pos{p}")) is not None]
                      for m in methods}
            plots.plot_positions(series, group, out / f"position_{group}.png")

    general = [s for s in (multiple_choice_section(methods, "mmlu_local", "MMLU, 5-shot"),
                           multiple_choice_section(methods, "mmlu_continuation_local", "MMLU continuation, 0-shot"),
                           multiple_choice_section(methods, "ceval_local", "C-Eval, 5-shot")) if s]
    if general:
        sections += ["## General ability\n", *general]
    long_context = [s for s in (leval_section(methods), zeroscrolls_section(methods)) if s]
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lpes-report", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="[METHOD=]PATH: an lm-eval results JSON file or a folder of them")
    parser.add_argument("--out", default="report", help="output folder (default: ./report)")
    parser.add_argument("--history", default=None, help="a search's history.jsonl: fitness and smoothness by generation")
    parser.add_argument("--scales", action="append", default=[], help="NAME=FILE: another scales curve to plot (repeatable)")
    parser.add_argument("--title", default="LPES report")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.results, args.out, args.history, args.scales, args.title)
    except (ReportError, OSError, ValueError) as err:  # ValueError: a malformed scales file
        parser.error(str(err))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
