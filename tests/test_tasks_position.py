"""The position-task machinery: gold indices, disjoint seeded splits, metadata checks, the YAML."""

import gzip
import json

import pytest
from conftest import SHARED_DATA

from lpes_harness.tasks import BUILTIN_POSITION_TASKS, TASKS_DIR
from lpes_harness.tasks.data import TaskDataError, read_jsonl
from lpes_harness.tasks.kv_retrieval import KV_RETRIEVAL
from lpes_harness.tasks.mdqa import MDQA
from lpes_harness.lmeval.tasks import task_yaml_files
from lpes_harness.tasks.position import build_examples, gold_index, resolve_options, resolve_task, sample_indices

NQ_ORACLE = SHARED_DATA / "lost_in_the_middle" / "nq-open-oracle.jsonl.gz"


def options(task, **metadata):
    return resolve_options(task, metadata)[0]


@pytest.mark.parametrize(
    "percent, num_items, index",
    [(0, 20, 0), (25, 20, 4), (50, 20, 9), (75, 20, 14), (100, 20, 19), (40, 30, 11), (100, 30, 29), (50, 10, 4)],
)
def test_gold_index_matches_litm(percent, num_items, index):
    assert gold_index(percent, num_items) == index


def test_generated_splits_are_disjoint_and_default_to_200_500_and_200():
    search = build_examples(KV_RETRIEVAL, options(KV_RETRIEVAL, split="search"))
    heldout = build_examples(KV_RETRIEVAL, options(KV_RETRIEVAL, split="heldout"))
    validation = build_examples(KV_RETRIEVAL, options(KV_RETRIEVAL, split="validation"))
    assert (len(search), len(heldout), len(validation)) == (200, 500, 200)
    indices = [{i for i, _ in split} for split in (search, heldout, validation)]
    assert not indices[0] & indices[1] and not indices[0] & indices[2] and not indices[1] & indices[2]
    keys = [{ex.gold[0] for _, ex in split} for split in (search, heldout, validation)]
    assert not keys[0] & keys[1] and not keys[0] & keys[2] and not keys[1] & keys[2]
    # A larger held-out request never reaches the validation samples (they count down from -1).
    more = build_examples(KV_RETRIEVAL, options(KV_RETRIEVAL, split="heldout", num_samples=5000))
    assert not {i for i, _ in more} & indices[2]


def test_file_splits_are_disjoint_deterministic_and_seeded():
    def questions(**metadata):
        chosen = sample_indices(MDQA, options(MDQA, data_path=str(NQ_ORACLE), **metadata))
        return [read_jsonl(NQ_ORACLE)[i]["question"] for i in chosen]

    search, heldout, validation = questions(split="search"), questions(split="heldout"), questions(split="validation")
    assert (len(search), len(heldout), len(validation)) == (200, 500, 200)
    assert not set(search) & set(heldout) and not set(validation) & (set(search) | set(heldout))
    # Every held-out record there is stays clear of the validation ones.
    everything = questions(split="heldout", num_samples=len(read_jsonl(NQ_ORACLE)) - 400)
    assert everything[:500] == heldout and not set(everything) & set(validation)
    assert questions(split="search") == search  # deterministic
    assert questions(split="search", seed=1) != search  # the seed picks the split
    assert questions(split="search", num_samples=50) == search[:50]  # fewer samples: a prefix, still disjoint


def test_asking_more_samples_than_a_split_holds_is_an_error():
    with pytest.raises(TaskDataError, match="num_samples=201 but the search split .* has 200"):
        sample_indices(KV_RETRIEVAL, options(KV_RETRIEVAL, split="search", num_samples=201))


def test_unknown_metadata_key_suggests_the_close_one():
    with pytest.raises(TaskDataError, match=r"unknown metadata key\(s\) 'num_pair' \(did you mean 'num_pairs'\?\)"):
        resolve_options(KV_RETRIEVAL, {"num_pair": 20})


def test_keys_of_other_position_tasks_and_lm_eval_are_tolerated():
    # One --metadata serves every task of a run: mdqa's num_docs must not break kv_retrieval.
    opts = options(KV_RETRIEVAL, num_docs=20, version=1.0, config_source="x.yaml")
    assert opts["num_pairs"] == 30


@pytest.mark.parametrize(
    "metadata, message",
    [
        ({"split": "train"}, r"split='train' is not one of \['search', 'heldout', 'validation'\]"),
        ({"num_samples": "many"}, r"num_samples='many' is not an integer"),
        ({"num_samples": 0}, r"num_samples=0 must be at least 1"),
        ({"num_pairs": 1}, r"num_pairs=1 must be at least 2"),
        ({"seed": 1.5}, r"seed=1.5 is not an integer"),
    ],
)
def test_bad_option_values_name_what_was_typed_and_what_is_accepted(metadata, message):
    with pytest.raises(TaskDataError, match=message):
        resolve_options(KV_RETRIEVAL, metadata)


