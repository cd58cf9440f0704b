"""The robust efficiency table (issue #100 item 4): held-out gain over lengths against search forwards.

    python benchmarks/robust_efficiency.py --output results/robust_efficiency           # score and report
    python benchmarks/robust_efficiency.py --output results/robust_efficiency --plan    # the curves only, no model

Each robust search on SmolLM2 already on record journals every evaluation it made, in order, with the
forwards it cost: the GA's ``sweep.json`` and ``history.jsonl`` (the CPU profile ``robust-smollm2``, seeds 1-3,
and the GPU profile ``robust-smollm2-gpu``, seeds 1-3), the gradient search's ``gradient.jsonl`` (seed 4) and
the race's ``result.json`` (the default, ``racing-smollm2``, every item, seeds 4-6). A search without a
forward budget does not know where it will stop, so a run's first B forwards are the run it would have
made at budget B, and its best at B is the best *complete* evaluation among them by its own search
fitness (a gradient step: the lowest loss among the steps it kept), as ``benchmarks/search_efficiency.py``
reads its own journal: the evaluation that crosses B still counts, so a row may use one evaluation more
than B. No search is rerun. The race has one budget, its own (576 forwards), and no best before its end.
One more cell, ``final``, holds the row to beat: the GPU profile's seed 1 ``scales.json`` as the user got it (after
its ``uniform.json`` and validation; the budget column gives its search forwards).

Each distinct curve is written to ``OUTPUT/curves/`` and scored beside vanilla on the same fresh held-out
samples per condition by ``python -m lpes_harness.commands.transfer`` (resumable: its per-condition score
caches live under ``OUTPUT``); the report (``efficiency.md``, ``efficiency.json``, ``efficiency.png``) gives per
method, budget and seed the forwards used, the gain over vanilla with its 95 % interval and exact McNemar p
per condition, the worst condition and the pooled gain (``commands.pooled``'s test over all conditions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
LAYERS = 30  # SmolLM2-135M; every recorded run below is on it

# (method, seed, folder, journal kind): the recorded robust searches on SmolLM2
RUNS = [
    *[("ga-cpu", seed, f"robust_smollm2_seed{seed}", "ga") for seed in (1, 2, 3)],
    *[("ga-gpu", seed, f"robust_smollm2_gpu_seed{seed}", "ga") for seed in (1, 2, 3)],
    *[("gradient", seed, f"gradient_smollm2_seed{seed}", "gradient") for seed in (4, 5, 6)],
    *[("race", seed, f"every_item_smollm2_seed{seed}", "race") for seed in (4, 5, 6)],
]
# The race's budget (the default's search) and the largest; 1,000 moved one GA seed only (seed 2, #3 -> #6)
BUDGETS = (576, 1500)
# The row to beat (issue #100): the GPU profile's seed 1 as the user got it (validation-chosen, 6,984 search forwards)
REFERENCE = ("ga-gpu", 1)
# Issue #100's bar lengths and its 16 needles (item 7); 60 and 240 sentences, fixed search conditions of both
# GA profiles, are left out for time (a 2-core CPU scores ~1.5 s a sample at 120 sentences, ~4 at 300)
CONDITIONS = {"120 sentences": {"num_sentences": 120}, "180 sentences": {"num_sentences": 180},
              "300 sentences": {"num_sentences": 300}, "16 needles": {"num_needles": 16}}


def uniform_point(kind: str, scale: float) -> list[float]:
    """A sweep point of a ``both`` search as its 2L factors (positions first)."""
    position = [scale if kind == "position" else 1.0] * LAYERS
    base = [scale if kind == "base" else 1.0] * LAYERS
    return position + base


def ga_evaluations(folder: Path) -> list[dict]:
    """The GA's evaluations in the order it made them: the sweep's points, then every individual scored
    (one served from the cache cost nothing and is the same scales as an earlier row)."""
    sweep = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
    rows = [{"label": f"uniform {p['kind']} {p['scale']:g}", "scales": uniform_point(p["kind"], p["scale"]),
             "score": p["fitness"], "forwards": p["info"]["samples"], "complete": not p["info"].get("raced")}
            for p in sweep["points"]]
    for line in (folder / "history.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("cached"):
            continue
        rows.append({"label": f"#{row['index']}", "scales": row["scales"], "score": row["fitness"],
                     "forwards": row["info"]["samples"], "complete": not row["info"].get("raced")})
    return rows


def gradient_evaluations(folder: Path) -> list[dict]:
    """The gradient search's steps; a step's score is minus its loss (lower is better), a rejected step is
    not a candidate (the search went back from it), its forwards still count."""
    rows, before = [], 0
    for line in (folder / "gradient.jsonl").read_text(encoding="utf-8").splitlines():
        step = json.loads(line)  # its "forwards" are the run's so far, a backward counted as two
        rows.append({"label": f"step {step['step']}", "scales": step["factors"], "score": -step["loss"],
                     "forwards": step["forwards"] - before, "complete": not step["rejected"]})
        before = step["forwards"]
    return rows


def best_at(evaluations: list[dict], budget: float) -> dict | None:
    """The best complete evaluation among those started before ``budget`` forwards, with the forwards used."""
    used, best = 0, None
    for row in evaluations:
        if used >= budget:
            break
        used += row["forwards"]
        if row["complete"] and (best is None or row["score"] > best["score"]):
            best = row
    return None if best is None else {**best, "forwards_used": used}


def final_curve(folder: Path) -> dict:
    from lpes_harness.core.scales_file import read_scales_file

    data = json.loads((folder / "scales.json").read_text(encoding="utf-8"))
    return {"label": data.get("label") or "scales.json", "scales": read_scales_file(folder / "scales.json")}


def plan() -> list[dict]:
    """Every (method, seed, budget) cell: the curve its run held at that budget."""
    cells = []
    for method, seed, name, kind in RUNS:
        folder = RESULTS / name
        if kind == "race":
            race = json.loads((folder / "result.json").read_text(encoding="utf-8"))["racing"]
            curve = {**final_curve(folder), "forwards_used": race["forwards"]}
            cells.append({"method": method, "seed": seed, "budget": race["forwards"], "folder": name, **curve})
            continue
        evaluations = ga_evaluations(folder) if kind == "ga" else gradient_evaluations(folder)
        for budget in BUDGETS:
            best = best_at(evaluations, budget)
            cells.append({"method": method, "seed": seed, "budget": budget, "folder": name, **best})
        if (method, seed) != REFERENCE:
            continue
        total = sum(row["forwards"] for row in evaluations)
        cells.append({"method": method, "seed": seed, "budget": "final", "folder": name, "forwards_used": total,
                      "search_forwards": total, **final_curve(folder)})
    return cells


def curve_key(scales: list[float]) -> tuple:
    return tuple(round(float(s), 6) for s in scales)


def name_curves(cells: list[dict]) -> dict[tuple, str]:
    """One row name per distinct curve (the first cell that holds it names it); the plain model is vanilla."""
    names = {curve_key([1.0] * 2 * LAYERS): "vanilla"}
    for cell in cells:
        key = curve_key(cell["scales"])  # every run here searched both scalings: 2L factors
        # the CPU and GPU GA profiles of one seed draw the same first mutants: a curve is named for its search's
        # kind, seed and label, not its profile
        label = cell["label"].replace("LPES ", "").replace(" ", "").replace("#", "i")
        names.setdefault(key, f"{cell['method'].split('-')[0]}-s{cell['seed']}-{label}")
        cell["row"] = names[key]
    return names


def main(argv=None) -> None:
    from lpes_harness.commands import flags
    from lpes_harness.core.models import positive_int
    from lpes_harness.evaluation.conditions import slug

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=RESULTS / "robust_efficiency")
    parser.add_argument("--num-samples", type=positive_int, default=8,
                        help="held-out samples per gold position and condition")
    parser.add_argument("--seed", type=int, default=20261208, help="the held-out samples' metadata seed (no search used it)")
    parser.add_argument("--dtype", type=flags.dtype, default="bfloat16")
    parser.add_argument("--plan", action="store_true", help="write the cells and curves, score nothing")
    parser.add_argument("--report", action="store_true", help="only the report, from the tables already scored")
    args = parser.parse_args(argv)
    missing = [name for name in CONDITIONS if not (args.output / slug(name) / "heldout.json").is_file()]
    if args.report and missing:  # refused before anything is written
        parser.error(f"--report: {args.output} has no held-out table for {', '.join(missing)}; "
                     "run without --report to score them")
    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.core.scales_file import write_scales_file

    cells = plan()
    names = name_curves(cells)
    curves = args.output / "curves"
    curves.mkdir(parents=True, exist_ok=True)
    scales_args = []
    for key, name in names.items():
        if name == "vanilla":
            continue
        path = curves / f"{name}.json"
        write_scales_file(path, list(key), scaling="both", label=name)
        scales_args += ["--scales", f"{name}={path}"]
    atomic_write_json(args.output / "cells.json", [{k: v for k, v in c.items() if k != "scales"} for c in cells], indent=1)
    print(f"{len(cells)} cells, {len(names) - 1} distinct curves besides vanilla", flush=True)
    if args.plan:
        for cell in cells:
            print(f"{cell['method']:9} s{cell['seed']} {str(cell['budget']):>5}: {cell['row']} ({cell['forwards_used']} forwards)")
        return
    from lpes_harness.commands import transfer

    conditions = [f"{name}={json.dumps(options)}" for name, options in CONDITIONS.items()]
    if not args.report:
        transfer.main([*scales_args, *[a for c in conditions for a in ("--condition", c)], "--num-samples",
                       str(args.num_samples), "--seed", str(args.seed), "--dtype", args.dtype, "--output", str(args.output)])
    from efficiency_robust_report import write_report  # this folder: on sys.path when run as a script

    write_report(args.output, cells, {"num_samples": args.num_samples, "seed": args.seed, "dtype": args.dtype,
                                      "conditions": CONDITIONS})


if __name__ == "__main__":
    main(sys.argv[1:])
