"""A search run (``lpes-search``, or ``python searches/ga.py``): its stages, in the order they run.

Each stage is one call, and its module says what it reads, what it writes to the run folder and what it
returns; they share the :class:`~lpes_harness.search.run_context.Run` the start makes.

1. start (:func:`~lpes_harness.search.run_start.start`): the folder claimed, a resume checked, the model
   and fitness loaded, the estimate or ``--time-budget``'s plan, ``config.json``;
2. sweep (:func:`~lpes_harness.search.sweep.sweep_stage`): uniform factors scored, the search's start;
3. search (:func:`~lpes_harness.search.search_stage.search_stage`): the genetic search; or, with
   ``--search-method gradient``, :func:`~lpes_harness.search.gradient_stage.gradient_stage`; with
   ``--search-method racing``, :func:`~lpes_harness.search.racing_stage.racing_stage`;
4. uniform (:func:`~lpes_harness.search.uniform_tuning.uniform_stage`): the best uniform factor on the
   search's budget;
5. validation (:func:`~lpes_harness.search.selection.validation_stage`): the run's curve chosen on
   validation samples, written as ``scales.json``;
6. held-out (:func:`~lpes_harness.search.heldout.heldout_stage`): the paired table on held-out samples.

Every stage resumes: ``--resume`` runs them all again, and each reads back what it had scored.
The command (its flags, ``--status``, Ctrl-C): :mod:`lpes_harness.commands.search`.
"""

from __future__ import annotations

import argparse
import contextlib
import time

from lpes_harness.core.files import atomic_write_json
from lpes_harness.search.gradient_stage import gradient_stage
from lpes_harness.search.heldout import heldout_stage
from lpes_harness.search.racing_stage import racing_stage
from lpes_harness.search.run_context import Run
from lpes_harness.search.run_record import add_run_seconds
from lpes_harness.search.run_start import start
from lpes_harness.search.search_stage import search_stage
from lpes_harness.search.selection import validation_stage
from lpes_harness.search.sweep import sweep_stage
from lpes_harness.search.uniform_tuning import uniform_stage


def run(args: argparse.Namespace) -> dict:
    """The run of the parsed flags; its ``result.json`` (``{}`` where this process ran no stage)."""
    with contextlib.ExitStack() as folder_lock:  # released however the run ends, a refusal too
        run = start(args, folder_lock)
        if run is None:  # --estimate, or one of accelerate's other ranks, which served rank 0
            return {}
        sweep = sweep_stage(run)
        searcher = {"gradient": gradient_stage, "racing": racing_stage}.get(run.args.search_method, search_stage)
        result, history = searcher(run, sweep)
        tuned = uniform_stage(run, sweep, history, result)
        chosen = validation_stage(run, sweep, history, tuned, result)
        _save_result(run, result)
        heldout_stage(run, sweep, chosen, result)
        forwards = result["forwards"]
        print(f"forwards: {forwards['total']} ({', '.join(f'{k} {v}' for k, v in forwards.items() if k != 'total')})"
              f"{', then the held-out table' if 'heldout' in result else ''}", flush=True)
        return result


def _save_result(run: Run, result: dict) -> None:
    """``result.json`` once the run's curve is chosen: the forwards of every stage, and the times."""
    result["forwards"] = {**run.forwards, "total": sum(run.forwards.values())}
    result["total_seconds"] = round(time.perf_counter() - run.launched, 1)  # this process: load + sweep + GA + final choice
    add_run_seconds(result, run.record_path, "run_seconds")
    atomic_write_json(run.output / "result.json", result)
    print(f"scales written to {run.output / 'scales.json'}; use: lm_eval --model lpes_hf --model_args "
          f"scales={run.output / 'scales.json'}")
