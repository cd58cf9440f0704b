"""The report's tables, rendered as markdown from the methods' results (:mod:`.results_files`).

Methods are rows, values in percent. Position tasks get a 95 % Wilson interval per cell and,
where both runs logged samples, the difference from the baseline method (``--baseline``, else ``vanilla`` if given,
else the first) with an exact McNemar p on the same samples: only a significant difference is
bold. MMLU and C-Eval are paired over their questions below their tables (Wald interval, exact
McNemar), L-Eval and ZeroSCROLLS over theirs with a paired bootstrap interval and a paired
permutation p (their scores are partial credit and ROUGE, not 0/1); the tables themselves, and
any other task's, test nothing, so nothing there is bold. The suites' task lists come from :mod:`lpes_harness.tasks.suites`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lpes_harness.evaluation.results_files import (
    MULTIPLE_CHOICE_SUITES,
    POSITION_SUBTASK,
    Method,
    headline_columns,
    main_metric,
    suite_tasks,
)
from lpes_harness.evaluation.search_history import ReportError
from lpes_harness.evaluation.stats import (
    RESAMPLES,
    compare_paired,
    compare_paired_resampled,
    format_p,
    geometric_mean_score,
    mean_score,
    wilson_interval,
)
from lpes_harness.tasks.suites import leval, zeroscrolls

# The suites' subtasks, in table order, for results that do not list them (no "group_subtasks").
LEVAL_TASKS = tuple(leval.TASKS)
LEVAL_COLUMNS = {"leval_coursera": "Coursera", "leval_quality": "QuALITY", "leval_tpo": "TOEFL", "leval_sci_fi": "SFiction"}
ZEROSCROLLS_TASKS = tuple(zeroscrolls.task_name(task) for task in zeroscrolls.TASKS)
# The four categories of the MMLU and C-Eval groups (from the suites' mapping.json), in table order.
CATEGORIES = ("stem", "humanities", "social_sciences", "other")
# A difference is bold when its paired test gives p below this.
ALPHA = 0.05
BASELINE = "vanilla"


def percent(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def markdown_table(header: Sequence[str], rows: Sequence[tuple[str, Sequence[float | None]]]) -> str:
    """Methods as rows, values in percent. Nothing is bold: these tables carry no test of a difference."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [f"| {name} | " + " | ".join(percent(v) for v in values) + " |" for name, values in rows]
    return "\n".join(lines)


def methods_section(methods: Sequence[Method]) -> str:
    """The report's list of methods: each one's name, and what it is by the table of methods
    (:data:`lpes_harness.methods.METHODS`: its label and description) where its runs were one of ours."""
    lines = ["Methods:", ""]
    for method in methods:
        entry, model = method.entry, f" (`{method.model}`)" if method.model else ""
        if method.is_plain:  # vanilla through lpes_hf is no LPES run, whatever model ran it
            lines.append(f"- `{method.name}`: the plain model{model}" + ("" if method.model == "hf" else ", every factor 1"))
            continue
        lines.append(f"- `{method.name}`" + (f": {entry.label}{model}, {entry.description}" if entry else model))
    return "\n".join(lines) + "\n"


def position_groups(methods: Sequence[Method]) -> dict[str, list[int]]:
    """Position task -> its gold percents, found from ``<task>_pos<percent>`` subtasks."""
    groups: dict[str, set[int]] = {}
    for method in methods:
        for task in method.scores:
            match = POSITION_SUBTASK.match(task)
            if match:
                groups.setdefault(match["group"], set()).add(int(match["percent"]))
    return {group: sorted(percents) for group, percents in sorted(groups.items())}


def baseline_method(methods: Sequence[Method], name: str | None = None) -> Method:
    """The method every other is tested against: ``name`` (``lpes-report --baseline``), else
    ``vanilla`` if given, else the first."""
    if name is not None:
        found = next((m for m in methods if m.name == name), None)
        if found is None:
            raise ReportError(f"--baseline {name!r} is not among the methods {', '.join(m.name for m in methods)}")
        return found
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
    low, high = test["difference_interval"]
    cell = (f"{text}<br>{_points(test['difference'])} [{_points(low)}, {_points(high)}], "
            f"+{test['gained']}/−{test['lost']}, p={format_p(test['p'])}")
    return f"**{cell}**" if test["p"] < ALPHA else cell


def _points(fraction: float) -> str:
    # a signed difference in points, with a true minus sign as in the rest of the tables
    return f"{'+' if fraction >= 0 else '−'}{abs(fraction) * 100:.1f}"


