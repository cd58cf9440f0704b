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
  sweep's points in the cache (``lpes_harness.search.run``). Racing here keeps the ``roles`` sample
  order, as the demo did when this benchmark's committed runs began; the demo now races
  ``hardest`` first, which walks the same path in fewer forwards (``benchmarks/sample_order.py``
  replays this journal that way), so at a given budget it gets further than this row.
- ``ga-ramps``: the ``ga`` with a wider start (:func:`run_ga_ramps`). After the same sweep, the six
  straight lines between two of :data:`RAMP_ENDS` (0.6, 1.0, 1.4) from layer 0 to the last
  (``lpes_harness.search.genome.ramp_genome``: the start's control points with y on the line), each
  raced against the best so far; the GA starts from the best point of sweep and lines (a line only
  where it beats every flat point) and runs as ``ga`` from there. The grid was fixed before any
  line was scored.
- ``sweep-random``: random search from the ``ga``'s start (:func:`run_sweep_random`): the same sweep,
  then :func:`lpes_harness.search.random_genome` draws, each raced against the best so far, through
  the product's loop (``lpes-search --initial random --generations 0 --parents 1 --crossovers 0``).
  Unlike ``random``, the first draw already races against the start's fitness, so a draw that
  wrecks the model stops after one chunk.
- ``line-random``: what ``make demo`` runs now (:func:`run_line_random`; ``searches/configs/smollm2_demo.json``):
  the sweep of uniform 0.8 alone (:data:`LINE_RANDOM_SWEEP`), then the rising line 0.6 -> 1.4
  (:data:`DEMO_LINE`, ``lpes-search --lines 0.6:1.4``) raced against it, then the ``sweep-random``
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
  is replaced here by an override of ``generate`` and nothing else). **Repair** (:func:`repair`),
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
``--heldout-samples`` held-out samples per position (:func:`lpes_harness.analysis.paired.score_methods`
with a :class:`~lpes_harness.analysis.score_cache.ScoreCache` under ``--output``: vanilla is scored
once for all runs, and a rerun resumes), with the paired difference, its 95 % interval
(:func:`~lpes_harness.analysis.stats.paired_difference_interval`) and the exact McNemar p over both.

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
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# The committed table's budgets: what make demo's 10-minute budget leaves its search at 1.0 s a sample,
# and what the GA demo's search used (sweep and GA, racing and cache included) before it had a time budget.
DEMO_FORWARDS = 300
GA_DEMO_FORWARDS = 1040
METHODS = ("paper-ga", "ga", "ga-ramps", "sweep-random", "line-random", "cma-es", "random")
SWEEP_RANDOM_DRAWS = 10_000  # more than any budget reaches: a draw costs at least one racing chunk (4 forwards)
# ga-ramps' linear family: every rising and falling straight line between two of these values, from
# layer 0 to the last (the flat ones are the sweep's). Fixed before any ramp was scored.
RAMP_ENDS = (0.6, 1.0, 1.4)
DEFAULT_METHOD = "line-random"  # what make demo runs (searches/configs/smollm2_demo.json): the head-to-head's reference
# line-random's start (make demo's --sweep and --lines): uniform 0.8, then the rising line.
LINE_RANDOM_SWEEP, DEMO_LINE = "0.8", (0.6, 1.4)
RESULTS = "efficiency.json"
JOURNAL = "evaluations.jsonl"
GENERATIONS = 10**9  # the GAs run until their budget stops them
MAX_IDLE = 2000  # candidates in a row served from the cache: the run is stuck (reported as stalled)

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
    add("--threads", type=int, default=None, help="torch CPU threads")
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


# ----------------------------------------------------------------------------- one run's evaluations


class BudgetReached(Exception):
    """The run has used its largest budget: the next evaluation is not started."""


class Stalled(Exception):
    """The run proposed only cached candidates for :data:`MAX_IDLE` candidates in a row."""


def threshold_key(threshold) -> float | None:
    """A racing threshold as the journal keys it: None for none (or -inf, the same)."""
    if threshold is None or (math.isinf(threshold) and threshold < 0):
        return None
    return float(threshold)


