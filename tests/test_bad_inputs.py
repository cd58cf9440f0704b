"""Bad input is one line before the model loads: a table of bad inputs through the real command lines.

Each row runs a console script of the venv (``lm_eval``, ``lpes-eval``, ``lpes-check``, ``lpes-report``,
``lpes-search``, ``searches/ga.py``) or a command module (``python -m lpes_harness.commands.X``) in a
fresh empty folder, and asserts the exit code (2, as argparse), one ``error:`` line naming the
argument, the value and what is allowed, no traceback, and that nothing was written: neither in
that folder (the working directory, and ``--output_path`` / ``--out`` inside it) nor anywhere else
the row could reach, its input files included.

"Before the model loads" is shown, not timed: every row runs with :data:`LOAD_GUARD` as its
``sitecustomize``, which ends the process with exit 97 the moment transformers is asked to load a
model or a tokenizer (``from_pretrained``), so a row that got that far fails on its exit code
(:func:`test_the_load_guard_stops_a_load` shows the guard works). How long the rows take is
``benchmarks/``' business, not a unit test's.

The rows run two at a time: each is a whole interpreter start.
"""

from __future__ import annotations

import json
import os
import hashlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO_ROOT

BIN = Path(sys.executable).parent
ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
LOADED = 97  # the exit code of a row that reached a model load
LOAD_GUARD = f'''"""sitecustomize of the bad-input rows: a model or tokenizer load ends the process (exit {LOADED})."""
import importlib.abc
import os
import sys

WATCHED = {{"transformers.modeling_utils": "PreTrainedModel",
           "transformers.tokenization_utils_base": "PreTrainedTokenizerBase"}}


def _refuse(*args, **kwargs):
    sys.stderr.write("load guard: a model or tokenizer load was reached\\n")
    sys.stderr.flush()
    os._exit({LOADED})


class _Guard(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WATCHED:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            setattr(getattr(module, WATCHED[name]), "from_pretrained", classmethod(_refuse))

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Guard())
'''


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
    (folder / "empty_folder").mkdir(exist_ok=True)  # not a model: no config.json, no .gguf
    paths["empty_folder"] = str(folder / "empty_folder")
    from lpes_harness.core.models import BUNDLED_GGUF, bundled_model_dir

    paths["bundled_gguf"] = os.path.join(bundled_model_dir(), BUNDLED_GGUF)
    # The bundled GGUF cut short, as an interrupted download leaves it: inside its tensors' data (the
    # header whole), and inside the header (its vocabulary).
    with open(paths["bundled_gguf"], "rb") as whole:
        head = whole.read(CUT_IN_THE_DATA)
    for name, size in (("cut_gguf", CUT_IN_THE_DATA), ("header_cut_gguf", CUT_IN_THE_HEADER)):
        (folder / f"{name}.gguf").write_bytes(head[:size])
        paths[name] = str(folder / f"{name}.gguf")
    return paths


CUT_IN_THE_DATA = 4 << 20  # SmolLM2's header ends before 2 MB
CUT_IN_THE_HEADER = 64 << 10
ACCEPTED = ("give a packaged model (smollm2, gemma3-270m), a folder with config.json, a .gguf file or a Hugging "
            "Face id (org/name)")


def lm_eval_row(model_args, message, *, tool="lm_eval"):
    return {"tool": tool, "args": ["--model", "lpes_hf", "--model_args", model_args, "--tasks", "kv_retrieval",
                                   "--limit", "1", "--output_path", "out"],
            "message": message}


def metadata_row(tasks, metadata, message, *, model="lpes_hf"):
    return {"tool": "lm_eval", "args": ["--model", model, "--tasks", tasks, "--metadata", json.dumps(metadata),
                                       "--limit", "1", "--output_path", "out"],
            "message": "lm_eval: error: argument --metadata: " + message}


def module_row(command, args, message):
    """``python -m lpes_harness.commands.<command>``: its parser's shared flags."""
    return {"tool": f"-m lpes_harness.commands.{command}", "args": args,
            "message": f"python -m lpes_harness.commands.{command}: error: {message}"}


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
        check_row(["--dtype", "float64x"], "argument --dtype: 'float64x' is not a floating-point torch dtype; give auto, "
                                           "float32, bfloat16 or float16"),
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
        *model_rows(p),
        *shared_flag_rows(p),
    ]
    for row in rows:
        row.setdefault("empty_folders_allowed", False)
    return rows


