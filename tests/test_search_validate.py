"""A search's settings are refused before anything loads, with one line naming the flag and what is allowed."""

import argparse
import json
import subprocess
import sys

import pytest

from lpes_harness.search.validate import check_search_args

# searches/ga.py's defaults (the paper profile), as its parser gives them.
PAPER = dict(
    pretrained=None, model_args="", device=None, batch_size=1, threads=None, task="kv_retrieval", fitness="greedy",
    weights="0.2,0.3,0.5", positions=None, num_samples=200, metadata="{}", chunk_size=25, racing=True,
    scorer="answer-logits", population=32, parents=12, mutants=16, crossovers=4, generations=20, mx=2.0, my=0.2,
    crossover_tries=4, seed=0, mutation="paper", curve="bezier", control_points=4, brute_force=False, y_min=1.0,
    y_max=2.0, y_step=0.1, initial_y=1.5,
)
CPU = dict(PAPER, fitness="logprob", num_samples=20, chunk_size=10, population=10, parents=4, mutants=5, crossovers=1,
           generations=4, y_min=0.6, y_max=1.6, initial_y=1.0)


def args(**changes):
    return argparse.Namespace(**dict(PAPER, **changes))


@pytest.mark.parametrize("settings", [PAPER, CPU, dict(PAPER, brute_force=True, mx=0.0), dict(PAPER, batch_size="auto")])
def test_the_profiles_pass(settings):
    check_search_args(argparse.Namespace(**settings))


ROWS = [
    (dict(population=0), "--population 0: must be an integer >= 1"),
    (dict(parents=0), "--parents 0: must be an integer >= 1"),
    (dict(mutants=-1), "--mutants -1: must be an integer >= 0"),
    (dict(crossovers=-2), "--crossovers -2: must be an integer >= 0"),
    (dict(generations=-1), "--generations -1: must be an integer >= 0"),
    (dict(crossover_tries=0), "--crossover-tries 0: must be an integer >= 1"),
    (dict(num_samples=0), "--num-samples 0: must be an integer >= 1"),
    (dict(chunk_size=0), "--chunk-size 0: must be an integer >= 1"),
    (dict(control_points=1), "--control-points 1: must be an integer >= 2"),
    (dict(control_points=9), "--control-points 9: must be 2..8"),
    (dict(population=33), "--population 33: must equal --parents + --crossovers + --mutants (12 + 4 + 16 = 32)"),
    (dict(parents=40, population=35), "--parents 40: must be at most --population (35)"),
    (dict(parents=1, population=21), "--crossovers 4: crossover needs --parents >= 2, got 1"),
    (dict(y_min=2.0, y_max=1.0), "--y-min 2.0 --y-max 1.0: the y range is empty; give --y-min <= --y-max"),
    (dict(y_min=0.0), "--y-min 0.0: must be a finite number > 0"),
    (dict(y_max=float("inf")), "--y-max inf: must be a finite number"),
    (dict(y_step=0.0), "--y-step 0.0: must be a finite number > 0"),
    (dict(initial_y=-1.0), "--initial-y -1.0: must be a finite number > 0"),
    (dict(mx=-1.0), "--mx -1.0: must be a finite number >= 0"),
    (dict(my=float("nan")), "--my nan: must be a finite number >= 0"),
    (dict(mx=0.5, my=0.05), "--my 0.05: below the y step 0.1, and x cannot move (--mx 0.5): a mutation could move nothing"),
    (dict(mutation="wide"), "--mutation 'wide' is not one of paper, joint"),
    (dict(threads=0), "--threads 0: must be an integer >= 1"),
    (dict(batch_size="big"), "--batch-size 'big': must be an integer >= 1 or 'auto'"),
    (dict(batch_size="auto:4"), "--batch-size 'auto:4': must be an integer >= 1 or 'auto'"),
    (dict(model_args="scales=1.2"), "--model-args 'scales=1.2': scales cannot be given to a search"),
    (dict(model_args="dtype"), "--model-args 'dtype': 'dtype' is not key=value"),
]


@pytest.mark.parametrize("changes, message", ROWS, ids=[m.split(":")[0] for _, m in ROWS])
def test_bad_settings_are_one_line_naming_the_flag(changes, message):
    with pytest.raises(ValueError) as caught:
        check_search_args(args(**changes))
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_control_points_must_fit_the_models_layers_read_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    check_search_args(args(pretrained=str(tmp_path), control_points=4))
    with pytest.raises(ValueError, match="--control-points 5: a 4-layer model has 4 x positions"):
        check_search_args(args(pretrained=str(tmp_path), control_points=5))


# What a check that runs before anything loads must not import (each takes seconds to load).
HEAVY = ("torch", "transformers", "lm_eval", "datasets", "accelerate", "matplotlib")


def test_the_check_imports_no_torch_nor_any_other_heavy_library():
    """Why the check is instant: it loads no model library. (How long it takes is benchmarks/startup.py's to
    time, not a unit test's.)"""
    code = (
        "import sys, argparse;"
        "from lpes_harness.search.validate import check_search_args;"
        f"check_search_args(argparse.Namespace(**{PAPER!r}));"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported: {done.stdout.strip()}"