class Journal:
    """Every evaluation under ``--output``, all methods and seeds: (scales, threshold) -> result, on disk.

    An evaluation is a pure function of the scales and the racing threshold (the fitness settings
    are fixed by the fingerprint), so a result read back is the result a new evaluation would give.
    """

    def __init__(self, path: Path | None):
        from lpes_harness.files import read_jsonl

        self.path = path
        self.entries: dict = {}
        for line in read_jsonl(path) if path is not None else []:  # a torn last line is scored again
            self.entries[self.key(line["scales"], line["threshold"])] = (line["fitness"], line["info"], line["forwards"])

    @staticmethod
    def key(scales, threshold) -> tuple:
        from lpes_harness.search import cache_key

        return cache_key(scales), threshold_key(threshold)

    def get(self, scales, threshold):
        return self.entries.get(self.key(scales, threshold))

    def put(self, scales, threshold, fitness: float, info, forwards: int) -> None:
        from lpes_harness.files import append_jsonl

        self.entries[self.key(scales, threshold)] = (fitness, info, forwards)
        if self.path is not None:
            append_jsonl(self.path, {"scales": [round(float(s), 6) for s in scales], "threshold": threshold_key(threshold),
                                     "fitness": fitness, "info": info, "forwards": forwards})


class Run:
    """One (method, seed) search's ``evaluate(scales, threshold=None)``: its budget, forwards, best so far,
    and a snapshot at the first evaluation that reaches each budget.

    ``racing`` False drops every threshold (the paper's GA). Forwards of a new evaluation are the
    fitness's ``samples_scored`` difference; of one read back from the journal, what it cost then.
    """

    def __init__(self, fitness, journal: Journal, budgets, racing: bool = True, progress=None, label: str | None = None):
        from tqdm.auto import tqdm

        self.fitness, self.journal, self.racing = fitness, journal, racing
        self.budgets = sorted(budgets)
        self.used = 0  # forwards charged to this run
        self.new_forwards = 0  # forwards actually scored now (not read back)
        self.evaluations = 0
        self.best: dict | None = None
        self.snapshots: dict[int, dict] = {}
        self.genomes: dict = {}  # cache key of the scales -> genome, as the methods report them
        self.seen: dict = {}  # cache key -> (fitness, info): the run's own cache (cma-es, random)
        self.idle = 0
        self.stalled = False
        self.progress = progress
        # Forwards charged against the largest budget (those read back from the journal included):
        # a run is ~30 min on a CPU, and the per-run lines come only at its budgets.
        self.bar = tqdm(total=self.budgets[-1], desc=label, unit="fwd", dynamic_ncols=True,
                        disable=label is None or not progress or math.isinf(self.budgets[-1]))

    def __call__(self, scales, threshold=None):
        if self.used >= self.budgets[-1]:
            raise BudgetReached
        threshold = threshold_key(threshold) if self.racing else None
        known = self.journal.get(scales, threshold)
        if known is None:
            before = self.fitness.samples_scored
            value, info = self.fitness(list(scales), threshold)
            forwards = self.fitness.samples_scored - before
            self.journal.put(scales, threshold, float(value), info, forwards)
            self.new_forwards += forwards
        else:
            value, info, forwards = known
        self.used += forwards
        self.evaluations += 1
        self.idle = 0
        if not (info or {}).get("raced") and (self.best is None or value > self.best["fitness"]):
            self.best = {"fitness": float(value), "scales": [float(s) for s in scales],
                         "scores": (info or {}).get("scores"), "found_at_forwards": self.used}
        self.bar.update(min(self.used, self.budgets[-1]) - self.bar.n)  # the last evaluation may go past the budget
        if self.best is not None:
            self.bar.set_postfix(best=f"{self.best['fitness']:.4f}", evaluations=self.evaluations, refresh=False)
        for budget in self.budgets:
            if budget not in self.snapshots and self.used >= budget:
                self.snapshots[budget] = {"forwards": self.used, "last_evaluation_forwards": forwards,
                                          "evaluations": self.evaluations, "best": dict(self.best or {})}
                if self.progress:
                    self.progress(f"  budget {budget}: {self.used} forwards, {self.evaluations} evaluations, "
                                  f"best search fitness {self.best['fitness']:.4f}")
        return value, info

    def cached(self, scales, threshold=None):
        """``self(scales, threshold)`` through the run's own cache: a complete result, or a racing
        bound below the current threshold, is served again for no forwards; anything else is scored."""
        from lpes_harness.search import cache_key

        key = cache_key(scales)
        hit = self.seen.get(key)
        if hit is not None:
            value, info = hit
            bound_still_out = threshold is not None and value < threshold
            if not (info or {}).get("raced") or bound_still_out:
                self.served()
                return value, info
        value, info = self(scales, threshold)
        self.seen[key] = (value, info)
        return value, info

    def served(self) -> None:
        """A candidate served from a cache: no forwards; too many in a row is a stall."""
        self.idle += 1
        if self.idle >= MAX_IDLE:
            raise Stalled


