"""Bad input costs seconds, not a model load: a table of bad inputs through the real command lines.

Each row runs a console script of the venv (``lm_eval``, ``lpes-eval``, ``lpes-check``, ``lpes-report``,
``searches/ga.py``) in a fresh empty folder, and asserts the exit code (2, as argparse), one
``error:`` line naming the argument, the value and what is allowed, no traceback, the time,
and that nothing was written: neither in that folder (the working directory, and
``--output_path`` / ``--out`` inside it) nor anywhere else the row could reach.

The rows run two at a time: each is a whole interpreter start (lm-eval's command line
imports in about a second on a 2-core CPU; the model would take 20 s more).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO_ROOT

BIN = Path(sys.executable).parent
# lm-eval's own early errors ("Tasks not found") come after it indexes its tasks, ~6-10 s;
# ours must come no later. searches/ga.py: within 3 s.
LM_EVAL_LIMIT_S = 6.0
GA_LIMIT_S = 3.0
REPORT_LIMIT_S = 3.0
ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def _site_packages() -> str:
    import lm_eval

    return str(Path(lm_eval.__file__).resolve().parents[1])


def inputs(folder: Path) -> dict[str, str]:
    """The files the rows read (written once, outside every row's folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "not_json": "{'scales': [1.0, 1.2]\n",
        "dict_without_scales": json.dumps({"format": "lpes-scales/1", "values": [1.0] * 30}),
        "scales_not_a_list": json.dumps({"scales": 5}),
        "a_number": "1.5",
        "empty_list": "[]",
        "a_string_inside": json.dumps([1.0, "fast", 1.2]),
        "a_negative_inside": json.dumps({"scales": [1.0, -1.0, 1.2]}),
        "num_layers_mismatch": json.dumps({"scales": [1.0, 1.1], "num_layers": 3}),
        "three_scales": json.dumps({"format": "lpes-scales/1", "scales": [1.0, 1.1, 1.2], "num_layers": 3}),
        "results_not_json": "nope",
        "results_without_results": json.dumps({"config": {"model": "lpes_hf"}}),
        "valid_results": json.dumps({"results": {"mmlu_local": {"acc,none": 0.3}}}),
    }
    paths = {}
    for name, text in files.items():
        path = folder / f"{name}.json"
        path.write_text(text)
        paths[name] = str(path)
    # A model known by its config alone: the layer count is checked without any weights.
    config_only = folder / "config_only_model"
    config_only.mkdir(exist_ok=True)
    (config_only / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4}))
    paths["config_only_model"] = str(config_only)
    (folder / "no_results_here").mkdir(exist_ok=True)
    paths["no_results_here"] = str(folder / "no_results_here")
    from lpes_harness.core.models import BUNDLED_GGUF, bundled_model_dir

    paths["bundled_gguf"] = os.path.join(bundled_model_dir(), BUNDLED_GGUF)
    return paths


def lm_eval_row(model_args, message, *, tool="lm_eval"):
    return {"tool": tool, "args": ["--model", "lpes_hf", "--model_args", model_args, "--tasks", "kv_retrieval",
                                   "--limit", "1", "--output_path", "out"],
            "message": message, "limit": LM_EVAL_LIMIT_S}


def metadata_row(tasks, metadata, message, *, model="lpes_hf"):
    return {"tool": "lm_eval", "args": ["--model", model, "--tasks", tasks, "--metadata", json.dumps(metadata),
                                       "--limit", "1", "--output_path", "out"],
            "message": "lm_eval: error: argument --metadata: " + message, "limit": LM_EVAL_LIMIT_S}


def check_row(args, message):
    return {"tool": "lpes-check", "args": ["--task", "multi_needle", "--num-samples", "1", "--json", "out/check.json",
                                           *args], "message": "lpes-check: error: " + message}


