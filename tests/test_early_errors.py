"""Bad task input is reported by the lm_eval command line before any model is loaded."""

import os
import subprocess
import sys

import pytest

LM_EVAL = [sys.executable, "-m", "lm_eval"]
# A model path that does not exist: if the model were loaded first, its error would win.
NO_MODEL = ["--model", "lpes_hf", "--model_args", "pretrained=/nonexistent/model/dir", "--limit", "1"]


def lm_eval(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run([*LM_EVAL, *NO_MODEL, *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize(
    "tasks, metadata, message",
    [
        ("kv_retrieval", '{"num_pair": 3}', "unknown metadata key(s) 'num_pair' (did you mean 'num_pairs'?)"),
        ("mdqa_pos50", '{"data_path": "/nonexistent/nq.jsonl.gz"}', "data_path '/nonexistent/nq.jsonl.gz' does not exist"),
        ("kv_retrieval", '{"split": "train"}', "split='train' is not one of"),
    ],
)
def test_bad_metadata_fails_before_the_model_loads(tasks, metadata, message):
    done = lm_eval("--tasks", tasks, "--metadata", metadata)
    assert done.returncode != 0
    assert "TaskDataError" in done.stderr and message in done.stderr
    assert "/nonexistent/model/dir" not in done.stderr.split("TaskDataError")[0], "the model was tried first"


def test_malformed_line_is_reported_with_file_and_line(tmp_path):
    path = tmp_path / "kv.jsonl"
    path.write_text('{"ordered_kv_records": [["a", "b"], ["c", "d"]], "key": "a", "value": "b"}\n{"ordered_kv_records": oops}\n')
    done = lm_eval("--tasks", "kv_retrieval_pos0", "--metadata", f'{{"data_path": "{path}"}}')
    assert done.returncode != 0 and f"{path}:2: malformed JSON line" in done.stderr