# ----------------------------------------------------------------------------- the methods


def genome_spec(args, num_layers: int, initial_y: float | None = None):
    from lpes_harness.search import GenomeSpec

    return GenomeSpec(num_layers=num_layers, num_points=args.control_points, y_min=args.y_min, y_max=args.y_max,
                      y_step=args.y_step, curve="bezier", initial_y=args.initial_y if initial_y is None else initial_y)


def ga_config(args, seed: int):
    from lpes_harness.search import SearchConfig

    return SearchConfig(population=args.population, parents=args.parents, mutants=args.mutants,
                        crossovers=args.crossovers, generations=GENERATIONS, mx=args.mx, my=args.my, seed=seed,
                        mutation="paper")


def _recorder(run: Run):
    """A search callback: each individual's genome by its scales, and cache hits counted toward a stall."""
    from lpes_harness.search import Callback, cache_key

    class Recorder(Callback):
        def on_individual(self, search, record):
            run.genomes.setdefault(cache_key(record["scales"]), record["genome"])
            if record["cached"]:
                run.served()

    return Recorder()


def run_paper_ga(run: Run, args, num_layers: int, seed: int) -> None:
    from lpes_harness.search import GeneticSearch

    GeneticSearch(genome_spec(args, num_layers), run, ga_config(args, seed), [_recorder(run)]).run()


def sweep_start(run: Run, args, num_layers: int) -> dict:
    """The demo's sweep (its uniform values, best-guess first, later ones raced): ``run_sweep``'s result."""
    from lpes_harness.search import cache_key, initial_genome
    from lpes_harness.search.sweep import parse_sweep, run_sweep

    spec = genome_spec(args, num_layers)
    sweep = run_sweep(run, parse_sweep(args.sweep), spec.uniform)
    for point in sweep["points"]:
        run.genomes.setdefault(cache_key(spec.uniform(point["scale"])), initial_genome(spec.starting_at(point["scale"])))
    return sweep


def sweep_cache(spec, sweep: dict, decimals: int) -> dict:
    """The sweep's complete points as a GeneticSearch cache (as ``lpes_harness.search.run`` seeds it):
    the start and the other uniform points are served again for no forwards."""
    from lpes_harness.search import cache_key

    return {cache_key(spec.uniform(p["scale"]), decimals): (p["fitness"], p["info"])
            for p in sweep["points"] if not (p.get("info") or {}).get("raced")}


def run_ga(run: Run, args, num_layers: int, seed: int) -> None:
    from lpes_harness.search import GeneticSearch

    sweep = sweep_start(run, args, num_layers)
    spec = genome_spec(args, num_layers).starting_at(sweep["best"])
    config = ga_config(args, seed)
    search = GeneticSearch(spec, run, config, [_recorder(run)])
    search.cache.update(sweep_cache(spec, sweep, config.cache_decimals))
    search.run()


def run_ga_ramps(run: Run, args, num_layers: int, seed: int) -> None:
    """The ga with a wider start: after the uniform sweep, the straight lines between :data:`RAMP_ENDS`,
    each raced against the best so far; the GA starts from the best of them all (a line only if it
    beats every flat point). The per-layer curves the demo's searches found rise from ~0.6 to ~1.3:
    a line is the cheapest shape that can tilt, two numbers where the curve has eight."""
    from itertools import permutations

    from lpes_harness.search import GeneticSearch, cache_key, initial_genome
    from lpes_harness.search.genome import ramp_genome

    sweep = sweep_start(run, args, num_layers)
    spec = genome_spec(args, num_layers).starting_at(sweep["best"])
    config = ga_config(args, seed)
    best_fitness, start = sweep["best_point"]["fitness"], initial_genome(spec)
    known = sweep_cache(spec, sweep, config.cache_decimals)
    for first, last in permutations(RAMP_ENDS, 2):
        genome = ramp_genome(spec, first, last)
        scales = spec.scales(genome)
        run.genomes.setdefault(cache_key(scales), genome)
        value, info = run(scales, best_fitness)
        if not (info or {}).get("raced"):
            known[cache_key(scales, config.cache_decimals)] = (value, info)
            if value > best_fitness:
                best_fitness, start = value, genome
    search = GeneticSearch(spec, run, config, [_recorder(run)], start=start)
    search.cache.update(known)  # as run_ga: what the start's scoring already knows is not scored again
    search.run()


