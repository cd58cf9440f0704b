"""The searches that ``benchmarks/search_efficiency.py`` compares, each charged the forwards it uses.

Its docstring (and ``--help``) describes each method; here are the pieces: the journal of every
evaluation under ``--output`` (:class:`Journal`), one (method, seed) search's budgeted fitness
(:class:`Run`), the methods themselves (:data:`RUNNERS`) and :func:`search`, which runs one until its
largest budget. A method does not know its budget: :class:`Run` stops it and keeps a snapshot at
each budget it passes.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import numpy as np

METHODS = ("paper-ga", "ga", "ga-ramps", "sweep-random", "line-random", "cma-es", "random")
SWEEP_RANDOM_DRAWS = 10_000  # more than any budget reaches: a draw costs at least one racing chunk (4 forwards)
# ga-ramps' linear family: every rising and falling straight line between two of these values, from
# layer 0 to the last (the flat ones are the sweep's). Fixed before any ramp was scored.
RAMP_ENDS = (0.6, 1.0, 1.4)
DEFAULT_METHOD = "line-random"  # what make demo runs (searches/configs/smollm2_demo.json): the head-to-head's reference
# line-random's start (make demo's --sweep and --lines): uniform 0.8, then the rising line.
LINE_RANDOM_SWEEP, DEMO_LINE = "0.8", (0.6, 1.4)
GENERATIONS = 10**9  # the GAs run until their budget stops them
MAX_IDLE = 2000  # candidates in a row served from the cache: the run is stuck (reported as stalled)


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
        from lpes_harness.core.files import read_jsonl

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
        from lpes_harness.core.files import append_jsonl

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
    """The sweep's complete points as a GeneticSearch cache (as ``lpes_harness.search.search_stage`` seeds it):
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