def test_missing_data_file_is_reported_with_its_path():
    with pytest.raises(TaskDataError, match="data_path 'no/such/file.jsonl' does not exist"):
        build_examples(KV_RETRIEVAL, options(KV_RETRIEVAL, data_path="no/such/file.jsonl"))


@pytest.mark.parametrize("compress", [False, True])
def test_malformed_json_line_is_reported_as_file_colon_line(tmp_path, compress):
    good = json.dumps({"ordered_kv_records": [["a", "1"], ["b", "2"]], "key": "a", "value": "1"})
    text = f"{good}\n{good}\n{{not json\n"
    path = tmp_path / ("kv.jsonl.gz" if compress else "kv.jsonl")
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    with pytest.raises(TaskDataError, match=rf"{path}:3: malformed JSON line"):
        build_examples(KV_RETRIEVAL, options(KV_RETRIEVAL, data_path=str(path)))


def test_record_missing_a_litm_key_is_reported_as_file_colon_line(tmp_path):
    path = tmp_path / "kv.jsonl"
    path.write_text(json.dumps({"ordered_kv_records": [], "key": "a"}) + "\n")
    with pytest.raises(TaskDataError, match=rf"{path}:1: missing key\(s\) \['value'\]"):
        build_examples(KV_RETRIEVAL, options(KV_RETRIEVAL, data_path=str(path)))


def test_committed_yaml_is_what_the_tasks_generate():
    for name, reference in BUILTIN_POSITION_TASKS.items():
        for file_name, text in task_yaml_files(resolve_task(reference), reference).items():
            assert (TASKS_DIR / name / file_name).read_text() == text, "regenerate: python -m lpes_harness.commands.write_tasks"


def test_bad_metadata_fails_while_lm_eval_builds_the_tasks_before_any_model_call():
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"valu_format": "hex8"})
    with pytest.raises(TaskDataError, match="did you mean 'value_format'"):
        manager.load(["kv_retrieval"])


def test_lm_eval_loads_the_group_with_metadata_from_tasks_dir():
    from lm_eval.tasks import TaskManager

    metadata = {"num_samples": 3, "split": "search", "num_pairs": 5}
    loaded = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=metadata).load(["kv_retrieval"])
    assert sorted(loaded["tasks"]) == sorted(f"kv_retrieval_pos{p}" for p in (0, 20, 40, 60, 80, 100))
    task = loaded["tasks"]["kv_retrieval_pos100"]
    docs = list(task.test_docs())
    assert len(docs) == 3 and all(doc["gold_index"] == 4 for doc in docs)
    assert task.doc_to_text(docs[0]) == docs[0]["prompt"]


def test_model_args_merged_into_metadata_by_lm_eval_are_not_unknown_keys():
    # lm-eval 0.4.13 puts --model_args into the task metadata; they must not trip the key check.
    import lm_eval
    from lm_eval.tasks import TaskManager

    model_args = {"pretrained": "some/model", "gguf_file": "m.gguf"}
    manager = TaskManager(
        include_path=str(TASKS_DIR), include_defaults=False, metadata={**model_args, "num_samples": 2, "num_pairs": 4}
    )
    results = lm_eval.simple_evaluate(model="dummy", model_args=model_args, tasks=["kv_retrieval"], task_manager=manager)
    assert results["results"]["kv_retrieval_pos0"]["accuracy,none"] == 0.0  # the dummy model answers "lol"


def test_tasks_dir_is_the_absolute_yaml_folder_of_the_checkout():
    assert TASKS_DIR.is_absolute()
    for name in BUILTIN_POSITION_TASKS:
        assert (TASKS_DIR / name / f"{name}.yaml").is_file()


def test_load_task_indexes_lm_evals_own_tasks_only_for_a_name_not_ours(monkeypatch):
    # All of lm-eval's ~15,000 task files take 18 s to index on a slow CPU; our folder 0.2 s.
    import lm_eval.tasks

    from lpes_harness.lmeval.tasks import load_task

    built = []

    class Manager:
        def __init__(self, include_path=None, include_defaults=True):
            built.append((include_path, include_defaults))
            self.all_tasks = {"theirs", "ours"} if include_defaults else {"ours"}

        def load(self, names):
            return {"tasks": {name: f"the task {name}" for name in names}}

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Manager)
    assert load_task("ours") == "the task ours" and built == [(str(TASKS_DIR), False)]
    assert load_task("theirs") == "the task theirs" and built[1:] == [(str(TASKS_DIR), False), (None, True)]
    with pytest.raises(KeyError):
        load_task("nobody")
    # and the real thing: one of ours, from our folder alone
    monkeypatch.undo()
    assert load_task("multi_needle_pos50").config.task == "multi_needle_pos50"