def run_sweep_random(run: Run, args, num_layers: int, seed: int, sweep_values: str | None = None,
                     lines: tuple = ()) -> None:
    """Random search from the sweep's start, as ``lpes-search --initial random --generations 0 --parents 1
    --crossovers 0`` runs it: generation 0 is the sweep's best and random valid genomes, each raced
    against the best so far (which the start makes high from the first draw). ``sweep_values`` (default
    ``--sweep``) and ``lines`` (``(first, last)`` ends, scored right after the start) are ``line-random``'s."""
    from lpes_harness.search import GeneticSearch, SearchConfig
    from lpes_harness.search.genome import ramp_genome

    sweep_args = args if sweep_values is None else argparse.Namespace(**{**vars(args), "sweep": sweep_values})
    sweep = sweep_start(run, sweep_args, num_layers)
    spec = genome_spec(args, num_layers).starting_at(sweep["best"])
    config = SearchConfig(population=SWEEP_RANDOM_DRAWS, parents=1, mutants=SWEEP_RANDOM_DRAWS - 1, crossovers=0,
                          generations=0, mx=args.mx, my=args.my, seed=seed, mutation="paper", initial="random")
    search = GeneticSearch(spec, run, config, [_recorder(run)], lines=[ramp_genome(spec, *ends) for ends in lines])
    search.cache.update(sweep_cache(spec, sweep, config.cache_decimals))  # the start is scored: served again
    search.run()


def run_line_random(run: Run, args, num_layers: int, seed: int) -> None:
    """``make demo``'s search (``--sweep 0.8 --lines 0.6:1.4 --initial random``): the sweep's one point, the
    line raced against it, then the draws of ``sweep-random``'s seed raced against the best so far."""
    run_sweep_random(run, args, num_layers, seed, sweep_values=LINE_RANDOM_SWEEP, lines=(DEMO_LINE,))


def run_random(run: Run, args, num_layers: int, seed: int) -> None:
    from lpes_harness.search import cache_key, random_genome

    spec = genome_spec(args, num_layers)
    rng = random.Random(seed)
    while True:
        genome = random_genome(spec, rng)
        scales = spec.scales(genome)
        run.genomes.setdefault(cache_key(scales), genome)
        run.cached(scales, None if run.best is None else run.best["fitness"])


def to_vector(spec, genome) -> list[float]:
    """A genome in CMA-ES's normalised coordinates: every x / (L-1), then every (y - y_min) / (y_max - y_min)."""
    width = spec.y_max - spec.y_min
    return [x / (spec.num_layers - 1) for x, _ in genome] + [(y - spec.y_min) / width if width else 0.0
                                                              for _, y in genome]


def repair(spec, vector) -> list[tuple[float, float]]:
    """The valid genome of a CMA-ES candidate (see the module docstring): clip to [0, 1], x sorted,
    rounded to the grid, made strictly increasing there, y snapped to its grid."""
    n = spec.num_points
    u = np.clip(np.nan_to_num(np.asarray(vector, dtype=float), nan=0.5), 0.0, 1.0)
    xs = sorted(u[:n] * (spec.num_layers - 1))
    cells = []
    for k, x in enumerate(xs):
        cell = min(max(int(round(x / spec.x_step)), k), spec.x_cells - (n - 1 - k))
        if cells:
            cell = max(cell, cells[-1] + 1)  # stays <= x_cells - (n-1-k): the previous one was <= one less
        cells.append(cell)
    ys = [spec.snap_y(spec.y_min + v * (spec.y_max - spec.y_min)) for v in u[n:]]
    return [(spec.x_of(i), y) for i, y in zip(cells, ys)]


def cma_strategy(spec, sigma: float, population: int, seed: int):
    """``deap.cma.Strategy`` at the spec's start, its draws from ``numpy.random.default_rng(seed)``."""
    from deap import cma

    from lpes_harness.search import initial_genome

    class SeededStrategy(cma.Strategy):
        def generate(self, ind_init):  # DEAP's generate, with the run's own generator
            arz = self.rng.standard_normal((self.lambda_, self.dim))
            arz = self.centroid + self.sigma * np.dot(arz, self.BD.T)
            return [ind_init(a) for a in arz]

    strategy = SeededStrategy(to_vector(spec, initial_genome(spec)), sigma, lambda_=population)
    strategy.rng = np.random.default_rng(seed)
    return strategy