def model_rows(p: dict[str, str]) -> list[dict]:
    """The model a user names, refused before it loads (issue #99): a path that does not exist, a folder that
    is no model, a GGUF cut short; and a method's own missing argument. Each used to be a 33-53 line
    traceback after 6-16 s of imports (after the model load, for --output)."""
    arg = "lm_eval: error: argument --model_args: "
    search = "lpes-search: error: argument --pretrained: "
    cut = f"'{p['cut_gguf']}' is cut short: it has {CUT_IN_THE_DATA} bytes, its tensors need "
    return [
        {"tool": "lpes-search", "args": ["--pretrained", "/no/such/dir", "--output", "out"],
         "message": search + f"'/no/such/dir' does not exist; {ACCEPTED}"},
        {"tool": "lpes-search", "args": ["--pretrained", p["empty_folder"], "--output", "out"],
         "message": search + f"'{p['empty_folder']}' is a folder without config.json (not a Hugging Face model "
                             f"folder); {ACCEPTED}"},
        {"tool": "lpes-search", "args": ["--pretrained", p["cut_gguf"], "--output", "out"], "message": search + cut},
        {"tool": "lpes-search", "args": ["--output", p["a_number"]],
         "message": f"lpes-search: error: argument --output: '{p['a_number']}' is a file; give a folder to write into"},
        {"tool": "lpes-search", "args": ["--output", f"{p['a_number']}/run"],
         "message": f"lpes-search: error: argument --output: '{p['a_number']}/run' is under a file"},
        lm_eval_row(f"pretrained={p['empty_folder']}",
                    arg + f"pretrained='{p['empty_folder']}' is a folder without config.json"),
        lm_eval_row(f"pretrained={p['cut_gguf']}", arg + "pretrained=" + cut),
        lm_eval_row(f"pretrained={p['header_cut_gguf']}",
                    arg + f"pretrained='{p['header_cut_gguf']}' is cut short: its {CUT_IN_THE_HEADER} bytes end "
                          f"inside the header"),
        lm_eval_row("pretrained=/no/such/dir,scales=1.2", arg + f"pretrained='/no/such/dir' does not exist; {ACCEPTED}"),
        lm_eval_row(f"pretrained={p['empty_folder']}", "lpes-eval: error: argument --model_args: "
                    f"pretrained='{p['empty_folder']}' is a folder without config.json", tool="lpes-eval -S"),
        {"tool": "lm_eval", "args": ["--model", "poshidden_hf", "--tasks", "multi_needle", "--limit", "1",
                                     "--output_path", "out"],
         "message": arg + "poshidden_hf needs the channel to scale: setting=<file from"},
        {"tool": "lm_eval", "args": ["--model", "mspoe_hf", "--model_args", "min_ratio=-1", "--tasks", "multi_needle",
                                     "--limit", "1", "--output_path", "out"],
         "message": arg + "mspoe_hf: min_ratio=-1 is out of range"},
        check_row(["--pretrained", p["cut_gguf"]], "argument --pretrained: " + cut),
        check_row(["--pretrained", "/no/such/dir"], f"argument --pretrained: '/no/such/dir' does not exist; {ACCEPTED}"),
    ]


def shared_flag_rows(p: dict[str, str]) -> list[dict]:
    """The shared flags (lpes_harness/commands/flags.py) refuse alike in every command that takes them."""
    scales = ["--scales", p["three_scales"]]
    missing = "argument --pretrained: '/no/such/dir' does not exist"
    return [
        check_row(["--dtype", "half"], "argument --dtype: 'half' is not a dtype the commands load in; give auto, "
                                       "float32, bfloat16 or float16"),
        check_row(["--metadata", "[1]"], "argument --metadata: '[1]' is not a JSON object; give the task's options"),
        check_row(["--metadata", "{oops"], "argument --metadata: '{oops' is not valid JSON"),
        check_row(["--grid", '{"num_sentences": [4]}', "--out", p["a_number"]],
                  f"argument --out: '{p['a_number']}' is a file; give a folder to write into"),
        {"tool": "lpes-search", "args": ["--device", "gpu", "--output", "out"],
         "message": "lpes-search: error: argument --device: 'gpu' is not a device; give cpu, cuda, cuda:N or mps"},
        {"tool": "lpes-search", "args": ["--threads", "0", "--output", "out"],
         "message": "lpes-search: error: argument --threads: an integer >= 1, got '0'"},
        module_row("paired", [*scales, "--output", "out", "--pretrained", "/no/such/dir"], missing),
        module_row("paired", [*scales, "--output", p["a_number"]], f"argument --output: '{p['a_number']}' is a file"),
        module_row("transfer", ["--scales", f"a={p['three_scales']}", "--condition", "x={}", "--output", "out",
                                "--pretrained", "/no/such/dir"], missing),
        module_row("tune", ["--uniform", "--output", "out", "--pretrained", p["empty_folder"]],
                   f"argument --pretrained: '{p['empty_folder']}' is a folder without config.json"),
        module_row("tune", ["--uniform", "--output", "out", "--metadata", "[]"], "argument --metadata: '[]' is not a JSON object"),
        module_row("layer_types", [*scales, "--output", "out", "--pretrained", p["header_cut_gguf"]],
                   f"argument --pretrained: '{p['header_cut_gguf']}' is cut short"),
        module_row("poshidden_channel", ["--out", "out/setting.json", "--pretrained", "/no/such/dir"], missing),
        module_row("poshidden_channel", ["--out", "out/setting.json", "--dtype", "int8"],
                   "argument --dtype: 'int8' is not a floating-point torch dtype"),
        module_row("train_moice", ["--out", "out/gates.pt", "--pretrained", p["cut_gguf"]],
                   f"argument --pretrained: '{p['cut_gguf']}' is cut short"),
        module_row("train_moice", ["--out", "out/gates.pt", "--device", "gpu0"], "argument --device: 'gpu0' is not a device"),
        module_row("attention", ["--out", "out", "--pretrained", "/no/such/dir"], missing),
        module_row("rsm", ["--out", p["a_number"]], f"argument --out: '{p['a_number']}' is a file"),
    ]


