"""MMLU and C-Eval on local CSV files: lm-eval's 5-shot format, dev shots, mapping.json groups."""

import re

import pytest
from conftest import REPO_ROOT, SHARED_DATA
from suite_fixtures import write_ceval, write_mmlu

from lpes_harness.tasks.data import TaskDataError
from lpes_harness.tasks.suites import multiple_choice as mc
from lpes_harness.tasks.suites import yaml_files


def _loaded_tasks(tmp_path, suite):
    """The suite's subject tasks as lm-eval loads them from its generated YAML (data under tmp_path)."""
    from lm_eval.tasks import TaskManager

    out = tmp_path / "yaml"
    for name, text in yaml_files.multiple_choice_files(suite, str(tmp_path)).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text, encoding="utf-8")
    manager = TaskManager(include_path=str(out), include_defaults=False, metadata={"data_path": str(tmp_path)})
    return manager.load([suite.name])["tasks"]


def test_mmlu_rows_parse_into_question_choices_answer(tmp_path):
    write_mmlu(tmp_path)
    docs = mc.subject_docs(mc.MMLU, "astronomy", "test", str(tmp_path))
    assert docs[1] == {"question": "astronomy question 101?", "choices": ["a101", "b101", "c101", "d101"], "answer": 1, "subject": "astronomy"}


def test_mmlu_prompt_is_lm_eval_five_shot_format_with_dev_shots_in_order(tmp_path):
    write_mmlu(tmp_path)
    tasks = _loaded_tasks(tmp_path, mc.MMLU)
    assert set(tasks) == {"mmlu_local_astronomy", "mmlu_local_world_religions"}
    task = tasks["mmlu_local_world_religions"]
    doc = task.test_docs()[0]
    context = task.fewshot_context(doc, num_fewshot=task.config.num_fewshot)
    assert task.config.num_fewshot == 5
    assert context.startswith("The following are multiple choice questions (with answers) about world religions.\n\n")
    # five dev questions, in file order, each with its answer letter, then the test question
    shots = re.findall(r"world_religions question (\d+)\?\nA\. a\d+\nB\. b\d+\nC\. c\d+\nD\. d\d+\nAnswer: ([ABCD])", context)
    assert shots == [("0", "A"), ("1", "B"), ("2", "C"), ("3", "D"), ("4", "A")]
    assert context.endswith("world_religions question 100?\nA. a100\nB. b100\nC. c100\nD. d100\nAnswer:")
    assert task.doc_to_target(doc) == 0 and task.doc_to_choice(doc) == ["A", "B", "C", "D"]


def test_mmlu_continuation_scores_the_option_texts_zero_shot(tmp_path):
    """lm-eval's mmlu_continuation: no options listed, each option's text is the continuation."""
    write_mmlu(tmp_path)
    tasks = _loaded_tasks(tmp_path, mc.MMLU_CONTINUATION)
    assert set(tasks) == {"mmlu_continuation_local_astronomy", "mmlu_continuation_local_world_religions"}
    task = tasks["mmlu_continuation_local_astronomy"]
    doc = task.test_docs()[1]
    assert task.config.num_fewshot == 0
    context = task.fewshot_context(doc, num_fewshot=0)
    assert context == "The following are questions (with answers) about astronomy.\n\nQuestion: astronomy question 101?\nAnswer:"
    assert context.endswith(mc.doc_to_text(mc.MMLU_CONTINUATION, doc))
    assert task.doc_to_choice(doc) == ["a101", "b101", "c101", "d101"] and task.doc_to_target(doc) == 1
    assert [m["metric"] for m in task.config.metric_list] == ["acc", "acc_norm"]


def test_ceval_uses_val_split_dev_shots_and_chinese_cue(tmp_path):
    write_ceval(tmp_path)
    task = _loaded_tasks(tmp_path, mc.CEVAL)["ceval_local_logic"]
    docs = task.validation_docs()
    assert len(docs) == 2 and docs[1]["answer"] == 3  # row 11 -> "D"
    context = task.fewshot_context(docs[0], num_fewshot=5)
    assert context.startswith("以下是中国关于逻辑学考试的单项选择题，请选出其中的正确答案。\n\n")
    assert context.count("答案：") == 6 and context.endswith("逻辑 question 10?\nA. a10\nB. b10\nC. c10\nD. d10\n答案：")


def test_groups_follow_mapping_categories(tmp_path):
    write_mmlu(tmp_path)
    files = yaml_files.multiple_choice_files(mc.MMLU, str(tmp_path))
    import yaml

    assert yaml.safe_load(files["_mmlu_local_stem.yaml"])["task"] == ["mmlu_local_astronomy"]
    assert yaml.safe_load(files["_mmlu_local_humanities.yaml"])["task"] == ["mmlu_local_world_religions"]
    assert yaml.safe_load(files["_mmlu_local.yaml"])["task"] == ["mmlu_local_humanities", "mmlu_local_stem"]


def test_bad_answer_letter_names_file_and_line(tmp_path):
    folder = write_mmlu(tmp_path)
    path = folder / "test" / "astronomy_test.csv"
    path.write_text(path.read_text() + "q?,a,b,c,d,E\n")
    with pytest.raises(TaskDataError, match=r"astronomy_test\.csv:4: answer 'E'"):
        mc.subject_docs(mc.MMLU, "astronomy", "test", str(tmp_path))


def test_unknown_subject_lists_known_ones(tmp_path):
    write_mmlu(tmp_path)
    with pytest.raises(TaskDataError, match="unknown subject 'astronomyy'.*astronomy"):
        mc.subject_docs(mc.MMLU, "astronomyy", "test", str(tmp_path))


def test_missing_data_explains_data_path_and_env_var(tmp_path):
    with pytest.raises(TaskDataError, match=r"data_path.*LPES_DATA"):
        mc.subject_docs(mc.MMLU, "astronomy", "test", str(tmp_path / "nowhere"))


def test_env_var_points_at_data_root(tmp_path, monkeypatch):
    write_mmlu(tmp_path)
    monkeypatch.setenv("LPES_DATA", str(tmp_path))
    assert len(mc.subject_docs(mc.MMLU, "astronomy", "test")) == 3


@pytest.mark.skipif(not (SHARED_DATA / "mmlu").is_dir(), reason="shared data not present")
@pytest.mark.parametrize("suite, counts", [(mc.MMLU, {"test": 14042, "dev": 285}), (mc.CEVAL, {"val": 1346, "dev": 260})])
def test_shared_data_parses_fully_and_committed_yaml_matches_mapping(suite, counts):
    mapping = mc.read_mapping(suite, str(SHARED_DATA))
    for split, expected in counts.items():
        assert sum(len(mc.subject_docs(suite, s, split, str(SHARED_DATA))) for s in mapping) == expected
    committed = {p.name: p.read_text(encoding="utf-8") for p in (REPO_ROOT / "tasks" / "suites" / suite.name).iterdir()}
    assert committed == yaml_files.multiple_choice_files(suite, str(SHARED_DATA))


@pytest.mark.skipif(not (SHARED_DATA / "mmlu" / "mapping.json").is_file(), reason="needs ../shared/data")
def test_committed_yaml_is_what_the_generator_writes():
    """The YAML under tasks/suites is generated: a generator change must come with the regenerated files."""
    written = yaml_files.all_files(str(SHARED_DATA))
    suites = REPO_ROOT / "tasks" / "suites"
    on_disk = {str(p.relative_to(suites)) for p in suites.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert set(written) == on_disk
    assert all((suites / name).read_text(encoding="utf-8") == text for name, text in written.items())