def run_cma_es(run: Run, args, num_layers: int, seed: int) -> None:
    from deap import creator

    from lpes_harness.search import cache_key

    spec = genome_spec(args, num_layers)
    strategy = cma_strategy(spec, args.cma_sigma, args.cma_population, seed)
    while True:
        population = strategy.generate(lambda values: creator.LPESIndividual(float(v) for v in values))
        complete: list[float] = []
        for candidate in population:
            genome = repair(spec, candidate)
            scales = spec.scales(genome)
            run.genomes.setdefault(cache_key(scales), genome)
            ranked = sorted(complete, reverse=True)
            threshold = ranked[strategy.mu - 1] if len(ranked) >= strategy.mu else None
            value, info = run.cached(scales, threshold)
            candidate.fitness.values = (value,)
            if not (info or {}).get("raced"):
                complete.append(value)
        strategy.update(population)


RUNNERS = {"paper-ga": run_paper_ga, "ga": run_ga, "ga-ramps": run_ga_ramps, "sweep-random": run_sweep_random,
           "line-random": run_line_random, "cma-es": run_cma_es, "random": run_random}


def search(method: str, seed: int, fitness, journal: Journal, budgets, args, num_layers: int, progress=None) -> Run:
    """One (method, seed) search until its largest budget; its snapshots hold every budget's result."""
    run = Run(fitness, journal, budgets, racing=method != "paper-ga", progress=progress, label=f"{method} seed {seed}")
    try:
        RUNNERS[method](run, args, num_layers, seed)
    except BudgetReached:
        pass
    except Stalled:
        run.stalled = True
    finally:
        run.bar.close()
    return run


# ----------------------------------------------------------------------------- held-out scoring


def heldout_gain(lm, args, cache, num_layers: int, start: float, scales) -> dict:
    """The best curve, vanilla and the uniform start on the same held-out samples, paired."""
    from lpes_harness.analysis.paired import score_methods
    from lpes_harness.analysis.stats import compare_paired

    spec = genome_spec(args, num_layers)
    methods = {"vanilla": [1.0] * num_layers, "start": spec.uniform(start), "best": list(scales)}
    scored = score_methods(lm, args.task, methods, num_samples=args.heldout_samples, metadata=args.metadata, cache=cache)
    flat = {name: [s for p in sorted(by_percent) for s in by_percent[p]] for name, by_percent in scored["scores"].items()}

    def versus(baseline: str) -> dict:
        c = compare_paired(flat["best"], flat[baseline])
        return {k: c[k] for k in ("difference", "difference_interval", "gained", "lost", "p")}

    return {"n": len(flat["best"]), "accuracy": statistics.fmean(flat["best"]),
            "vanilla_accuracy": statistics.fmean(flat["vanilla"]), "start_accuracy": statistics.fmean(flat["start"]),
            "over_vanilla": versus("vanilla"), "over_start": versus("start")}


# ----------------------------------------------------------------------------- the report


def points(value: float) -> str:
    return f"{100 * value:+.1f}"


def kept_uniform(run: dict) -> str | None:
    """``"uniform 0.8 (PI)"`` when a run's best is one scale on every layer (the start it kept, or
    another uniform scale): no per-layer curve, and its row must say so; else None."""
    scales = run["best"].get("scales") or []
    if scales and len(set(scales)) == 1:
        return f"uniform {scales[0]:g} (PI)"
    return None


