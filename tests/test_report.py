"""lpes-report: results JSON files (method x task) and a search history -> report.md and PNG plots."""

import json

import pytest

from lpes_harness.commands import report as report_command
from lpes_harness.evaluation import report
from lpes_harness.evaluation import results_files
from lpes_harness.evaluation.search_history import ReportError, history_by_generation, population_stats, read_history

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _results(position, mmlu, leval_scores, zs_scores, scales=None):
    results = {f"kv_retrieval_pos{p}": {"alias": f"pos{p}", "accuracy,none": v, "accuracy_stderr,none": 0.01} for p, v in position.items()}
    results["mmlu_local"] = {"acc,none": mmlu}
    results["mmlu_local_stem"] = {"acc,none": mmlu - 0.1}
    for task, value in leval_scores.items():
        results[task] = {"exact_match,none": value}
    results["zeroscrolls_gov_report"] = {"rouge1,none": zs_scores[0], "rouge2,none": zs_scores[1], "rougeL,none": zs_scores[2]}
    results["zeroscrolls_qasper"] = {"f1,none": 0.3}
    results["custom_task"] = {"exact_match,none": 0.5}
    data = {
        "results": results,
        "configs": {"zeroscrolls_qasper": {"metadata": {"version": 1.0, "single_reference": True}}},
        "config": {"model": "lpes_hf"},
    }
    if scales:
        data["config"]["lpes_scales"] = scales
    return data


@pytest.fixture
def two_methods(tmp_path):
    vanilla = tmp_path / "runs" / "vanilla" / "model"
    lpes = tmp_path / "runs" / "lpes"
    vanilla.mkdir(parents=True)
    lpes.mkdir(parents=True)
    (vanilla / "results_2025.json").write_text(
        json.dumps(_results({0: 0.9, 50: 0.4, 100: 0.6}, 0.30, {"leval_coursera": 0.2, "leval_tpo": 0.5}, (0.2, 0.05, 0.15)))
    )
    (lpes / "lpes.json").write_text(
        json.dumps(_results({0: 0.8, 50: 0.7, 100: 0.7}, 0.31, {"leval_coursera": 0.3, "leval_tpo": 0.4}, (0.3, 0.1, 0.2), scales=[1.5, 1.2, 1.8]))
    )
    history = tmp_path / "history.jsonl"
    lines = [
        {"generation": 0, "genome": [[0, 1.5], [2, 1.2]], "scales": [1.5, 1.3, 1.2], "accuracy": {"begin": 0.9, "middle": 0.4, "end": 0.6}, "fitness": 0.5, "seconds": 3, "extra": 1},
        {"generation": 0, "genome": [[0, 1.0], [2, 2.0]], "scales": [1.0, 1.9, 1.1], "accuracy": {"begin": 0.7}, "fitness": 0.3, "seconds": 3},
        {"generation": 1, "genome": [[0, 1.6], [2, 1.4]], "scales": [1.6, 1.5, 1.4], "accuracy": {"begin": 0.8, "middle": 0.7, "end": 0.7}, "fitness": 0.7, "seconds": 3},
    ]
    history.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"generation": 2, "fit')  # killed mid-write
    return tmp_path, ["vanilla=" + str(tmp_path / "runs" / "vanilla"), str(lpes / "lpes.json")], history


def _row(text, first_cell):
    return next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))


def test_report_tables_show_each_method_per_task_without_untested_bold(two_methods):
    tmp_path, sources, history = two_methods
    path = report.write_report(sources, tmp_path / "out", history=history)
    text = path.read_text()
    # position table: percents as columns, the average last; no counts, no logs: bare values
    assert "| method | 0% | 50% | 100% | avg |" in text
    assert _row(text, "vanilla") == "| vanilla | 90.0 | 40.0 | 60.0 | 63.3 |"
    assert _row(text, "lpes") == "| lpes | 80.0 | 70.0 | 70.0 | 73.3 |"
    assert "no difference is tested and nothing is bold" in text
    assert "| lpes | 31.0 | 21.0 |" in text  # MMLU overall and STEM
    assert "| vanilla | 20.0 | – | 50.0 | – | – |" in text  # L-Eval: missing tasks shown as dashes
    # ZeroSCROLLS summary score is the geometric mean of ROUGE-1/2/L; qasper is flagged single-reference
    gm = (0.3 * 0.1 * 0.2) ** (1 / 3)
    assert f"| lpes | {100 * gm:.1f} |" in text and "qasper†" in text
    assert "| custom_task / exact_match | 50.0 | 50.0 |" in text
    assert "**" not in text


