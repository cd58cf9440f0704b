"""Tune a baseline's settings on the *search* split, with LPES's own fitness (issue #29, item 3).

    python -m lpes_harness.commands.tune --baseline Ms-PoE=mspoe_hf \\
        --grid '{"min_ratio": [1.0, 1.1, 1.2], "max_ratio": [1.2, 1.4, 1.8]}' --output results/tune_mspoe
    python -m lpes_harness.commands.tune --uniform 0.6,0.7,0.8,0.9,1.1 --output results/tune_pi

LPES chooses its curve on the search split and is judged on the held-out one; a baseline run
only at its authors' settings is not given the same chance. This command scores every setting
of a grid (the Cartesian product of ``--grid``, plus ``--fixed``) on the search samples through
:func:`lpes_harness.evaluation.paired.score_methods`, ranks them by the search's weighted fitness
(0.2·begin + 0.3·middle + 0.5·end over the task's roles) and writes the winner as a row spec for
the held-out table: ``--baseline "$(cat DIR/best.txt)"`` next to the authors' ``--baseline``.
``--uniform`` tunes PI, a uniform scale on the already loaded ``lpes_hf``, the same way.
Without ``--grid`` (or without values for ``--uniform``), the candidates are the method's grid in
the table of methods (:data:`lpes_harness.methods.METHODS`), which also names the row.

Scores are kept in DIR/scores.cache.json every few samples, so a killed run resumes and a
second run scores nothing. The budget (forwards: one per sample scored) is recorded, so that it
can be set against the forwards of an LPES search.

The grid, the scoring, the ranking and the outputs are :mod:`lpes_harness.search.baseline_tuning`'s;
this module checks the flags, loads the model and prints.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from lpes_harness.evaluation.baseline_rows import parse_baseline
from lpes_harness.evaluation.paired import CACHE_FILE, cache_identity, held_layers_of, run_dtype
from lpes_harness.evaluation.score_cache import ScoreCache
from lpes_harness.methods import METHODS, grid_of, label_of, tuned_by_grid
from lpes_harness.commands import flags
from lpes_harness.search.baseline_tuning import (
    SPLIT, check_argument_names, expand_grid, parse_fixed, parse_grid, run_tuning, write_outputs,
)
from lpes_harness.search.fitness import task_roles

PROG = "python -m lpes_harness.commands.tune"
DESCRIPTION = (
    "Choose a baseline's settings (or PI's uniform scale) on the search split of a position task, by the "
    "search's weighted fitness 0.2*begin + 0.3*middle + 0.5*end; writes OUTPUT/tuning.{json,md} and "
    "OUTPUT/best.txt, the winner as a row for python -m lpes_harness.commands.paired. Scores are kept in "
    "OUTPUT/scores.cache.json: run the same command again to resume."
)


def build_parser() -> argparse.ArgumentParser:
    p = flags.CommandParser(prog=PROG, description=DESCRIPTION)
    p.add_argument("--baseline", default=None, metavar="[NAME=]MODEL[:ARGS]",
                   help="the baseline to tune, e.g. Ms-PoE=mspoe_hf (ARGS, if any, are held fixed like --fixed)")
    p.add_argument("--grid", default=None,
                   help='JSON: argument -> list of values, e.g. \'{"min_ratio": [1.0, 1.2], "max_ratio": [1.4, 1.8]}\'; '
                        "every combination is a candidate (lists inside a value become ';'-joined, e.g. bases); "
                        f"default: the method's grid in the table of methods ({', '.join(tuned_by_grid())})")
    p.add_argument("--fixed", default="", help="arguments every candidate shares, 'k=v,k=v' (e.g. head_mapping=rank)")
    p.add_argument("--uniform", default=None, nargs="?", const="",
                   help="tune PI instead: uniform scales on the loaded lpes_hf, e.g. 0.6,0.7,0.8,0.9,1.1 "
                        f"(alone: PI's grid, {','.join(f'{v:g}' for v in METHODS['pi'].grid['scales'])})")
    p.add_argument("--layer-type", default=None,
                   help="with --uniform: scale only the layers of this attention type (e.g. full_attention, "
                        "Gemma-3's global layers), the others at 1, as the search's --layer-type does")
    p.add_argument("--name", default=None,
                   help="the row name (default: NAME of --baseline, else the method's label; PI for --uniform)")
    flags.add_task(p, "multi_needle")
    flags.add_metadata(p)
    p.add_argument("--num-samples", type=int, default=20,
                   help="search samples per position (default 20, the cpu-bf16 search's)")
    flags.add_pretrained(p)
    flags.add_dtype(p, "auto")
    p.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"])
    flags.add_threads(p)
    p.add_argument("--output", type=flags.output_folder, required=True, help="directory for tuning.{json,md}, best.txt and scores.cache.json")
    return p


def check_args(args) -> dict:
    """Every setting checked before anything loads or is written; returns what the run needs."""
    if (args.baseline is None) == (args.uniform is None):
        raise ValueError(f"give either --baseline NAME=MODEL (a grid of its own with --grid, or the table's for "
                         f"{', '.join(tuned_by_grid())}), or --uniform for PI")
    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be >= 1, got {args.num_samples}")
    try:
        metadata = json.loads(args.metadata)
    except json.JSONDecodeError as err:
        raise ValueError(f"--metadata is not valid JSON ({err.msg})") from None
    if not isinstance(metadata, dict) or {"split", "num_samples"} & set(metadata):
        raise ValueError("--metadata must be a JSON object without 'split' or 'num_samples' (set by this command)")
    roles = task_roles(args.task)  # an unknown task: TaskDataError, a ValueError naming it
    settings = {"task": args.task, "split": SPLIT, "num_samples": args.num_samples, "metadata": metadata}
    if args.uniform is not None:
        if args.grid or args.fixed:
            raise ValueError("--uniform tunes PI alone: leave out --grid and --fixed")
        held = held_layers_of(args.pretrained, args.layer_type)  # a type the model lacks: named before it loads
        try:
            text = args.uniform or ",".join(map(str, METHODS["pi"].grid["scales"]))
            values = list(dict.fromkeys(float(v) for v in text.split(",") if v.strip()))
        except ValueError:
            raise ValueError(f"--uniform {args.uniform!r}: give numbers separated by ','") from None
        if not values or any(not math.isfinite(v) or v <= 0 for v in values):
            raise ValueError(f"--uniform {args.uniform!r}: give one or more finite scales > 0")
        layers = {"layer_type": args.layer_type, "held_layers": list(held)} if args.layer_type else {}
        return {**settings, "mode": "uniform", "name": args.name or METHODS["pi"].label, "model": "lpes_hf",
                "values": values, **layers, "roles_map": roles}
    if args.layer_type:
        raise ValueError("--layer-type goes with --uniform (PI); a baseline model's layers are its own arguments")
    name, baseline = parse_baseline(args.baseline)
    if args.grid is None and grid_of(baseline.model) is None:
        raise ValueError(f"--baseline {baseline.model} needs --grid (JSON: argument -> list of values): the table of "
                         f"methods has a grid for {', '.join(tuned_by_grid())} only")
    grid = parse_grid(args.grid if args.grid is not None else json.dumps(grid_of(baseline.model)))
    fixed = {**parse_fixed(baseline.args), **parse_fixed(args.fixed)}
    check_argument_names(baseline.model, [*fixed, *grid])
    name = args.name or (name if name != baseline.spec else label_of(baseline.model))
    return {**settings, "mode": "baseline", "name": name, "model": baseline.model, "grid": grid, "fixed": fixed,
            "arg_strings": expand_grid(grid, fixed), "roles_map": roles}


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)

    def fail(message) -> None:  # one line, exit 2, nothing written
        parser.exit(2, f"{PROG}: error: {' '.join(str(message).split())}\n")

    try:
        plan = check_args(args)
        dtype = run_dtype(args.dtype, {})
        identity = {**cache_identity(args.task, plan["metadata"], args.chat_template, args.pretrained, dtype),
                    "split": SPLIT}
        cache = ScoreCache(Path(args.output) / CACHE_FILE, identity)  # refuses another run's samples, writes nothing
    except ValueError as err:
        fail(err)
    roles = plan.pop("roles_map")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from lpes_harness.lmeval.lpes_lm import LPESLM

    try:
        lm = LPESLM(pretrained=args.pretrained, dtype=dtype)
    except OSError as err:  # a model that is not there (or its package missing): one line, nothing written
        fail(f"--pretrained {args.pretrained}: {err}")
    try:
        result = run_tuning(lm, plan, roles, cache, chat_template=args.chat_template, pretrained=args.pretrained,
                            dtype=dtype)
    except ValueError as err:  # e.g. a cached block made for other samples, or every candidate refused
        fail(err)
    paths = write_outputs(Path(args.output), result)
    for c in result["candidates"]:
        if "refused" in c:
            print(f"skipped {c['args']}: {c['refused']}")
    winner, budget = result["winner"], result["budget"]
    print(f"best: {result['best']} (fitness {winner['fitness']:.4f}; vanilla {result['reference']['fitness']:.4f}); "
          f"{budget['candidates_scored']} of {budget['candidates']} candidates scored, {budget['forwards']} forwards "
          f"(+{budget['reference_forwards']} vanilla), {budget['scored_now']} scored now; "
          f"written {paths['json']}, {paths['md']}, {paths['best']}")


if __name__ == "__main__":
    main()