def head_to_head(record: dict, cache_path: Path) -> list[dict]:
    """Each method's best against the demo's method's best (``DEFAULT_METHOD``) of the same seed and budget.

    All bests were scored on the same held-out samples (the cache under ``--output``), so two searches
    compare paired, sample by sample: which found the better curve, not only which gained more over
    vanilla. A pair whose scores are not all in the cache is left out."""
    from lpes_harness.analysis.score_cache import ScoreCache
    from lpes_harness.analysis.stats import compare_paired

    if not cache_path.is_file():
        return []
    # The file's own identity: the records it holds are read back, not checked against a model
    cache = ScoreCache(cache_path, json.loads(cache_path.read_text(encoding="utf-8"))["identity"])
    count = record["settings"]["heldout_samples"]
    percents = sorted(int(p) for p in cache.fingerprints)

    def scores(scales) -> list[float] | None:
        flat = []
        for percent in percents:
            block = cache.get(scales, percent)[:count]
            if len(block) < count:
                return None
            flat += block
        return flat or None

    runs = {(r["method"], r["seed"], r["budget"]): r for r in record["runs"]}
    rows = []
    for (method, seed, budget), run in runs.items():
        reference = runs.get((DEFAULT_METHOD, seed, budget))
        if method == DEFAULT_METHOD or reference is None:
            continue
        mine, theirs = scores(run["best"]["scales"]), scores(reference["best"]["scales"])
        if mine is None or theirs is None:
            continue
        compared = compare_paired(mine, theirs)
        rows.append({"method": method, "seed": seed, "budget": budget,
                     "same_curve": ScoreCache.key(run["best"]["scales"], 0) == ScoreCache.key(reference["best"]["scales"], 0),
                     **{k: compared[k] for k in ("difference", "difference_interval", "gained", "lost", "p")}})
    return sorted(rows, key=lambda r: (r["budget"], METHODS.index(r["method"]), r["seed"]))


def format_head_to_head(rows: list[dict]) -> list[str]:
    from lpes_harness.analysis.stats import format_p

    if not rows:
        return []
    seeds = sorted({r["seed"] for r in rows})
    lines = ["", f"## Against the demo's search (`{DEFAULT_METHOD}`), seed by seed", "",
             f"Each method's best minus `{DEFAULT_METHOD}`'s best of the same seed and budget, on the same held-out "
             "samples: points [95 %], samples gained / lost, exact McNemar p. Negative: the demo's search found the "
             "better curve.", "",
             "| budget | method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
             "|---:|---|" + "---|" * len(seeds) + "---:|"]
    for budget, method in sorted({(r["budget"], r["method"]) for r in rows}, key=lambda k: (k[0], METHODS.index(k[1]))):
        mine = {r["seed"]: r for r in rows if r["budget"] == budget and r["method"] == method}
        cells = ["" if (r := mine.get(s)) is None else "the same curve" if r["same_curve"] else
                 f"{points(r['difference'])} [{points(r['difference_interval'][0])}, {points(r['difference_interval'][1])}], "
                 f"{r['gained']} / {r['lost']}, p = {format_p(r['p'])}" for s in seeds]
        mean = statistics.fmean(r["difference"] for r in mine.values())
        lines.append(f"| {budget:,} | {method} | " + " | ".join(cells) + f" | {points(mean)} |")
    return lines


