"""Bad task input is reported before any model is loaded: on the lm_eval command line as one
argparse-style line (exit 2), and through ``lm_eval.simple_evaluate`` as a TaskDataError.

(The command line's table of bad inputs, with its time and nothing-written checks, is
tests/test_bad_inputs.py.)"""

import os
import re
import subprocess
import sys

import pytest

LM_EVAL = [sys.executable, "-m", "lm_eval"]
# A model path that does not exist: if the model were loaded first, its error would win.
NO_MODEL = ["--model", "lpes_hf", "--model_args", "pretrained=/nonexistent/model/dir", "--limit", "1"]
BAD_METADATA = [
    ("kv_retrieval", {"num_pair": 3}, "unknown metadata key(s) 'num_pair' (did you mean 'num_pairs'?)"),
    ("mdqa_pos50", {"data_path": "/nonexistent/nq.jsonl.gz"}, "data_path '/nonexistent/nq.jsonl.gz' does not exist"),
    ("kv_retrieval", {"split": "train"}, "split='train' is not one of"),
]


def lm_eval(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run([*LM_EVAL, *NO_MODEL, *args], capture_output=True, text=True, env=env, timeout=300)


def test_malformed_line_is_reported_with_file_and_line(tmp_path):
    path = tmp_path / "kv.jsonl"
    path.write_text('{"ordered_kv_records": [["a", "b"], ["c", "d"]], "key": "a", "value": "b"}\n{"ordered_kv_records": oops}\n')
    done = lm_eval("--tasks", "kv_retrieval_pos0", "--metadata", f'{{"data_path": "{path}"}}')
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"error: argument --metadata: {path}:2: malformed JSON line" in done.stderr
    assert "Traceback" not in done.stderr and "/nonexistent/model/dir" not in done.stderr


@pytest.mark.parametrize("tasks, metadata, message", BAD_METADATA)
def test_simple_evaluate_refuses_bad_metadata_before_the_model_loads(tasks, metadata, message):
    from lm_eval.evaluator import simple_evaluate

    from lpes_harness.tasks.data import TaskDataError

    with pytest.raises(TaskDataError, match=re.escape(message)):
        # The model does not exist: if it were loaded first, its error (not TaskDataError) would win.
        simple_evaluate(model="lpes_hf", model_args="pretrained=/nonexistent/model/dir", tasks=[tasks],
                        metadata=metadata, limit=1)
