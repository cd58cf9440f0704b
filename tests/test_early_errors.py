"""Bad task input is reported before any model is loaded: on the lm_eval command line as one
argparse-style line (exit 2), and through ``lm_eval.simple_evaluate`` as a TaskDataError.

(The command line's table of bad inputs, with its no-model-load and nothing-written checks, is
tests/test_bad_inputs.py.)"""

import os
import re
import subprocess
import sys

import pytest

LM_EVAL = [sys.executable, "-m", "lm_eval"]
# A model that is not there: if the model were loaded first, its error would win. A Hugging Face id, not a
# path: a path that does not exist is refused before the tasks are checked (tests/test_bad_inputs.py), this
# id only by the load (offline, it is in no cache).
ABSENT = "lpes-test-no-such-org/no-such-model"
NO_MODEL = ["--model", "lpes_hf", "--model_args", f"pretrained={ABSENT}", "--limit", "1"]
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
    assert "Traceback" not in done.stderr and ABSENT not in done.stderr


@pytest.mark.parametrize("tasks, metadata, message", BAD_METADATA)
def test_simple_evaluate_refuses_bad_metadata_before_the_model_loads(tasks, metadata, message):
    from lm_eval.evaluator import simple_evaluate

    from lpes_harness.tasks.data import TaskDataError

    with pytest.raises(TaskDataError, match=re.escape(message)):
        # The model does not exist: if it were loaded first, its error (not TaskDataError) would win.
        simple_evaluate(model="lpes_hf", model_args=f"pretrained={ABSENT}", tasks=[tasks],
                        metadata=metadata, limit=1)


@pytest.mark.parametrize("model, model_args, error, message", [
    ("poshidden_hf", "", "MethodError", "poshidden_hf needs the channel to scale"),
    ("mspoe_hf", "min_ratio=-1", "MethodError", "mspoe_hf: min_ratio=-1 is out of range"),
    ("lpes_hf", "pretrained=/nonexistent/model/dir", "ScalesError", "pretrained='/nonexistent/model/dir' does not exist"),
])
def test_simple_evaluate_refuses_a_bad_model_argument_before_the_model_loads(model, model_args, error, message,
                                                                            monkeypatch):
    """A method's own argument and the model's path, refused with the error a caller catches (a method's
    MethodError, as its model's constructor raised it), and HFLM's constructor, which loads the model,
    never entered."""
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from lpes_harness.core.scales_file import ScalesError
    from lpes_harness.methods.arguments import MethodError

    loads = []
    monkeypatch.setattr(HFLM, "__init__", lambda self, *args, **kwargs: loads.append(kwargs))
    with pytest.raises({"MethodError": MethodError, "ScalesError": ScalesError}[error], match=re.escape(message)):
        simple_evaluate(model=model, model_args=model_args, tasks=["kv_retrieval_pos0"], limit=1)
    assert loads == []