def _logged_run(folder, date, correct_by_percent):
    """An lm-eval output folder: results_<date>.json with n-samples, and one samples file per subtask."""
    folder.mkdir(parents=True)
    results, counts = {}, {}
    for percent, correct in correct_by_percent.items():
        task = f"multi_needle_pos{percent}"
        results[task] = {"acc,none": sum(correct) / len(correct), "acc_stderr,none": "N/A"}
        counts[task] = {"original": len(correct), "effective": len(correct)}
        lines = [json.dumps({"doc_id": i, "acc": float(c), "metrics": ["acc"], "filter": "none"}) for i, c in enumerate(correct)]
        # lm-eval writes samples in any order: pairing is by doc_id
        (folder / f"samples_{task}_{date}.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    (folder / f"results_{date}.json").write_text(json.dumps({"results": results, "n-samples": counts}))


def test_position_table_has_wilson_intervals_and_paired_tests_from_logged_samples(tmp_path):
    from lpes_harness.evaluation.stats import format_p, mcnemar_exact, paired_difference_interval, wilson_interval

    # 40 samples per position. At 50 %: 18 gained, 2 lost (significant); at 0 %: 3 gained, 1 lost.
    vanilla_50 = [0] * 20 + [1] * 20
    lpes_50 = [1] * 18 + [0] * 2 + [0] * 2 + [1] * 18
    vanilla_0 = [1] * 36 + [0] * 4
    lpes_0 = [1] * 35 + [0] + [1] * 3 + [0]
    _logged_run(tmp_path / "lpes", "2026-01-01T00-00-00.1", {0: lpes_0, 50: lpes_50})
    _logged_run(tmp_path / "vanilla", "2026-01-02T00-00-00.2", {0: vanilla_0, 50: vanilla_50})
    # the baseline is vanilla although it is given second
    text = report.write_report([f"lpes={tmp_path / 'lpes'}", f"vanilla={tmp_path / 'vanilla'}"], tmp_path / "out").read_text()

    low, high = wilson_interval(20, 40)
    assert _row(text, "vanilla").startswith(f"| vanilla | 90.0 [{100 * wilson_interval(36, 40)[0]:.1f}, ")
    assert f"| 50.0 [{100 * low:.1f}, {100 * high:.1f}] |" in _row(text, "vanilla")
    cells = _row(text, "lpes").split(" | ")

    def difference(gained, lost, n):  # the paired difference's 95 % interval, as the cell prints it
        low, high = (100 * v for v in paired_difference_interval(gained, lost, n))
        return f"[{'+' if low >= 0 else '−'}{abs(low):.1f}, {'+' if high >= 0 else '−'}{abs(high):.1f}]"

    assert cells[1] == (f"95.0 [{100 * wilson_interval(38, 40)[0]:.1f}, {100 * wilson_interval(38, 40)[1]:.1f}]"
                        f"<br>+5.0 {difference(3, 1, 40)}, +3/−1, p={format_p(mcnemar_exact(3, 1))}")
    assert difference(3, 1, 40).startswith("[−")  # 2 net of 40 is not a sure gain: the interval crosses 0
    assert cells[2].startswith("**90.0 [") and cells[2].endswith(
        f"+40.0 {difference(18, 2, 40)}, +18/−2, p={format_p(mcnemar_exact(18, 2))}**")
    # the average pools both positions' 80 samples: 21 gained, 3 lost
    assert cells[3].startswith("**92.5 [") and f"+22.5 {difference(21, 3, 80)}, +21/−3, p={format_p(mcnemar_exact(21, 3))}**" in cells[3]
    assert "on the same samples" in text and "bold: p < 0.05" in text and "with its 95 % interval" in text


def test_mmlu_is_paired_over_the_same_questions_pooled_over_subjects(tmp_path):
    from lpes_harness.evaluation.stats import format_p, mcnemar_exact, paired_difference_interval

    def run(folder, date, by_subject):
        folder.mkdir(parents=True)
        results = {"mmlu_local": {"acc,none": 0.0}}
        for subject, correct in by_subject.items():
            task = f"mmlu_local_{subject}"
            results[task] = {"acc,none": sum(correct) / len(correct)}
            lines = [json.dumps({"doc_id": i, "acc": float(c)}) for i, c in enumerate(correct)]
            (folder / f"samples_{task}_{date}.jsonl").write_text("\n".join(lines) + "\n")
        (folder / f"results_{date}.json").write_text(json.dumps({"results": results}))

    # astronomy: 3 gained, 1 lost of 10; anatomy: 0 gained, 4 lost of 10 -> pooled 3 / 5 of 20
    run(tmp_path / "vanilla", "2026-01-01T00-00-00.1", {"astronomy": [0, 0, 0, 1] + [1] * 6, "anatomy": [1] * 4 + [0] * 6})
    run(tmp_path / "lpes", "2026-01-01T00-00-00.2", {"astronomy": [1, 1, 1, 0] + [1] * 6, "anatomy": [0] * 10})
    text = report.write_report([f"vanilla={tmp_path / 'vanilla'}", f"LPES={tmp_path / 'lpes'}"], tmp_path / "out").read_text()
    low, high = paired_difference_interval(3, 5, 20)
    line = next(line for line in text.splitlines() if line.startswith("- LPES:"))
    assert line == (f"- LPES: 45.0 against 55.0, -10.0 points [{100 * low:+.1f}, {100 * high:+.1f}], +3/−5, "
                    f"exact McNemar p = {format_p(mcnemar_exact(3, 5))} (20 questions, 2 subjects)")
    assert "Paired with `vanilla` on the same questions" in text
    assert "- vanilla:" not in text


def test_leval_and_zeroscrolls_are_paired_over_their_samples_per_task_and_on_average(tmp_path):
    import numpy as np

    from lpes_harness.evaluation.stats import compare_paired_resampled, format_p, geometric_mean_score, mean_score

    def run(folder, date, by_task):
        folder.mkdir(parents=True)
        results = {}
        for task, rows in by_task.items():
            names = list(rows[0])
            results[task] = {f"{name},none": float(np.mean([row[name] for row in rows])) for name in names}
            lines = [json.dumps({"doc_id": i, **row, "metrics": names, "filtered_resps": ["A"]}) for i, row in enumerate(rows)]
            (folder / f"samples_{task}_{date}.jsonl").write_text("\n".join(reversed(lines)) + "\n")
        (folder / f"results_{date}.json").write_text(json.dumps({"results": results}))

    rng = np.random.default_rng(0)
    # L-Eval: Coursera's partial credit (0.25) and TOEFL's 0/1, 30 questions each; LPES better on TOEFL
    tpo_vanilla = [float(x) for x in rng.random(30) < 0.3]
    tpo_lpes = [1.0 if i < 12 else v for i, v in enumerate(tpo_vanilla)]
    coursera_vanilla = [float(v) for v in rng.choice([0, 0.25, 1], 30)]
    coursera_lpes = coursera_vanilla[::-1]
    # ZeroSCROLLS: a summary task scored by ROUGE-1/2/L, 10 samples
    rouge = rng.random((2, 10, 3)) * 0.4
    same = [float(x) for x in rng.random(20) < 0.5]  # QuALITY and SFiction: the same answers in both rows
    leval = lambda tpo, coursera: {"leval_tpo": [{"exact_match": v} for v in tpo],
                                   "leval_coursera": [{"exact_match": v} for v in coursera],
                                   "leval_quality": [{"exact_match": v} for v in same],
                                   "leval_sci_fi": [{"exact_match": v} for v in same]}
    summary = lambda rows: {"zeroscrolls_gov_report": [dict(zip(("rouge1", "rouge2", "rougeL"), map(float, r))) for r in rows]}
    run(tmp_path / "vanilla", "2026-01-01T00-00-00.1", {**leval(tpo_vanilla, coursera_vanilla), **summary(rouge[0])})
    run(tmp_path / "lpes", "2026-01-01T00-00-00.2", {**leval(tpo_lpes, coursera_lpes), **summary(rouge[1])})
    text = report.write_report([f"LPES={tmp_path / 'lpes'}", f"vanilla={tmp_path / 'vanilla'}"], tmp_path / "out").read_text()

    def cell(strata):
        test = compare_paired_resampled(strata)
        sign = lambda v: f"{'+' if v >= 0 else '−'}{abs(100 * v):.1f}"
        low, high = test["difference_interval"]
        return f"{sign(test['difference'])} [{sign(low)}, {sign(high)}], {test['better']} / {test['worse']}, p = {format_p(test['p'])}"

    column = lambda values: np.array(values)[:, None]
    coursera = (column(coursera_lpes), column(coursera_vanilla), mean_score)
    tpo = (column(tpo_lpes), column(tpo_vanilla), mean_score)
    unchanged = (column(same), column(same), mean_score)
    rows = [line for line in text.splitlines() if line.startswith("| LPES | ") and "p = " in line]
    assert len(rows) == 2  # one under each suite's table
    # | method | Coursera | QuALITY | TOEFL | SFiction | avg |
    leval_cells = [c.strip(" |") for c in rows[0].split(" | ")[1:]]
    assert leval_cells[0] == cell([coursera]) and leval_cells[2] == f"**{cell([tpo])}**"  # 8 better, 0 worse
    assert leval_cells[1] == leval_cells[3] == "+0.0 [+0.0, +0.0], 0 / 0, p = 1.000"
    assert leval_cells[4].strip("*") == cell([coursera, unchanged, tpo, unchanged])
    assert rows[1].split(" | ")[1] == f"**{cell([(rouge[1], rouge[0], geometric_mean_score)])}**"
    assert rows[1].endswith("| – | – |")  # ZeroSCROLLS' other tasks not logged: no cell, no average
    assert "paired bootstrap interval" in text


def test_a_logged_sample_with_a_unicode_line_separator_in_its_text_is_one_sample(tmp_path):
    from lpes_harness.evaluation.logged_samples import read_scores

    path = tmp_path / "samples.jsonl"
    rows = [{"doc_id": 0, "acc": 1.0, "doc": "a\u2028b\x85c"}, {"doc_id": 1, "acc": 0.0}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert read_scores(path, "acc") == {0: 1.0, 1: 0.0}


def test_a_broken_samples_file_is_named(tmp_path):
    _logged_run(tmp_path / "run", "2026-01-01T00-00-00.1", {0: [1, 0]})
    (tmp_path / "run" / "samples_multi_needle_pos0_2026-01-01T00-00-00.1.jsonl").write_text('{"doc_id": 0}\n')
    with pytest.raises(ValueError, match="samples_multi_needle_pos0.*needs 'doc_id' and 'acc'"):
        report.write_report([str(tmp_path / "run")], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_report_search_section_and_plots(two_methods):
    tmp_path, sources, history = two_methods
    out = tmp_path / "out"
    report.write_report(sources, out, history=history)
    text = (out / "report.md").read_text()
    assert "| 0 | 0.5000 | 0.4000 |" in text and "| 1 | 0.7000 | 0.7000 |" in text
    assert "Best individual: generation 1, fitness 0.7000" in text
    for name in ("position_kv_retrieval.png", "scales.png", "search.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name


def test_history_smoothness_by_generation_matches_second_differences(two_methods):
    _, _, history = two_methods
    rows = history_by_generation(read_history(history))
    assert [r["generation"] for r in rows] == [0, 1]
    assert rows[0]["best_smoothness"] == pytest.approx(abs(1.2 - 2 * 1.3 + 1.5))
    assert rows[0]["mean_smoothness"] == pytest.approx((0.1 + abs(1.1 - 3.8 + 1.0)) / 2)


def test_missing_results_path_is_named(tmp_path):
    with pytest.raises(ReportError, match="'.*nowhere' does not exist"):
        report.write_report([str(tmp_path / "nowhere")], tmp_path / "out")


def test_each_method_is_named_by_the_table_of_methods(tmp_path):
    """The report says what each method was, in the table's words, from the model its runs name."""
    from lpes_harness.methods import METHODS

    for folder, config in {"lpes": {"model": "lpes_hf", "model_args": "scales=run/scales.json"},
                           "base": {"model": "lpes_hf", "model_args": "scales=run/scales.json", "lpes_scaling": "base"},
                           "mspoe": {"model": "mspoe_hf", "model_args": {"min_ratio": 1.1}},
                           "vanilla": {"model": "hf", "model_args": "pretrained=x"},
                           # vanilla through lpes_hf (no scales: every factor 1) is the plain model, not LPES
                           "identity": {"model": "lpes_hf", "model_args": "dtype=bfloat16", "lpes_scales": [1.0] * 4},
                           # a scales file that is one factor on every layer (a search that kept its start) is PI
                           "kept": {"model": "lpes_hf", "model_args": "scales=kept/scales.json", "lpes_scales": [0.8] * 4},
                           "curve": {"model": "lpes_hf", "model_args": "scales=c.json", "lpes_scales": [0.8, 1.2, 1, 1]}}.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "results.json").write_text(json.dumps({"results": {"t": {"acc,none": 0.5}}, "config": config}))
    folders = ("lpes", "base", "mspoe", "vanilla", "identity", "kept", "curve")
    text = report.write_report([str(tmp_path / f) for f in folders], tmp_path / "out").read_text()
    for name, entry in {"lpes": "lpes", "base": "lpes_base", "mspoe": "mspoe", "kept": "pi", "curve": "lpes"}.items():
        method = METHODS[entry]
        assert f"- `{name}`: {method.label} (`{method.lm_eval}`), {method.description}" in text
    assert "- `vanilla`: the plain model (`hf`)\n" in text
    assert "- `identity`: the plain model (`lpes_hf`), every factor 1\n" in text


def test_cli_writes_report(two_methods, capsys):
    tmp_path, sources, history = two_methods
    assert report_command.main([*sources, "--out", str(tmp_path / "cli"), "--history", str(history)]) == 0
    assert (tmp_path / "cli" / "report.md").is_file() and "wrote" in capsys.readouterr().out


def test_population_statistics_come_from_generations_jsonl_when_present(tmp_path):
    # Generation 1 evaluates only one new individual (worse than the carried-over parent):
    # the population's best is the parent's, which only generations.jsonl knows.
    history = tmp_path / "history.jsonl"
    history.write_text(
        json.dumps({"generation": 0, "fitness": 0.5, "scales": [1.0, 1.1, 1.2]}) + "\n"
        + json.dumps({"generation": 1, "fitness": 0.2, "scales": [1.0, 1.3, 1.2]}) + "\n"
    )
    (tmp_path / "generations.jsonl").write_text(
        json.dumps({"generation": 0, "best_fitness": 0.5, "mean_fitness": 0.5, "best_scales": [1.0, 1.1, 1.2]}) + "\n"
        + json.dumps({"generation": 1, "best_fitness": 0.5, "mean_fitness": 0.35, "best_scales": [1.0, 1.1, 1.2]}) + "\n"
    )
    rows = population_stats(tmp_path / "generations.jsonl")
    assert [r["best_fitness"] for r in rows] == [0.5, 0.5]
    assert [r["best_fitness"] for r in history_by_generation(read_history(history))] == [0.5, 0.2]


def test_keep_samples_writes_a_record_that_outlives_the_run_folder(tmp_path):
    """--keep-samples: the results files and each logged sample's score, doc hash and answer, so a
    committed report can be re-paired without the lm_eval output folders it was made from."""
    _logged_run(tmp_path / "lpes", "2026-01-01T00-00-00.1", {0: [1, 0, 1]})
    _logged_run(tmp_path / "vanilla", "2026-01-02T00-00-00.2", {0: [0, 0, 1]})
    sample = tmp_path / "lpes" / "samples_multi_needle_pos0_2026-01-01T00-00-00.1.jsonl"
    rows = [json.loads(line) for line in sample.read_text().splitlines()]
    for row in rows:
        row.update(metrics=["acc"], doc_hash=f"h{row['doc_id']}", filtered_resps=[f" {row['doc_id']}7."], arguments="long prompt")
    sample.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    out = tmp_path / "out"
    assert report_command.main([f"lpes={tmp_path / 'lpes'}", f"vanilla {tmp_path.name}={tmp_path / 'vanilla'}",
                        "--out", str(out), "--keep-samples"]) == 0
    kept = json.loads((out / "per_sample.json").read_text())
    assert list(kept["lpes"]["multi_needle_pos0"]) == ["0", "1", "2"]  # by doc_id, whatever order lm-eval wrote
    assert kept["lpes"]["multi_needle_pos0"]["1"] == {"acc": 0.0, "doc_hash": "h1", "answer": " 17."}
    assert "long prompt" not in (out / "per_sample.json").read_text()
    assert json.loads((out / f"results_vanilla_{tmp_path.name}.json").read_text())["results"]["multi_needle_pos0"]["acc,none"] == 1 / 3
    assert (out / "results_lpes.json").is_file() and (out / "report.md").is_file()
    report.write_report([f"lpes={tmp_path / 'lpes'}"], tmp_path / "plain")
    assert not (tmp_path / "plain" / "per_sample.json").exists() and not (tmp_path / "plain" / "results_lpes.json").exists()


def test_a_kept_record_is_paired_as_its_run_folders_were_and_takes_a_new_row(tmp_path):
    """The committed record stands in for the lm_eval folders it was made from: the same tests,
    and a row run later is paired with the kept ones and kept beside them."""
    _logged_run(tmp_path / "lpes", "2026-01-01T00-00-00.1", {0: [1] * 9 + [0], 50: [1] * 6 + [0] * 4})
    _logged_run(tmp_path / "vanilla", "2026-01-02T00-00-00.2", {0: [1] * 5 + [0] * 5, 50: [0] * 10})
    _logged_run(tmp_path / "late", "2026-01-03T00-00-00.3", {0: [0] * 10, 50: [1] * 10})
    kept = tmp_path / "kept"
    assert report_command.main([f"LPES seed 1={tmp_path / 'lpes'}", f"vanilla={tmp_path / 'vanilla'}", "--out", str(kept), "--keep-samples"]) == 0
    original = (kept / "report.md").read_text()
    again = report.write_report([f"LPES seed 1={kept / 'results_LPES_seed_1.json'}", f"vanilla={kept / 'results_vanilla.json'}"],
                                tmp_path / "again").read_text()
    assert _row(again, "LPES seed 1") == _row(original, "LPES seed 1") and "+4/−0" in _row(again, "LPES seed 1")
    # a new row against the kept ones, re-kept into the same folder: nothing of the old rows is lost
    assert report_command.main([f"LPES seed 1={kept / 'results_LPES_seed_1.json'}", f"vanilla={kept / 'results_vanilla.json'}",
                        f"late={tmp_path / 'late'}", "--out", str(kept), "--keep-samples"]) == 0
    record = json.loads((kept / "per_sample.json").read_text())
    assert sorted(record) == ["LPES seed 1", "late", "vanilla"] and record["vanilla"]["multi_needle_pos0"]["4"]["acc"] == 1.0
    assert "+10/−5" in _row((kept / "report.md").read_text(), "late")  # 10 gained at 50 %, 5 lost at 0 %: pooled
    assert _row((kept / "report.md").read_text(), "LPES seed 1") == _row(original, "LPES seed 1")


def test_keep_samples_refuses_two_methods_that_would_share_a_file(tmp_path):
    _logged_run(tmp_path / "a", "2026-01-01T00-00-00.1", {0: [1, 0]})
    with pytest.raises(SystemExit):
        report_command.main([f"a b={tmp_path / 'a'}", f"a_b={tmp_path / 'a'}", "--out", str(tmp_path / "out"), "--keep-samples"])
    assert not (tmp_path / "out").exists()


def test_baseline_picks_the_method_every_other_is_tested_against(tmp_path):
    """--baseline: a curve against its PI (or a tuned baseline) on the same samples, not only against vanilla."""
    from lpes_harness.evaluation.stats import format_p, mcnemar_exact

    _logged_run(tmp_path / "lpes", "2026-01-01T00-00-00.1", {0: [1] * 10})
    _logged_run(tmp_path / "pi", "2026-01-02T00-00-00.2", {0: [0] * 8 + [1] * 2})
    _logged_run(tmp_path / "vanilla", "2026-01-03T00-00-00.3", {0: [0] * 5 + [1] * 5})
    sources = [f"{name}={tmp_path / name}" for name in ("lpes", "pi", "vanilla")]
    text = report.write_report(sources, tmp_path / "out", baseline="pi").read_text()
    assert f"+80.0 [+55.2, +100.0], +8/−0, p={format_p(mcnemar_exact(8, 0))}" in _row(text, "lpes")
    assert "+30.0 [" in _row(text, "vanilla") and "+3/−0" in _row(text, "vanilla") and "difference from `pi`" in text
    assert f"+50.0 [+19.0, +81.0], +5/−0, p={format_p(mcnemar_exact(5, 0))}" in _row(
        report.write_report(sources, tmp_path / "default").read_text(), "lpes")  # vanilla by default
    with pytest.raises(SystemExit):
        report_command.main([*sources, "--out", str(tmp_path / "bad"), "--baseline", "PI"])
    assert not (tmp_path / "bad").exists()


def _long_context_run(folder, date, rows_by_doc, task="zeroscrolls_gov_report"):
    """One lm-eval run of a summary task over the given documents (doc_id -> ROUGE-1/2/L), as
    ``lm_eval --samples`` writes it: the results aggregate only the documents it ran."""
    folder.mkdir(parents=True)
    names = ("rouge1", "rouge2", "rougeL")
    means = {f"{n},none": sum(r[i] for r in rows_by_doc.values()) / len(rows_by_doc) for i, n in enumerate(names)}
    lines = [json.dumps({"doc_id": doc, **dict(zip(names, row)), "metrics": list(names), "filtered_resps": [f"s{doc}"]})
             for doc, row in rows_by_doc.items()]
    (folder / f"samples_{task}_{date}.jsonl").write_text("\n".join(lines) + "\n")
    (folder / f"results_{date}.json").write_text(json.dumps(
        {"results": {task: means}, "n-samples": {task: {"original": 10, "effective": len(rows_by_doc)}}}))


def test_a_task_run_in_parts_is_joined_from_its_logged_samples(tmp_path):
    """The rest of a --limit run, run later with lm_eval --samples, joins the first part: the report and
    its kept record are those of one run over all the documents."""
    import numpy as np

    rouge = np.random.default_rng(1).random((2, 10, 3)) * 0.4
    rows = lambda r, docs: {doc: tuple(float(v) for v in r[doc]) for doc in docs}
    _long_context_run(tmp_path / "whole", "2026-01-01T00-00-00.1", rows(rouge[0], range(10)))
    _long_context_run(tmp_path / "first", "2026-01-01T00-00-00.2", rows(rouge[0], range(4)))
    _long_context_run(tmp_path / "rest", "2026-01-02T00-00-00.3", rows(rouge[0], range(4, 10)))
    _long_context_run(tmp_path / "lpes", "2026-01-03T00-00-00.4", rows(rouge[1], range(10)))
    whole = report.write_report([f"vanilla={tmp_path / 'whole'}", f"LPES={tmp_path / 'lpes'}"], tmp_path / "a").read_text()
    parts = report.write_report([f"vanilla={tmp_path / 'first'}", f"vanilla={tmp_path / 'rest'}", f"LPES={tmp_path / 'lpes'}"],
                                tmp_path / "b", keep_samples=True).read_text()
    assert parts == whole and "10 / 0" not in whole and "| LPES | " in whole
    kept = tmp_path / "b"
    assert sorted(p.name for p in kept.glob("results_*")) == ["results_LPES.json", "results_vanilla_0.json", "results_vanilla_1.json"]
    record = json.loads((kept / "per_sample.json").read_text())["vanilla"]["zeroscrolls_gov_report"]
    assert list(record) == [str(d) for d in range(10)] and record["7"]["answer"] == "s7"
    again = report.write_report([f"vanilla={kept / 'results_vanilla_0.json'}", f"vanilla={kept / 'results_vanilla_1.json'}",
                                 f"LPES={kept / 'results_LPES.json'}"], tmp_path / "c").read_text()
    assert again == whole
    # one part alone would show its 4 documents' aggregate beside a paired test over all 10: refused
    with pytest.raises(ReportError, match="scored 4 documents of zeroscrolls_gov_report, but the samples beside them hold 10"):
        report.write_report([f"vanilla={kept / 'results_vanilla_0.json'}", f"LPES={kept / 'results_LPES.json'}"], tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_parts_of_a_task_that_score_one_document_differently_are_refused(tmp_path):
    _long_context_run(tmp_path / "first", "2026-01-01T00-00-00.1", {0: (0.1, 0.1, 0.1), 1: (0.2, 0.2, 0.2)})
    _long_context_run(tmp_path / "again", "2026-01-02T00-00-00.2", {1: (0.3, 0.3, 0.3), 2: (0.2, 0.2, 0.2)})
    with pytest.raises(ReportError, match="zeroscrolls_gov_report document 1 is scored differently"):
        report.write_report([f"vanilla={tmp_path / 'first'}", f"vanilla={tmp_path / 'again'}"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_parts_of_a_position_task_are_joined_and_parts_without_samples_refused(tmp_path):
    _logged_run(tmp_path / "first", "2026-01-01T00-00-00.1", {0: [1, 1, 0, 0]})
    _logged_run(tmp_path / "whole", "2026-01-01T00-00-00.3", {0: [1, 1, 0, 0, 1, 1, 1, 1]})
    rest = tmp_path / "rest"
    _logged_run(rest, "2026-01-02T00-00-00.2", {0: [1, 1, 1, 1]})
    sample = rest / "samples_multi_needle_pos0_2026-01-02T00-00-00.2.jsonl"
    sample.write_text("".join(json.dumps({**json.loads(l), "doc_id": json.loads(l)["doc_id"] + 4}) + "\n"
                              for l in sample.read_text().splitlines()))  # its documents are 4-7
    joined = report.write_report([f"vanilla={tmp_path / 'first'}", f"vanilla={rest}"], tmp_path / "a").read_text()
    assert _row(joined, "vanilla") == _row(report.write_report([f"vanilla={tmp_path / 'whole'}"], tmp_path / "b").read_text(), "vanilla")
    assert _row(joined, "vanilla").startswith("| vanilla | 75.0 [")  # 6 of the 8 documents, not the last part's 4 of 4
    sample.unlink()
    with pytest.raises(ReportError, match="not all of which logged its samples"):
        report.write_report([f"vanilla={tmp_path / 'first'}", f"vanilla={rest}"], tmp_path / "c")


def _suite_part(folder, date, correct_by_subject, first_doc=0, weight_by_size=True):
    """One lm-eval run of a two-level multiple-choice suite (ceval_local -> stem -> subjects) over some
    documents of each subject, with the group scores lm-eval makes (size-weighted, or plain, means)."""
    folder.mkdir(parents=True)
    mean = lambda values, sizes: (sum(v * n for v, n in zip(values, sizes)) / sum(sizes) if weight_by_size
                                  else sum(values) / len(values))
    results, counts = {}, {}
    for subject, correct in correct_by_subject.items():
        task = f"ceval_local_{subject}"
        results[task] = {"acc,none": sum(correct) / len(correct), "acc_stderr,none": 0.1}
        counts[task] = {"original": 99, "effective": len(correct)}
        lines = [json.dumps({"doc_id": first_doc + i, "acc": float(c)}) for i, c in enumerate(correct)]
        (folder / f"samples_{task}_{date}.jsonl").write_text("\n".join(lines) + "\n")
    subjects = [f"ceval_local_{s}" for s in correct_by_subject]
    sizes = [counts[t]["effective"] for t in subjects]
    results["ceval_local_stem"] = {"acc,none": mean([results[t]["acc,none"] for t in subjects], sizes),
                                   "sample_len": sum(sizes)}
    results["ceval_local"] = {"acc,none": results["ceval_local_stem"]["acc,none"], "sample_len": sum(sizes)}
    (folder / f"results_{date}.json").write_text(json.dumps({
        "results": results, "n-samples": counts,
        "group_subtasks": {"ceval_local": ["ceval_local_stem"], "ceval_local_stem": subjects}}))


def test_a_multiple_choice_suite_run_in_parts_remakes_its_group_scores_from_the_joined_subjects(tmp_path):
    """--limit 2, then the rest with --samples: the suite's scores (lm-eval's weight_by_size means of the
    subjects) are those of one run over every question, and so is the paired test."""
    whole = {"physics": [1, 0, 0, 1, 1, 1], "chemistry": [0, 0, 1]}
    lpes = {"physics": [1, 1, 0, 1, 1, 0], "chemistry": [1, 0, 1]}
    _suite_part(tmp_path / "whole", "2026-01-01T00-00-00.1", whole)
    _suite_part(tmp_path / "first", "2026-01-01T00-00-00.2", {s: c[:2] for s, c in whole.items()})
    _suite_part(tmp_path / "rest", "2026-01-02T00-00-00.3", {s: c[2:] for s, c in whole.items()}, first_doc=2)
    _suite_part(tmp_path / "lpes", "2026-01-03T00-00-00.4", lpes)
    one = report.write_report([f"vanilla={tmp_path / 'whole'}", f"LPES={tmp_path / 'lpes'}"], tmp_path / "a").read_text()
    parts = report.write_report([f"vanilla={tmp_path / 'first'}", f"vanilla={tmp_path / 'rest'}",
                                 f"LPES={tmp_path / 'lpes'}"], tmp_path / "b").read_text()
    assert parts == one
    assert _row(parts, "vanilla").startswith("| vanilla | 55.6 | 55.6 |")  # 5 of 9, not a mean of two parts' means
    assert "(9 questions, 2 subjects)" in parts


def test_a_plain_mean_group_in_parts_is_remade_as_a_plain_mean(tmp_path):
    """A group without weight_by_size: its --limit part (subjects of one size) cannot tell, the rest can."""
    _suite_part(tmp_path / "first", "2026-01-01T00-00-00.1", {"physics": [1, 1], "chemistry": [0, 0]}, weight_by_size=False)
    _suite_part(tmp_path / "rest", "2026-01-02T00-00-00.2", {"physics": [1, 1, 1, 0], "chemistry": [1]}, first_doc=2,
                weight_by_size=False)
    text = report.write_report([f"x={tmp_path / 'first'}", f"x={tmp_path / 'rest'}"], tmp_path / "out").read_text()
    assert _row(text, "x").startswith("| x | 58.3 | 58.3 |")  # (5/6 + 1/3) / 2, where size-weighting gives 6/9 = 66.7
    # parts that cannot tell (one size, or subjects of one score) whose joined subjects differ in size: refused
    _suite_part(tmp_path / "tied", "2026-01-03T00-00-00.3", {"physics": [1, 1, 1, 1], "chemistry": [1]}, first_doc=2)
    with pytest.raises(ReportError, match="do not tell whether it weights its subtasks by size"):
        report.write_report([f"x={tmp_path / 'first'}", f"x={tmp_path / 'tied'}"], tmp_path / "no")
    assert not (tmp_path / "no").exists()


def test_a_group_in_parts_is_checked_against_its_subjects_scores_of_the_same_filter(tmp_path):
    """A subject that also reports another filter of the group's metric (``acc,strict``, written after
    ``acc,none``) must not stand in for the ``acc,none`` the group averaged."""
    _suite_part(tmp_path / "first", "2026-01-01T00-00-00.1", {"physics": [1, 0], "chemistry": [0, 0]})
    _suite_part(tmp_path / "rest", "2026-01-02T00-00-00.2", {"physics": [1, 1, 0], "chemistry": [1]}, first_doc=2)
    for record in (tmp_path / "first").glob("results_*.json"), (tmp_path / "rest").glob("results_*.json"):
        record = next(record)
        data = json.loads(record.read_text())
        for task, entry in data["results"].items():
            if task.startswith("ceval_local_") and task != "ceval_local_stem":
                entry["acc,strict"] = 0.0
        record.write_text(json.dumps(data))
    text = report.write_report([f"x={tmp_path / 'first'}", f"x={tmp_path / 'rest'}"], tmp_path / "out").read_text()
    assert _row(text, "x").startswith("| x | 50.0 | 50.0 |")  # 4 of 8 questions, weighted by size
    one_file = results_files.load_methods([f"y={tmp_path / 'first'}"])[0]
    assert one_file.get("ceval_local_physics", "acc") == 0.5  # the unfiltered score, not strict-match's 0


def test_score_metrics_names_the_unfiltered_score_else_the_first_and_keeps_every_other_filter():
    entry = {"acc,strict": 0.1, "acc,none": 0.2, "exact_match,strict": 0.3, "exact_match,flexible": 0.4,
             "f1,none": 0.5, "acc_stderr,none": 0.01, "alias": "x"}
    metrics = results_files.score_metrics(entry)
    assert metrics == {"acc": 0.2, "exact_match": 0.3, "f1": 0.5, "acc (strict)": 0.1, "exact_match (flexible)": 0.4}
    assert list(metrics)[:3] == ["acc", "exact_match", "f1"]  # plain names first: a task's first metric is one


def test_a_task_scored_under_two_filters_shows_both_in_the_report(tmp_path):
    """gsm8k-style tasks score one metric under strict-match and flexible-extract: both are rows."""
    for name, (strict, flexible) in {"a": (0.25, 0.5), "b": (0.5, 0.75)}.items():
        (tmp_path / name).mkdir()
        entry = {"exact_match,strict-match": strict, "exact_match,flexible-extract": flexible}
        (tmp_path / name / "results.json").write_text(json.dumps({"results": {"gsm": entry}, "config": {"model": "hf"}}))
    text = report.write_report([f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}"], tmp_path / "out").read_text()
    assert _row(text, "gsm / exact_match").startswith("| gsm / exact_match | 25.0 | 50.0 |")
    assert _row(text, "gsm / exact_match (flexible-extract)").startswith("| gsm / exact_match (flexible-extract) | 50.0 | 75.0 |")


def test_a_group_whose_first_score_is_no_mean_of_its_subjects_is_refused_in_parts(tmp_path):
    _suite_part(tmp_path / "first", "2026-01-01T00-00-00.1", {"physics": [1, 0], "chemistry": [0, 0]})
    _suite_part(tmp_path / "rest", "2026-01-02T00-00-00.2", {"physics": [1], "chemistry": [1]}, first_doc=2)
    record = tmp_path / "first" / "results_2026-01-01T00-00-00.1.json"
    data = json.loads(record.read_text())
    data["results"]["ceval_local_stem"]["acc,none"] = 0.9  # made some other way
    record.write_text(json.dumps(data))
    with pytest.raises(ReportError, match="neither the size-weighted nor the plain mean of its subtasks'"):
        report.write_report([f"x={tmp_path / 'first'}", f"x={tmp_path / 'rest'}"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_group_score_from_two_files_is_refused(tmp_path):
    for name, date in (("a", "2026-01-01T00-00-00.1"), ("b", "2026-01-02T00-00-00.2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"results_{date}.json").write_text(json.dumps(
            {"results": {"mmlu_local": {"acc,none": 0.3}}, "group_subtasks": {"mmlu_local": ["mmlu_local_stem"]}}))
    with pytest.raises(ReportError, match="the group mmlu_local is scored by more than one results file"):
        report.write_report([f"x={tmp_path / 'a'}", f"x={tmp_path / 'b'}"], tmp_path / "out")