def table(p: dict[str, str]) -> list[dict]:
    arg = "lm_eval: error: argument --model_args: "
    rows = [
        # ---- scales=
        lm_eval_row("scales=-1", arg + "scales=-1: the scale must be a finite number > 0"),
        lm_eval_row("scales=0", arg + "scales=0: the scale must be a finite number > 0"),
        lm_eval_row("scales=nan", arg + "scales=nan: the scale must be a finite number > 0"),
        lm_eval_row("scales=inf", arg + "scales=inf: the scale must be a finite number > 0"),
        lm_eval_row("scales=abc", arg + "scales='abc' is not understood; give a number > 0 (uniform), numbers > 0 "
                                        "separated by ';' (one per layer), or a path to a JSON scales file"),
        lm_eval_row("scales=true", arg + "scales=true is not understood; give a number > 0"),
        lm_eval_row("scales=1;-2;1.5", arg + "scales='1;-2;1.5': scale 1 (-2.0) must be a finite number > 0"),
        lm_eval_row("scales=1.2;1.3;1.4", arg + "scales='1.2;1.3;1.4' gives 3 scales but the model has 30 decoder layers; "
                                                "give one scale per layer, or a single number for all"),
        lm_eval_row('{"scales": [1.2, 1.3]}', arg + "scales=[1.2, 1.3] gives 2 scales but the model has 30 decoder layers"),
        # ---- scales=<file>
        lm_eval_row("scales=/nonexistent/scales.json", arg + "scales=/nonexistent/scales.json: scales file not found"),
        lm_eval_row(f"scales={p['not_json']}", arg + f"scales={p['not_json']}:1: not valid JSON"),
        lm_eval_row(f"scales={p['dict_without_scales']}", arg + f"scales={p['dict_without_scales']}: has no 'scales' key; "
                                                               "a scales file is a JSON list of numbers or an object with a 'scales' list"),
        lm_eval_row(f"scales={p['scales_not_a_list']}", arg + f"scales={p['scales_not_a_list']}: has 'scales' a number (5); a scales file is"),
        lm_eval_row(f"scales={p['a_number']}", arg + f"scales={p['a_number']}: holds a number (1.5); a scales file is"),
        lm_eval_row(f"scales={p['empty_list']}", arg + f"scales={p['empty_list']}: 'scales' is empty"),
        lm_eval_row(f"scales={p['a_string_inside']}", arg + f"scales={p['a_string_inside']}: scale 1 is 'fast'; every scale must be a finite number > 0"),
        lm_eval_row(f"scales={p['a_negative_inside']}", arg + f"scales={p['a_negative_inside']}: scale 1 is -1.0; every scale must be a finite number > 0"),
        lm_eval_row(f"scales={p['num_layers_mismatch']}", arg + f"scales={p['num_layers_mismatch']}: 'num_layers' is 3 but 'scales' has 2 entries"),
        lm_eval_row(f"scales={p['three_scales']}", arg + f"scales='{p['three_scales']}' gives 3 scales but the model has 30 decoder layers"),
        lm_eval_row(f"scales={p['no_results_here']}", arg + f"scales={p['no_results_here']}: is a directory, not a scales file"),
        # ---- control_points= / curve= / pi=
        lm_eval_row("control_points=0:1.5;10:1.2;5:1.8;29:1.4",
                    arg + "control_points='0:1.5;10:1.2;5:1.8;29:1.4': control point 2 (5, 1.8): x=5 is not greater than "
                          "the previous point's x=10; x must be strictly increasing"),
        lm_eval_row("control_points=0:1.5;40:1.2", arg + "control_points='0:1.5;40:1.2': control point 1 (40, 1.2): x=40 is outside "
                                                         "[0, 29] (x is a layer index of a 30-layer model)"),
        lm_eval_row("control_points=0-1.5;29:1.2", arg + "control_points='0-1.5;29:1.2': control point 0 '0-1.5' in '0-1.5;29:1.2' "
                                                         "is not of the form x:y"),
        lm_eval_row("control_points=0:1.5", arg + "control_points='0:1.5': need at least 2 control points"),
        lm_eval_row("control_points=0:1.5;29:0", arg + "control_points='0:1.5;29:0': control point 1 (29, 0): y=0 must be > 0"),
        lm_eval_row("control_points=0:1.5;29:1,curve=spline", arg + "curve='spline' is not a curve; accepted: bezier, linear, step"),
        lm_eval_row("scales=1.2,curve=linear", arg + "curve='linear' shapes control_points=... only, and none are given"),
        lm_eval_row("scales=1.2,control_points=0:1;29:1", arg + "scales=1.2 and control_points='0:1;29:1' both given; give either, not both"),
        lm_eval_row("pi=true", arg + "pi=true has nothing to average: give scales=... or control_points=... "
                                     "(or a model saved with LPES scales)"),
        lm_eval_row("scales=1.2,pi=maybe", arg + "pi='maybe' is not allowed; give true or false"),
        # ---- other models: a config without weights, a GGUF path
        lm_eval_row(f"pretrained={p['config_only_model']},scales=1;1;1",
                    arg + "scales='1;1;1' gives 3 scales but the model has 4 decoder layers"),
        lm_eval_row(f"pretrained={p['config_only_model']},control_points=0:1;5:1",
                    arg + "control_points='0:1;5:1': control point 1 (5, 1): x=5 is outside [0, 3]"),
        lm_eval_row(f"pretrained={p['bundled_gguf']},scales=1;1", arg + "scales='1;1' gives 2 scales but the model has 30 decoder layers"),
        # ---- lpes-eval: the same checks, also without the start-up hook (python -S)
        lm_eval_row("scales=-1", "lpes-eval: error: argument --model_args: scales=-1: the scale must be a finite number > 0",
                    tool="lpes-eval"),
        lm_eval_row("curve=spline,control_points=0:1;29:1",
                    "lpes-eval: error: argument --model_args: curve='spline' is not a curve", tool="lpes-eval -S"),
        # ---- --metadata of our position tasks (any model: the tasks are checked, not the model)
        metadata_row("multi_needle", {"num_needles": -1}, "multi_needle: num_needles=-1 must be at least 1"),
        metadata_row("multi_needle_pos50", {"num_sentence": 60},
                     "multi_needle: unknown metadata key(s) 'num_sentence' (did you mean 'num_sentences'?)"),
        metadata_row("kv_retrieval", {"split": "train"},
                     "kv_retrieval: split='train' is not one of ['search', 'heldout', 'validation']"),
        metadata_row("kv_retrieval", {"value_format": "xyz"}, "kv_retrieval: value_format='xyz' is not one of"),
        metadata_row("mdqa", {"num_samples": "ten"}, "mdqa: num_samples='ten' is not an integer", model="hf"),
        metadata_row("mdqa_pos0", {"data_path": "/nonexistent/nq.jsonl"},
                     "data_path '/nonexistent/nq.jsonl' does not exist or is not a file"),
        metadata_row("mmlu_local", {"data_path": "/nonexistent/data"},
                     "could not find the mmlu data (looked for data_path: /nonexistent/data/mmlu/mapping.json"),
        # ---- a suite's data not where LPES_DATA says: no argument to blame, the message says where it looked
        {"tool": "lm_eval", "args": ["--model", "lpes_hf", "--tasks", "zeroscrolls_qasper", "--limit", "1",
                                     "--output_path", "out"], "env": {"LPES_DATA": "/nonexistent/data"},
         "message": "lm_eval: error: could not find the zeroscrolls data (looked for LPES_DATA: "
                    "/nonexistent/data/zeroscrolls/qasper.validation.jsonl)"},
        # ---- dtype= of any of our models: torch's AttributeError came after the config and tokenizer load
        lm_eval_row("dtype=float64x", arg + "dtype='float64x' is not a floating-point torch dtype; give auto, float32, "
                                            "bfloat16 or float16"),
        {**lm_eval_row("dtype=int8", arg + "dtype='int8' is not a floating-point torch dtype"),
         "args": ["--model", "mspoe_hf", "--model_args", "dtype=int8", "--tasks", "kv_retrieval", "--limit", "1",
                  "--output_path", "out"]},
        # ---- lpes-check: its model's arguments before the model loads
        check_row(["--model-args", "scales=-1"], "scales=-1: the scale must be a finite number > 0"),
        check_row(["--model-args", "scales=1;2"], "scales='1;2' gives 2 scales but the model has 30 decoder layers"),
        check_row(["--dtype", "float64x"], "dtype='float64x' is not a floating-point torch dtype"),
        check_row(["--dtype", "bfloat16", "--model-args", "dtype=float32"],
                  "give the dtype once: --dtype or dtype= in --model-args"),
        check_row(["--threads", "0"], "argument --threads: an integer >= 1, got '0'"),
        # ---- lpes-report (checks its inputs before it writes)
        {"tool": "lpes-report", "args": ["/nonexistent/results.json", "--out", "out"],
         "message": "lpes-report: error: '/nonexistent/results.json' does not exist; give a results JSON file or a folder of them"},
        {"tool": "lpes-report", "args": [p["no_results_here"], "--out", "out"],
         "message": f"lpes-report: error: '{p['no_results_here']}' holds no results*.json file"},
        {"tool": "lpes-report", "args": [p["results_not_json"], "--out", "out"],
         "message": f"lpes-report: error: {p['results_not_json']}: not JSON"},
        {"tool": "lpes-report", "args": [p["results_without_results"], "--out", "out"],
         "message": f"lpes-report: error: {p['results_without_results']}: no 'results' object; is this an lm-eval results file?"},
        {"tool": "lpes-report", "args": [p["valid_results"], "--history", "/nonexistent/history.jsonl", "--out", "out"],
         "message": "lpes-report: error: /nonexistent/history.jsonl: no such history file"},
        {"tool": "lpes-report", "args": [p["valid_results"], "--scales", f"bad={p['a_string_inside']}", "--out", "out"],
         "message": f"lpes-report: error: {p['a_string_inside']}: scale 1 is 'fast'"},
        # ---- searches/ga.py: what argparse already refuses (the rest: tests/test_search_validate.py)
        {"tool": "ga.py", "args": ["--population", "ten", "--output", "out"],
         "message": "lpes-search: error: argument --population: invalid int value: 'ten'"},
        {"tool": "ga.py", "args": ["--profile", "fast", "--output", "out"],
         "message": "lpes-search: error: argument --profile: invalid choice: 'fast'"},
        {"tool": "ga.py", "args": ["--fitness", "accuracy", "--output", "out"],
         "message": "lpes-search: error: argument --fitness: invalid choice: 'accuracy'"},
        {"tool": "ga.py", "args": ["--curve", "spline", "--output", "out"],
         "message": "lpes-search: error: argument --curve: invalid choice: 'spline'"},
    ]
    for row in rows:
        row.setdefault("empty_folders_allowed", False)
        row.setdefault("limit", {"ga.py": GA_LIMIT_S, "lpes-report": REPORT_LIMIT_S}.get(row["tool"], LM_EVAL_LIMIT_S))
    return rows