def command(row) -> list[str]:
    tool = row["tool"]
    if tool == "ga.py":
        return [sys.executable, str(REPO_ROOT / "searches" / "ga.py"), *row["args"]]
    if tool.startswith("-m "):
        return [sys.executable, "-m", tool[3:], *row["args"]]
    if tool == "lpes-eval -S":
        # No site: no .pth start-up hook. lpes-eval must install the checks itself. Nor a sitecustomize:
        # the load guard is imported by hand.
        code = (
            "import sys; import sitecustomize; sys.path.append(sys.argv.pop(1)); "
            "assert 'lpes_harness.lmeval.startup' not in sys.modules; "
            "from lpes_harness.commands.eval import main; sys.argv[0] = 'lpes-eval'; main()"
        )
        return [sys.executable, "-S", "-c", code, _site_packages(), *row["args"]]
    return [str(BIN / tool), *row["args"]]


def guarded_env(guard: Path, extra: dict | None = None) -> dict[str, str]:
    """The rows' environment: offline, and :data:`LOAD_GUARD` (in ``guard``) first on the path."""
    env = dict(ENV, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(guard), str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_row(index: int, row: dict, root: Path, guard: Path) -> dict:
    folder = root / f"row{index:02d}"
    folder.mkdir()
    done = subprocess.run(command(row), cwd=folder, capture_output=True, text=True, env=guarded_env(guard, row.get("env")),
                          timeout=300)
    written = sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))
    files = [name for name in written if not (folder / name).is_dir()]
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "written": written, "files": files}


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder``: its contents' hash (a folder: '')."""
    return {str(path.relative_to(folder)): "" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def load_guard(tmp_path_factory) -> Path:
    guard = tmp_path_factory.mktemp("load_guard")
    (guard / "sitecustomize.py").write_text(LOAD_GUARD)
    return guard


@pytest.fixture(scope="module")
def results(tmp_path_factory, load_guard):
    root = tmp_path_factory.mktemp("bad_inputs")
    paths = inputs(root / "inputs")
    before = snapshot(root / "inputs")
    rows = table(paths)
    runs = root / "runs"
    runs.mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda item: run_row(item[0], item[1], runs, load_guard), enumerate(rows)))
    return rows, outcomes, snapshot(root / "inputs"), before


INPUT_NAMES = ("not_json", "dict_without_scales", "scales_not_a_list", "a_number", "empty_list", "a_string_inside",
               "a_negative_inside", "num_layers_mismatch", "three_scales", "results_not_json", "results_without_results",
               "valid_results", "config_only_model", "no_results_here", "empty_folder", "bundled_gguf", "cut_gguf",
               "header_cut_gguf")
ROW_COUNT = len(table({key: f"<{key}>" for key in INPUT_NAMES}))


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
    if not row["tool"].startswith(("lm_eval", "lpes-eval")):  # lm-eval logs warnings of its own beside it
        assert stderr.strip() == error_lines[0], (label, stderr[-2000:])  # the one line, no usage block above it
    assert outcome["files"] == [], (label, outcome["written"])
    if not row["empty_folders_allowed"]:
        assert outcome["written"] == [], (label, outcome["written"])


def test_lpes_report_makes_no_folder(results):
    rows, outcomes, _, _ = results
    for row, outcome in zip(rows, outcomes):
        if row["tool"] == "lpes-report":
            assert outcome["written"] == [], (row["args"], outcome["written"])


def test_no_row_touched_its_inputs(results):
    _, _, inputs_after, inputs_before = results
    assert "out" not in inputs_after and inputs_after == inputs_before  # none added, removed or changed
    assert len([name for name in inputs_after if os.sep not in name]) == len(INPUT_NAMES) - 1  # the bundled GGUF is elsewhere


@pytest.mark.parametrize("load", ["AutoModelForCausalLM", "AutoTokenizer"])
def test_the_load_guard_stops_a_load(load, load_guard, tmp_path):
    """The guard the rows run under ends a process that reaches a load: a row's exit 2 shows that none did."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 8,
                                                    "intermediate_size": 8, "num_attention_heads": 1, "vocab_size": 16}))
    code = f"import transformers; transformers.{load}.from_pretrained({str(model)!r}); print('loaded')"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env=guarded_env(load_guard), timeout=300)
    assert done.returncode == LOADED and "load guard: a model or tokenizer load was reached" in done.stderr, done.stderr[-2000:]
    assert "loaded" not in done.stdout