def position_section(methods: Sequence[Method], group: str, percents: Sequence[int], baseline: str | None = None) -> str:
    """Accuracy [95 % interval] by gold position; with logged samples, a paired test against the baseline."""
    baseline = baseline_method(methods, baseline)
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
        note = (f"[..]: 95 % Wilson interval. Second line: difference from `{baseline.name}` in points with its "
                f"95 % interval (paired, Wald), samples gained/lost and exact McNemar p, on the same samples "
                f"(lm-eval's `--log_samples` files, or a kept record's `per_sample.json`); "
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


def multiple_choice_section(methods: Sequence[Method], suite: str, title: str, baseline: str | None = None) -> str | None:
    if not any(suite in m.scores or any(t.startswith(f"{suite}_") for t in m.scores) for m in methods):
        return None
    header = ["method", title, *[c.replace("_", " ") for c in CATEGORIES]]
    rows = []
    for method in methods:
        tasks = [suite, *[f"{suite}_{c}" for c in CATEGORIES]]
        rows.append((method.name, [method.get(t, "acc") for t in tasks]))
    return f"### {title} (acc, %)\n\n" + markdown_table(header, rows) + "\n" + multiple_choice_tests(methods, suite, baseline)


def multiple_choice_tests(methods: Sequence[Method], suite: str, baseline: str | None = None) -> str:
    """Each method against the baseline on the questions both answered, pooled over subjects (``--log_samples``)."""
    baseline = baseline_method(methods, baseline)
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


def long_context_tests(methods: Sequence[Method], tasks: Sequence[str], columns: Sequence[str],
                       baseline: str | None = None) -> str:
    """Each method against the baseline on the samples both logged: per task and for the tasks' average."""
    baseline = baseline_method(methods, baseline)
    rows = []
    for method in methods:
        if method is baseline:
            continue
        strata = {task: stratum for task in tasks if (stratum := _paired_stratum(method, baseline, task)) is not None}
        if not strata:
            continue
        cells = [_resampled_cell([strata[task]]) if task in strata else "–" for task in tasks]
        rows.append(f"| {method.name} | " + " | ".join(
            [*cells, _resampled_cell(list(strata.values())) if len(strata) == len(tasks) else "–"]) + " |")
    if not rows:
        return ""
    return (f"\nPaired with `{baseline.name}` on the same samples (lm-eval's `--log_samples` files): the difference in "
            f"points, its 95 % paired bootstrap interval (samples drawn again within each task, {RESAMPLES:,} times), "
            f"samples scored higher / lower, paired permutation p; avg: the tasks' average, as above:\n\n"
            + "| method | " + " | ".join([*columns, "avg"]) + " |\n|---|" + "---|" * (len(columns) + 1) + "\n"
            + "\n".join(rows) + "\n")


def _paired_stratum(method: Method, baseline: Method, task: str):
    """One task's rows of both methods on their common samples, and the task's score; None if not both logged it."""
    mine, theirs = method.records.get(task) or {}, baseline.records.get(task) or {}
    common = sorted(mine.keys() & theirs.keys())
    columns = headline_columns(mine[common[0]]) if common else ()
    if not columns:
        return None
    try:
        rows = [[[float(records[doc][c]) for c in columns] for doc in common] for records in (mine, theirs)]
    except (KeyError, TypeError, ValueError):
        raise ReportError(f"{task}: a logged sample of {method.name!r} or {baseline.name!r} lacks a numeric "
                          f"{'/'.join(columns)}") from None
    return rows[0], rows[1], mean_score if len(columns) == 1 else geometric_mean_score


def _resampled_cell(strata) -> str:
    test = compare_paired_resampled(strata)
    low, high = test["difference_interval"]
    text = (f"{_points(test['difference'])} [{_points(low)}, {_points(high)}], "
            f"{test['better']} / {test['worse']}, p = {format_p(test['p'])}")
    return f"**{text}**" if test["p"] < ALPHA else text


def leval_section(methods: Sequence[Method], baseline: str | None = None) -> str | None:
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
    tests = long_context_tests(methods, tasks, header[1:-1], baseline)
    return "### L-Eval (closed-ended)\n\n" + markdown_table(header, rows) + f"\n\n{note}\n" + tests


def zeroscrolls_section(methods: Sequence[Method], baseline: str | None = None) -> str | None:
    tasks = suite_tasks(methods, "zeroscrolls", ZEROSCROLLS_TASKS)
    if not any(any(t in m.scores for t in tasks) for m in methods):
        return None
    single_reference = set()
    for method in methods:
        single_reference |= {t for t, meta in method.task_metadata.items() if meta.get("single_reference")}
    names = []
    for task in tasks:
        short = task.removeprefix("zeroscrolls_")
        names.append(short + ("†" if task in single_reference or short in zeroscrolls.SINGLE_REFERENCE_TASKS else ""))
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
    tests = long_context_tests(methods, tasks, names, baseline)
    return "### ZeroSCROLLS (validation)\n\n" + markdown_table(header, rows) + f"\n\n{note}\n" + tests


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