def command(row) -> list[str]:
    tool = row["tool"]
    if tool == "ga.py":
        return [sys.executable, str(REPO_ROOT / "searches" / "ga.py"), *row["args"]]
    if tool == "lpes-eval -S":
        # No site: no .pth start-up hook. lpes-eval must install the checks itself.
        code = (
            "import sys; sys.path.append(sys.argv.pop(1)); "
            "assert 'lpes_harness.lmeval.startup' not in sys.modules; "
            "from lpes_harness.commands.eval import main; sys.argv[0] = 'lpes-eval'; main()"
        )
        return [sys.executable, "-S", "-c", code, _site_packages(), *row["args"]]
    return [str(BIN / tool), *row["args"]]


def run_row(index: int, row: dict, root: Path) -> dict:
    folder = root / f"row{index:02d}"
    folder.mkdir()
    env = dict(ENV, **row.get("env", {}))
    if row["tool"] == "lpes-eval -S":
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    started = time.perf_counter()
    done = subprocess.run(command(row), cwd=folder, capture_output=True, text=True, env=env, timeout=120)
    seconds = time.perf_counter() - started
    written = sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))
    files = [name for name in written if not (folder / name).is_dir()]
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "seconds": seconds, "written": written, "files": files}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_inputs")
    paths = inputs(root / "inputs")
    rows = table(paths)
    runs = root / "runs"
    runs.mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda item: run_row(item[0], item[1], runs), enumerate(rows)))
    inputs_after = sorted(os.listdir(root / "inputs"))
    return rows, outcomes, inputs_after, sorted(paths)