def format_report(record: dict, versus: list[dict] | None = None) -> str:
    """``efficiency.md``: per budget, each method's mean gain over its seeds and each seed's; then, with
    ``versus`` (:func:`head_to_head`), each method against the demo's search seed by seed."""
    from lpes_harness.analysis.stats import format_p

    settings, runs = record["settings"], record["runs"]
    start = record.get("start")
    lines = [
        "# Search efficiency: held-out gain against search forwards",
        "",
        f"`benchmarks/search_efficiency.py`: {settings['task']} ({json.dumps(settings['metadata'])}), model "
        f"{settings['pretrained'] or 'bundled SmolLM2-135M-Instruct'}, {settings['dtype']}; search fitness "
        f"{settings['fitness']} on {settings['num_samples']} samples per position; held-out: "
        f"{settings['heldout_samples']} samples per position, the same for every run. The uniform start is uniform "
        f"{start:g} (the sweep {settings['sweep']} with the search fitness)" + (" = vanilla." if start == 1 else ".")
        if start is not None else "",
        "",
        "Gains are held-out accuracy differences in points (paired, 95 % interval, exact McNemar p); "
        "the mean is over the seeds run at that budget (their number in `seeds`: a mean over fewer seeds "
        "is not comparable with one over more), [min, max] over the seeds. A seed whose best is one scale on every "
        "layer found no per-layer curve: its row is that uniform scale, PI, and is marked so.",
    ]
    for budget in sorted({r["budget"] for r in runs}):
        lines += ["", f"## Budget {budget:,} forwards", "",
                  "| method | seeds | forwards used (mean) | search fitness (mean) | held-out accuracy (mean) | "
                  "gain over vanilla: mean [min, max] | gain over the start: mean [min, max] | each seed: gain over vanilla [95 %], p |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        for method in METHODS:
            rows = sorted((r for r in runs if r["budget"] == budget and r["method"] == method), key=lambda r: r["seed"])
            if not rows:
                continue
            vs_v = [r["heldout"]["over_vanilla"]["difference"] for r in rows]
            vs_s = [r["heldout"]["over_start"]["difference"] for r in rows]
            seeds = "; ".join(
                f"{r['seed']}{', ' + kept_uniform(r) if kept_uniform(r) else ''}: "
                f"{points(r['heldout']['over_vanilla']['difference'])} "
                f"[{points(r['heldout']['over_vanilla']['difference_interval'][0])}, "
                f"{points(r['heldout']['over_vanilla']['difference_interval'][1])}], "
                f"p = {format_p(r['heldout']['over_vanilla']['p'])}" for r in rows)
            lines.append(
                f"| {method} | {len(rows)} | {statistics.fmean(r['forwards'] for r in rows):,.0f} | "
                f"{statistics.fmean(r['best']['fitness'] for r in rows):.3f} | "
                f"{statistics.fmean(r['heldout']['accuracy'] for r in rows):.3f} | "
                f"{points(statistics.fmean(vs_v))} [{points(min(vs_v))}, {points(max(vs_v))}] | "
                f"{points(statistics.fmean(vs_s))} [{points(min(vs_s))}, {points(max(vs_s))}] | {seeds} |")
    lines += format_head_to_head(versus or [])
    return "\n".join(lines) + "\n"


def plot_report(record: dict, path: Path) -> None:
    """Held-out gain against forwards used: per method its mean per budget, each marked with its number of
    seeds and joined by a line (dashed where the two means hold different seeds), and each seed as a point."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from lpes_harness.files import save_figure

    figure = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(figure)
    panels = figure.subplots(1, 2, sharey=True)
    colours = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:green", "tab:red")))
    for axes, key, title in zip(panels, ("over_vanilla", "over_start"), ("over vanilla", "over the uniform start")):
        for method in METHODS:
            rows = [r for r in record["runs"] if r["method"] == method]
            if not rows:
                continue
            axes.scatter([r["forwards"] for r in rows], [100 * r["heldout"][key]["difference"] for r in rows],
                         color=colours[method], alpha=0.45, s=18)
            by_budget = {b: [r for r in rows if r["budget"] == b] for b in sorted({r["budget"] for r in rows})}
            means = [(statistics.fmean(r["forwards"] for r in runs),
                      statistics.fmean(100 * r["heldout"][key]["difference"] for r in runs)) for runs in by_budget.values()]
            axes.plot(*zip(*means), marker="o", linestyle="none", color=colours[method], label=method)
            # A mean over other seeds than the next budget's is not the same searches' progress: the segment
            # between them is dashed, and each mean says how many seeds it holds.
            seed_sets = [{r["seed"] for r in runs} for runs in by_budget.values()]
            for i in range(len(means) - 1):
                same = seed_sets[i] == seed_sets[i + 1]
                axes.plot(*zip(means[i], means[i + 1]), color=colours[method], linestyle="-" if same else "--")
            for (x, y), seeds in zip(means, seed_sets):
                axes.annotate(f"n={len(seeds)}", (x, y), textcoords="offset points", xytext=(5, 4),
                              fontsize=7, color=colours[method])
        axes.axhline(0, color="grey", linewidth=0.8)
        axes.set_xlabel("search forwards used")
        axes.set_title(f"held-out gain {title}")
        axes.grid(alpha=0.3)
    panels[0].set_ylabel("points (mean over n seeds: big dots; seeds: dots)")
    panels[0].plot([], [], color="grey", linestyle="--", label="dashed: means over different seeds")
    panels[0].legend()
    save_figure(figure, path)


# ----------------------------------------------------------------------------- main


def settings_of(args) -> dict:
    from lpes_harness.models import choose_dtype, default_device

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
    from lpes_harness.files import atomic_write_text

    if record["runs"]:
        from lpes_harness.analysis.paired import CACHE_FILE

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
    from lpes_harness import rope
    from lpes_harness.analysis.paired import CACHE_FILE, cache_identity
    from lpes_harness.analysis.score_cache import ScoreCache
    from lpes_harness.files import atomic_write_json
    from lpes_harness.lm import LPESLM
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
