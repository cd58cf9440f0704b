"""Held-out gain against search forwards: the paper's GA, the GA as it runs now (and from a line), CMA-ES, random searches.

    python benchmarks/search_efficiency.py                       # the full comparison (hours on a CPU: docs/results.md)
    python benchmarks/search_efficiency.py --budgets 60 --seeds 1 --methods random,cma-es \\
        --num-samples 2 --heldout-samples 2 --output /tmp/eff_smoke  # a smoke run

Issue #46's benchmark. Every method searches the same space (the demo's genome: 4 Bézier control
points, x on the integer layer grid in [0, L-1], y on the grid y_min, y_min + 0.05, ... in
[0.25, 2.5]; ``searches/configs/smollm2_demo.json``), scores its candidates with one and the same
fitness object (:class:`lpes_harness.search.fitness.LMEvalFitness` on the ``search`` split, the
demo's 8 samples per position, greedy, chunks of 4) and stops at the first evaluation that reaches
its forward budget (a forward is one scored sample, the fitness's ``samples_scored``; the forwards
used are reported exactly, at most one evaluation past the budget). Budgets (the committed table's):
300, about what the time-budgeted demo's search spends in 10 minutes at 1.0 s a sample, and 1,040, what
the GA demo's search used before it had a time budget (about 3x). Methods (``--methods``):

- ``paper-ga``: the paper's GA, :class:`~lpes_harness.search.GeneticSearch` with the demo's sizes
  (population 8, 3 parents, 4 mutants, 1 crossover; Mx 3, My 0.4, mutation ``paper``), no sweep
  (the start is y = 1.0 on every control point, the demo's ``initial_y``; the paper's 1.5 wrecks
  SmolLM2), no racing (every candidate scored on every search sample). The loop's fitness cache
  is part of the GA and stays on.
- ``ga``: the GA as ``make demo`` runs it: the sweep of uniform 1 and 0.8 (raced, with the
  search's fitness; its forwards count) picks the start, racing on, the fitness cache on, the
  sweep's points in the cache (``lpes_harness.search.search_stage``). Racing here keeps the ``roles`` sample
  order, as the demo did when this benchmark's committed runs began; the demo now races
  ``hardest`` first, which walks the same path in fewer forwards (``benchmarks/sample_order.py``
  replays this journal that way), so at a given budget it gets further than this row.
- ``ga-ramps``: the ``ga`` with a wider start (:func:`efficiency_methods.run_ga_ramps`). After the same sweep, the six
  straight lines between two of :data:`efficiency_methods.RAMP_ENDS` (0.6, 1.0, 1.4) from layer 0 to the last
  (``lpes_harness.search.genome.ramp_genome``: the start's control points with y on the line), each
  raced against the best so far; the GA starts from the best point of sweep and lines (a line only
  where it beats every flat point) and runs as ``ga`` from there. The grid was fixed before any
  line was scored.
- ``sweep-random``: random search from the ``ga``'s start (:func:`efficiency_methods.run_sweep_random`): the same sweep,
  then :func:`lpes_harness.search.random_genome` draws, each raced against the best so far, through
  the product's loop (``lpes-search --initial random --generations 0 --parents 1 --crossovers 0``).
  Unlike ``random``, the first draw already races against the start's fitness, so a draw that
  wrecks the model stops after one chunk.
- ``line-random``: what ``make demo`` runs now (:func:`efficiency_methods.run_line_random`; ``searches/configs/smollm2_demo.json``):
  the sweep of uniform 0.8 alone (:data:`efficiency_methods.LINE_RANDOM_SWEEP`), then the rising line 0.6 -> 1.4
  (:data:`efficiency_methods.DEMO_LINE`, ``lpes-search --lines 0.6:1.4``) raced against it, then the ``sweep-random``
  draws of the same seed, each raced against the best so far. The line is the one ``ga-ramps`` chose
  on the search samples in all three seeds; scored first, it puts a per-layer curve in hand after 80
  forwards, and it raises the bar the draws race against.
- ``cma-es``: DEAP's CMA-ES (``deap.cma.Strategy``) over the genome's continuous control points.
  A candidate is a vector of 2 x ``control_points`` numbers in normalised coordinates, u = x / (L-1)
  for each point's x and u = (y - y_min) / (y_max - y_min) for its y, so that one sigma means the
  same share of each range. It starts at the demo's start (x evenly spaced, y = 1.0) with sigma
  ``--cma-sigma`` 0.1 (a y standard deviation of 0.225, the GA's My = 0.4 uniform move has 0.23;
  in x 2.9 layers), lambda ``--cma-population`` 8 (the GA's population), mu = lambda / 2 and
  DEAP's default (superlinear) recombination weights; its random draws come from
  ``numpy.random.default_rng(seed)`` (DEAP's ``generate`` reads numpy's global generator, which
  is replaced here by an override of ``generate`` and nothing else). **Repair** (:func:`efficiency_methods.repair`),
  before each evaluation: every coordinate is clipped to [0, 1]; the x values are sorted
  (each y keeps its index: point k's height stays the k-th y), rounded to the nearest grid cell,
  clipped to cell k .. last cell - (n-1-k) so that n points fit, and pushed right where they
  collide (x_k = max(x_k, x_{k-1} + 1)), which makes them strictly increasing on the integer
  grid; each y is clipped to [y_min, y_max] and rounded to the nearest multiple of y_step above
  y_min (``GenomeSpec.snap_y``). The result is a valid genome (``spec.violations`` empty) whose
  layer scales come from ``GenomeSpec.scales`` as the GA's do. The strategy learns from its own
  (unrepaired) samples, each ranked by its repaired genome's fitness. Racing is on and exact:
  within a generation a candidate stops once it provably falls below the mu-th best complete
  fitness so far, so its rank stays outside the mu that the update uses.
- ``random``: :func:`lpes_harness.search.random_genome` draws (uniform over the valid genomes of
  the grid), the best kept; racing against the best so far (exact: a candidate stopped early
  cannot be the best).

For cma-es and random, a candidate whose layer scales were scored before in the same run is
served from the run's cache (no forwards) unless its earlier result was a racing bound that
does not fall below the current threshold, in which case it is scored again.

Each run's best (by its own search fitness, complete evaluations only) at each budget is scored
with vanilla and **the uniform start** (the uniform scale the demo's sweep 1, 0.8 picks with the
search fitness on the search samples: the same for every method and seed) on the same
``--heldout-samples`` held-out samples per position (:func:`lpes_harness.evaluation.paired.score_methods`
with a :class:`~lpes_harness.evaluation.score_cache.ScoreCache` under ``--output``: vanilla is scored
once for all runs, and a rerun resumes), with the paired difference, its 95 % interval
(:func:`~lpes_harness.evaluation.stats.paired_difference_interval`) and the exact McNemar p over both.

Output, in ``--output`` (default ``results/search_efficiency``):

- ``efficiency.json``: the settings, the uniform start, and every finished (method, seed, budget):
  forwards used, the best's search fitness, genome and scales, held-out accuracy, gain over
  vanilla and over the start with intervals and p;
- ``efficiency.md``: per budget, each method's mean gain over the seeds and each seed's, and each
  method's best against the demo's search's best of the same seed, paired on the same held-out samples;
- ``efficiency.png``: held-out gain against forwards used, one line per method (dashed between means
  over different seeds), seeds as points;
- ``evaluations.jsonl``: every fitness evaluation made (scales, racing threshold, fitness, info,
  forwards), and ``scores.cache.json``: the held-out scores.

**Resume.** A finished (method, seed, budget) is recorded and skipped on a rerun (with everything
recorded, the model is not even loaded). A run that stopped part way replays its evaluations from
``evaluations.jsonl`` without scoring them again, charged the forwards they cost the first time, so
its path and the forwards it reports are those of an uninterrupted run. The same journal serves
every method and seed: an evaluation another run already made (the sweep's points, the start) is
read back, never scored twice, and still charged to each run that asks for it. One search per
(method, seed) serves every budget: a method does not know its budget, so the run at the smaller
budget is the first part of the run at the larger one, and its result is taken at the first
evaluation that reaches the smaller budget. A rerun with other settings than the recorded ones
(anything but --budgets, --seeds, --methods and --threads) is refused.

``--quick`` (the tests): small sizes for a tiny model, each flag still overridable.

The methods live in ``benchmarks/efficiency_methods.py``, the report in ``benchmarks/efficiency_report.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

# this folder: on sys.path when run as a script
from efficiency_methods import METHODS, Journal, Run, genome_spec, search, sweep_start
from efficiency_report import format_report, head_to_head, plot_report, points

from lpes_harness.core.models import positive_int

# The committed table's budgets: what make demo's 10-minute budget leaves its search at 1.0 s a sample,
# and what the GA demo's search used (sweep and GA, racing and cache included) before it had a time budget.
DEMO_FORWARDS = 300
GA_DEMO_FORWARDS = 1040
RESULTS = "efficiency.json"
JOURNAL = "evaluations.jsonl"

# Settings that change what a run finds or how it is scored: a rerun must keep them.
FINGERPRINT = ("task", "metadata", "fitness", "num_samples", "chunk_size", "heldout_samples", "pretrained", "dtype",
               "control_points", "y_min", "y_max", "y_step", "initial_y", "mx", "my", "population", "parents",
               "mutants", "crossovers", "sweep", "cma_sigma", "cma_population", "batch_size")


# The GA demo's settings when this benchmark's runs began (searches/configs/smollm2_demo.json at commit
# 1a012da, over its profile cpu-bf16): the space, fitness and GA sizes every recorded run used. Fixed
# here, since the demo has since moved to a time-budgeted random search (--initial random).
DEMO_SETTINGS = {
    "task": "multi_needle", "fitness": "greedy", "num_samples": 8, "chunk_size": 4, "heldout_samples": 40,
    "population": 8, "parents": 3, "mutants": 4, "crossovers": 1, "mx": 3, "my": 0.4,
    "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0, "sweep": "1,0.8",
}  # fmt: skip


def defaults(quick: bool) -> dict:
    """Each flag's default: the demo's settings, or the small ones of ``--quick``."""
    demo = DEMO_SETTINGS
    full = {
        "budgets": f"{DEMO_FORWARDS},{GA_DEMO_FORWARDS}", "seeds": "1,2,3", "methods": ",".join(METHODS),
        **demo, "control_points": 4,
        "cma_sigma": 0.1, "cma_population": demo["population"],
    }  # fmt: skip
    if quick:
        full.update(budgets="24,48", seeds="1", num_samples=2, heldout_samples=2, chunk_size=2, population=4,
                    parents=2, mutants=1, crossovers=1, cma_population=4)
    return full


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--budgets", default=None, help=f"forward budgets, comma list (default {DEMO_FORWARDS},{GA_DEMO_FORWARDS}: "
                                        "the time-budgeted demo's search and the GA demo's, about 3x)")
    add("--seeds", default=None, help="seeds, comma list (default 1,2,3)")
    add("--methods", default=None, help=f"comma list of {', '.join(METHODS)} (default: all)")
    add("--num-samples", type=int, default=None, help="search samples per position (default: the demo's 8)")
    add("--heldout-samples", type=int, default=None, help="held-out samples per position (default 40)")
    add("--pretrained", default=None, help="HF id, local dir or .gguf (default: the bundled SmolLM2)")
    add("--dtype", default="auto", help="auto (bfloat16 on CUDA or a CPU where it is native and faster, else float32), "
                                        "float32, bfloat16, float16")
    add("--device", default=None, help="cpu / cuda (default: cuda when present)")
    add("--task", default=None, help="position task (default: the demo's multi_needle)")
    add("--metadata", default="{}", help="task options as JSON (default: the task's own)")
    add("--fitness", default=None, help="search fitness mode (default: the demo's greedy; logprob for a tiny "
                                        "random model, which greedy scores 0 everywhere)")
    add("--chunk-size", type=int, default=None, help="samples per racing step (default: the demo's 4)")
    add("--batch-size", default="auto", help="prompts per forward of the fitness: an integer or auto (as lpes-search)")
    add("--control-points", type=int, default=None, help="control points of the genome (default 4)")
    add("--population", type=int, default=None, help="GA population (default: the demo's 8)")
    add("--parents", type=int, default=None)
    add("--mutants", type=int, default=None)
    add("--crossovers", type=int, default=None)
    add("--mx", type=float, default=None)
    add("--my", type=float, default=None)
    add("--y-min", type=float, default=None)
    add("--y-max", type=float, default=None)
    add("--y-step", type=float, default=None)
    add("--initial-y", type=float, default=None, help="the start of paper-ga and cma-es (default: the demo's 1.0)")
    add("--sweep", default=None, help="the ga's sweep, and the uniform start's (default: the demo's 1,0.8)")
    add("--cma-sigma", type=float, default=None, help="CMA-ES step size in normalised coordinates (default 0.1)")
    add("--cma-population", type=int, default=None, help="CMA-ES lambda (default: the GA's population, 8)")
    add("--threads", type=positive_int, default=None, help="torch CPU threads")
    add("--output", default="results/search_efficiency")
    add("--quick", action="store_true", help="small sizes for the tests (any flag given still wins)")
    args = parser.parse_args(argv)
    for name, value in defaults(args.quick).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        args.budget_list = sorted({int(b) for b in str(args.budgets).split(",") if b.strip()})
        args.seed_list = [int(s) for s in str(args.seeds).split(",") if s.strip()]
        args.metadata = json.loads(args.metadata)
    except ValueError as err:
        parser.error(f"--budgets / --seeds must be comma lists of integers and --metadata JSON ({err})")
    args.method_list = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    unknown = [m for m in args.method_list if m not in METHODS]
    if unknown or not args.method_list:
        parser.error(f"--methods {args.methods!r}: give a comma list of {', '.join(METHODS)}")
    if not args.budget_list or min(args.budget_list) < 1 or not args.seed_list:
        parser.error("--budgets must be integers >= 1 and --seeds at least one integer")
    if not isinstance(args.metadata, dict):
        parser.error("--metadata must be a JSON object")
    if args.num_samples < 1 or args.heldout_samples < 1 or args.chunk_size < 1 or args.cma_population < 2:
        parser.error("--num-samples, --heldout-samples and --chunk-size must be >= 1, --cma-population >= 2")
    if not args.cma_sigma > 0:
        parser.error("--cma-sigma must be > 0")
    return args


# ----------------------------------------------------------------------------- held-out scoring


def heldout_gain(lm, args, cache, num_layers: int, start: float, scales) -> dict:
    """The best curve, vanilla and the uniform start on the same held-out samples, paired."""
    from lpes_harness.evaluation.paired import score_methods
    from lpes_harness.evaluation.stats import compare_paired
    from lpes_harness.methods.setup import MethodSetup

    spec = genome_spec(args, num_layers)
    rows = {"vanilla": [1.0] * num_layers, "start": spec.uniform(start), "best": scales}
    methods = {name: MethodSetup.of_scales(row) for name, row in rows.items()}
    scored = score_methods(lm, args.task, methods, num_samples=args.heldout_samples, metadata=args.metadata, cache=cache)
    flat = {name: [s for p in sorted(by_percent) for s in by_percent[p]] for name, by_percent in scored["scores"].items()}

    def versus(baseline: str) -> dict:
        c = compare_paired(flat["best"], flat[baseline])
        return {k: c[k] for k in ("difference", "difference_interval", "gained", "lost", "p")}

    return {"n": len(flat["best"]), "accuracy": statistics.fmean(flat["best"]),
            "vanilla_accuracy": statistics.fmean(flat["vanilla"]), "start_accuracy": statistics.fmean(flat["start"]),
            "over_vanilla": versus("vanilla"), "over_start": versus("start")}


# ----------------------------------------------------------------------------- main


def settings_of(args) -> dict:
    from lpes_harness.core.models import choose_dtype, default_device

    values = {name: getattr(args, name) for name in FINGERPRINT if name != "dtype"}
    values["dtype"] = choose_dtype(args.dtype, args.device or default_device())
    values["batch_size"] = str(args.batch_size)
    return json.loads(json.dumps(values))


def main(argv=None) -> int:
    args = parse_args(argv)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    results_path = output / RESULTS
    settings = settings_of(args)
    record = json.loads(results_path.read_text()) if results_path.exists() else {"settings": settings, "runs": []}
    if record["settings"] != settings:
        changed = sorted(k for k in set(settings) | set(record["settings"]) if settings.get(k) != record["settings"].get(k))
        print(f"search_efficiency: {output} holds runs made with other settings ({', '.join(changed)}: "
              f"{ {k: record['settings'].get(k) for k in changed} } there); use another --output", file=sys.stderr)
        return 2
    done = {(r["method"], r["seed"], r["budget"]) for r in record["runs"]}
    todo = {(m, s): [b for b in args.budget_list if (m, s, b) not in done] for m in args.method_list for s in args.seed_list}
    todo = {key: budgets for key, budgets in todo.items() if budgets}
    new_forwards, new_heldout = 0, 0
    started = time.perf_counter()
    if todo or record.get("start") is None:
        new_forwards, new_heldout = run_missing(args, record, todo, output)
    else:
        print("every (method, seed, budget) asked for is recorded: nothing scored", flush=True)
    from lpes_harness.core.files import atomic_write_text

    if record["runs"]:
        from lpes_harness.evaluation.paired import CACHE_FILE

        report = format_report(record, head_to_head(record, output / CACHE_FILE))
        atomic_write_text(output / "efficiency.md", report)
        plot_report(record, output / "efficiency.png")
        print(report)
    print(f"new search forwards: {new_forwards}; new held-out samples: {new_heldout}; "
          f"{time.perf_counter() - started:.0f} s; written: {output / RESULTS}, {output / 'efficiency.md'}, "
          f"{output / 'efficiency.png'}", flush=True)
    return 0


def run_missing(args, record: dict, todo: dict, output: Path) -> tuple[int, int]:
    """Load the model, then every missing (method, seed) search and its held-out scoring; returns
    (search forwards scored now, held-out samples scored now)."""
    from lpes_harness.core import rope
    from lpes_harness.evaluation.paired import CACHE_FILE, cache_identity
    from lpes_harness.evaluation.score_cache import ScoreCache
    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.search.fitness import FitnessConfig, LMEvalFitness

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    settings = record["settings"]
    loaded = time.perf_counter()
    lm = LPESLM(pretrained=args.pretrained, device=args.device, batch_size=1, dtype=settings["dtype"])
    num_layers = rope.num_layers(lm.model)
    batch_size = int(args.batch_size) if str(args.batch_size).isdigit() else args.batch_size
    fitness = LMEvalFitness(lm, FitnessConfig(task=args.task, fitness=args.fitness, metadata=args.metadata,
                                              num_samples=args.num_samples, chunk_size=args.chunk_size, racing=True,
                                              batch_size=batch_size))
    cache = ScoreCache(output / CACHE_FILE, cache_identity(args.task, args.metadata, "auto", args.pretrained,
                                                           settings["dtype"]))
    held_before = sum(len(block) for block in cache.blocks.values())
    journal = Journal(output / JOURNAL)
    print(f"model loaded in {time.perf_counter() - loaded:.0f} s ({num_layers} layers, {settings['dtype']}); "
          f"{sum(fitness.sizes.values())} search samples an evaluation; {len(journal.entries)} evaluations on record",
          flush=True)

    def progress(text):
        print(text, flush=True)

    spent = 0
    if record.get("start") is None:
        starter = Run(fitness, journal, [math.inf])
        record["start"] = sweep_start(starter, args, num_layers)["best"]
        spent += starter.new_forwards
        atomic_write_json(output / RESULTS, record, indent=1)
    print(f"the uniform start: {record['start']:g} (sweep {args.sweep})", flush=True)
    for (method, seed), budgets in todo.items():
        began = time.perf_counter()
        progress(f"{method} seed {seed}: budgets {', '.join(map(str, budgets))}")
        run = search(method, seed, fitness, journal, budgets, args, num_layers, progress)
        spent += run.new_forwards
        progress(f"{method} seed {seed}: {run.used} forwards ({run.new_forwards} scored now), {run.evaluations} "
                 f"evaluations in {time.perf_counter() - began:.0f} s" + (" (stalled)" if run.stalled else ""))
        from lpes_harness.search import cache_key

        for budget in budgets:
            snap = run.snapshots.get(budget)
            if snap is None:  # stalled before this budget: recorded as such, with what it used
                snap = {"forwards": run.used, "last_evaluation_forwards": 0, "evaluations": run.evaluations,
                        "best": dict(run.best or {})}
            best = snap["best"]
            genome = run.genomes.get(cache_key(best["scales"]))
            heldout = heldout_gain(lm, args, cache, num_layers, record["start"], best["scales"])
            record["runs"].append({
                "method": method, "seed": seed, "budget": budget, "forwards": snap["forwards"],
                "last_evaluation_forwards": snap["last_evaluation_forwards"], "evaluations": snap["evaluations"],
                "stalled": budget not in run.snapshots,
                "best": {**best, "genome": [list(p) for p in genome] if genome is not None else None},
                "heldout": heldout,
            })  # fmt: skip
            atomic_write_json(output / RESULTS, record, indent=1)
            o = heldout["over_vanilla"]
            progress(f"  {method} seed {seed} budget {budget}: held-out {heldout['accuracy']:.3f} (vanilla "
                     f"{heldout['vanilla_accuracy']:.3f}), {points(o['difference'])} [{points(o['difference_interval'][0])}, "
                     f"{points(o['difference_interval'][1])}] points, p = {o['p']:.3g}")
    held_after = sum(len(block) for block in cache.blocks.values())
    return spent, held_after - held_before


if __name__ == "__main__":
    sys.exit(main())