ROW_COUNT = len(table({key: f"<{key}>" for key in (
    "not_json", "dict_without_scales", "scales_not_a_list", "a_number", "empty_list", "a_string_inside",
    "a_negative_inside", "num_layers_mismatch", "three_scales", "results_not_json", "results_without_results",
    "valid_results",
    "config_only_model", "no_results_here", "bundled_gguf")}))


def test_the_table_has_at_least_25_command_line_rows():
    assert ROW_COUNT >= 25


@pytest.mark.parametrize("index", range(ROW_COUNT))
def test_bad_input_row(results, index):
    rows, outcomes, _, _ = results
    row, outcome = rows[index], outcomes[index]
    label = f"{row['tool']} {' '.join(row['args'])}"
    stderr = outcome["stderr"]
    assert outcome["returncode"] == 2, (label, stderr[-2000:])
    assert "Traceback" not in stderr, (label, stderr[-2000:])
    error_lines = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(error_lines) == 1, (label, stderr[-2000:])
    assert error_lines[0].startswith(row["message"]), (label, error_lines[0])
    assert outcome["seconds"] < row["limit"], (label, f"{outcome['seconds']:.1f} s")
    assert outcome["files"] == [], (label, outcome["written"])
    if not row["empty_folders_allowed"]:
        assert outcome["written"] == [], (label, outcome["written"])


def test_lpes_report_makes_no_folder(results):
    rows, outcomes, _, _ = results
    for row, outcome in zip(rows, outcomes):
        if row["tool"] == "lpes-report":
            assert outcome["written"] == [], (row["args"], outcome["written"])


def test_no_row_touched_its_inputs(results):
    _, _, inputs_after, _ = results
    assert "out" not in inputs_after and len(inputs_after) == 14
