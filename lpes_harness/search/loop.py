"""The search loop: the paper's Algorithm 1, with a fitness cache, callbacks and resumable state.

Generation 0 is the initial population: the paper's starting individual ``(k(L-1)/d, 1.5)``
(or the ``start`` genome given), then the ``lines`` genomes given (each an individual of its own,
e.g. the straight lines of ``--lines``), and mutants of the start until the population is full
(``initial="random"``: as many uniformly random valid genomes) (brute-force mode: ``population`` random
per-layer genomes). Each of the ``generations`` that follow is::

    parents   = the `parents` fittest of the population
    children  = `crossovers` crossovers of two random parents (the loop evaluates both
                children of each and keeps the fitter)
    mutants   = `mutants` mutants of random parents
    population = parents + children + mutants

The loop knows nothing of files, plots or lm-eval. As in DEAP's ``eaSimple``, the toolbox's
operators only vary, ``toolbox.evaluate`` is the user's pure function of the layer scales,
``evaluate(scales, threshold=None) -> (fitness, info)`` (``info`` JSON-serialisable; the
threshold only when it takes one, see racing in fitness.py), and the loop assigns each
individual's fitness itself (``individual.fitness``, ``.scales``, ``.info``) and reports to
callbacks, which observe it through their hooks (one dispatcher, :meth:`GeneticSearch._call_hooks`;
``on_exception`` when a run fails). A callback with state of its own keeps it in the search's
state (``state_dict`` / ``load_state_dict``), as Lightning callbacks do.

**Fitness cache.** Results are keyed by the layer scales rounded to ``cache_decimals``, so
a genome whose scales were seen before (a duplicate mutant, a crossover child equal to an
earlier individual) is never evaluated again.

**Generation statistics** (``on_generation_end``'s ``stats``): ``best_fitness`` and
``mean_fitness`` are over the individuals whose fitness is complete. One stopped early by
racing (``info["raced"]``) has only an upper bound; those are counted in ``raced_out`` and
their bounds listed in ``raced_bounds``, never averaged with real fitness values
(``complete`` counts the others, ``fitnesses`` lists theirs).

**Stopping early.** A callback may set ``search.should_stop`` (as a Lightning callback sets
``trainer.should_stop``; :class:`~lpes_harness.search.callbacks.TimeLimitCallback` does, for
``--time-budget``). The loop then processes no further individual: the generation being built ends
with those already processed (generation 0 keeps at least its start), it is saved like any finished
generation, and the run ends. A resume of such a run goes on only if no callback stops it again; a
resume replays what was processed before the stop whatever the flag says.

**Determinism and resume.** All randomness comes from one ``random.Random(seed)`` the
search owns. :meth:`GeneticSearch.state_dict` holds the state at the start of the current
generation (population, fitnesses, generation index, RNG state, statistics) plus the whole
fitness cache and how many individuals were processed. Loading it and calling
:meth:`~GeneticSearch.run` replays the current generation from its start: the same RNG draws
give the same individuals, whose fitness the cache already holds, so nothing that was
finished is evaluated again, callbacks are not told twice, and the run ends exactly where
an uninterrupted run would (given a deterministic ``evaluate``).
"""

from __future__ import annotations

import inspect
import math
import random
import time
from typing import Any, Callable, Sequence

from lpes_harness.core.curves import smoothness
from lpes_harness.search.genome import (GenomeSpec, initial_genome, make_individual, random_brute_force_genome,
                                        random_genome)
from lpes_harness.search.config import SearchConfig
from lpes_harness.search.fingerprint import state_mismatches
from lpes_harness.search.operators import build_toolbox, fitter

STATE_FORMAT = 1
EvaluateFn = Callable[..., "tuple[float, Any]"]  # (scales[, threshold=]) -> (fitness, info)


def is_raced(individual) -> bool:
    """Whether racing stopped this individual early: its fitness is then an upper bound only."""
    info = getattr(individual, "info", None)
    return isinstance(info, dict) and bool(info.get("raced"))


def cache_key(scales: Sequence[float], decimals: int = 6) -> tuple[float, ...]:
    """Key of the fitness cache: the layer scales rounded to ``decimals``."""
    return tuple(round(float(s), decimals) for s in scales)


class Callback:
    """Base class of search observers (Lightning style): override the hooks you need."""

    def on_search_start(self, search: "GeneticSearch") -> None:
        """Called by :meth:`GeneticSearch.run`, also when it resumes (``search.resumed``)."""

    def on_individual(self, search: "GeneticSearch", record: dict) -> None:
        """After each processed individual (evaluated, or served from the cache)."""

    def on_generation_end(self, search: "GeneticSearch", stats: dict) -> None:
        """After a generation's population is complete (generation 0 is the initial one)."""

    def on_search_end(self, search: "GeneticSearch", result: dict) -> None:
        """After the last generation."""

    def on_exception(self, search: "GeneticSearch", error: BaseException) -> None:
        """When :meth:`GeneticSearch.run` fails (the error is raised again after the hooks)."""

    @property
    def state_key(self) -> str:
        """Where this callback's state is kept in the search's state."""
        return type(self).__name__

    def state_dict(self) -> dict:
        """This callback's own state, saved with the search's (empty: nothing saved)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""


class GeneticSearch:
    """Algorithm 1 over a :class:`GenomeSpec`, driven by :meth:`run`."""

    def __init__(
        self,
        spec: GenomeSpec,
        evaluate: EvaluateFn,
        config: SearchConfig = SearchConfig(),
        callbacks: Sequence[Callback] = (),
        start: Sequence[Sequence[float]] | None = None,
        lines: Sequence[Sequence[Sequence[float]]] = (),
    ):
        # ``start``: generation 0's first individual, around which the rest are its mutants (default
        # :func:`initial_genome`, the paper's flat start at ``spec.initial_y``). ``lines``: generation 0's
        # next individuals, scored right after the start and before any mutant or draw (a shape known to
        # be worth a try is tried while the budget lasts), each in the place of one mutant.
        if lines and spec.brute_force:  # before validity: a line's control points are never a brute-force genome
            raise ValueError("lines are Bézier genomes; a brute-force search draws its whole first generation")
        if len(lines) > config.population - 1:
            raise ValueError(f"{len(lines)} lines do not fit in a population of {config.population} beside its start")
        for name, genome in [("start", start)] * (start is not None) + [("line", g) for g in lines]:
            if not spec.is_valid(genome):
                raise ValueError(f"the {name} genome is not valid for this spec: {'; '.join(spec.violations(genome))}")
        self.start = [(float(x), float(y)) for x, y in start] if start is not None else None
        self.lines = [[(float(x), float(y)) for x, y in genome] for genome in lines]
        self.spec = spec
        self.config = config
        self.callbacks = list(callbacks)
        # Racing (see fitness.py): an evaluate that takes `threshold` may stop early once an
        # individual provably cannot be selected as a parent.
        self._evaluate_takes_threshold = "threshold" in inspect.signature(evaluate).parameters
        self._kept_fitnesses: list[float] = []  # members of the population being built
        self.rng = random.Random(config.seed)
        self.toolbox = build_toolbox(
            spec,
            self.rng,
            max_dx=config.mx,
            max_dy=config.my,
            crossover_tries=config.crossover_tries,
            num_parents=config.parents,
            mutation=config.mutation,
            max_dy_base=config.my_base,
        )
        self.toolbox.register("evaluate", evaluate)
        self.cache: dict[tuple[float, ...], tuple[float, Any]] = {}
        self.population: list | None = None  # the population of `completed_generation`
        self.completed_generation = -1
        self.generation_stats: list[dict] = []
        self.best: dict | None = None
        self.processed = 0  # individuals processed in this run, in order (cache hits included)
        self.evaluations = 0  # calls to `evaluate` made by this process
        self.resumed = False
        self.should_stop = False  # set by a callback: process no further individual (see the module docstring)
        self._replay_until = 0  # individuals below this index were reported before a resume
        self._generation = 0  # the generation being built
        self._boundary = self._snapshot()

    @property
    def replay_until(self) -> int:
        """After a resume: individuals with a smaller index were already reported before the stop."""
        return self._replay_until

    # ----------------------------------------------------------------- running
    def run(self) -> dict:
        try:
            self._call_hooks("on_search_start")
            if self.completed_generation < 0:
                self._generation = 0
                self._finish_generation(self._initial_population())
            while not self._stopping() and self.completed_generation < self.config.generations:
                self._generation = self.completed_generation + 1
                self._finish_generation(self._next_generation(self.population))
            result = self.result()
            self._call_hooks("on_search_end", result)
        except BaseException as error:
            self._call_hooks("on_exception", error)
            raise
        return result

    def _stopping(self) -> bool:
        """Whether to process no further individual. After a resume the individuals processed before
        the stop are replayed regardless (from the cache, at no cost), so the run goes on from where it was."""
        return self.should_stop and self.processed >= self._replay_until

    def _call_hooks(self, name: str, *args) -> None:
        """Call hook ``name`` of every callback, in order, with ``(self, *args)``."""
        for callback in self.callbacks:
            getattr(callback, name)(self, *args)

    def _initial_population(self) -> list:
        if self.spec.brute_force:
            population = [make_individual(random_brute_force_genome(self.spec, self.rng))
                          for _ in range(self.config.population)]
            for individual in population:
                individual.origin = "random"
        else:
            first = make_individual(self.start if self.start is not None else initial_genome(self.spec))
            first.origin = "initial"
            population = [first]
            for genome in self.lines:
                line = make_individual(genome)
                line.origin = "line"
                population.append(line)
            for _ in range(self.config.population - 1 - len(self.lines)):
                if self.config.initial == "random":
                    other = make_individual(random_genome(self.spec, self.rng))
                    other.origin = "random"
                else:
                    (other,) = self.toolbox.mutate(self.toolbox.clone(first))
                    other.origin = "mutant"
                population.append(other)
        self._kept_fitnesses = []
        for count, individual in enumerate(population):
            if count and self._stopping():  # the start is always scored: a generation is never empty
                return population[:count]
            self._assign_fitness(individual)
            self._kept_fitnesses.append(individual.fitness.values[0])
        return population

    def _next_generation(self, population: list) -> list:
        parents = self.toolbox.select(population)
        self._kept_fitnesses = [parent.fitness.values[0] for parent in parents]
        children = []
        for _ in range(self.config.crossovers):
            if self._stopping():
                return parents + children
            parent1, parent2 = self.rng.sample(parents, 2)
            offspring = self.toolbox.mate(parent1, parent2)
            for child in offspring:
                self._assign_fitness(child)
            child = fitter(offspring)
            children.append(child)
            self._kept_fitnesses.append(child.fitness.values[0])
        mutants = []
        for _ in range(self.config.mutants):
            if self._stopping():
                break
            (mutant,) = self.toolbox.mutate(self.toolbox.clone(self.rng.choice(parents)))
            mutant.origin = "mutant"
            self._assign_fitness(mutant)
            self._kept_fitnesses.append(mutant.fitness.values[0])
            mutants.append(mutant)
        return parents + children + mutants

    def _assign_fitness(self, individual) -> None:
        """Sets one individual's fitness, from the cache or ``toolbox.evaluate``; reports it to callbacks."""
        scales = self.spec.scales(individual)
        individual.scales = scales
        key = cache_key(scales, self.config.cache_decimals)
        index = self.processed
        cached = key in self.cache
        started = time.perf_counter()
        if cached:
            fitness, info = self.cache[key]
        else:
            fitness, info = self._call_evaluate(scales, individual)
            self.cache[key] = (fitness, info)
            self.evaluations += 1
        seconds = time.perf_counter() - started
        # Counted once done: a state saved while it runs (on_exception) does not claim it.
        self.processed += 1
        individual.fitness.values = (fitness,)
        individual.info = info
        record = {
            "index": index,
            "generation": self._generation,
            "origin": getattr(individual, "origin", "unknown"),
            "genome": [list(point) for point in individual],
            "scales": scales,
            "fitness": fitness,
            "info": info,
            "cached": cached,
            "seconds": seconds,
        }
        if self.best is None or fitness > self.best["fitness"]:
            self.best = {k: record[k] for k in ("index", "generation", "origin", "genome", "scales", "fitness", "info")}
        if index >= self._replay_until:
            self._call_hooks("on_individual", record)

    def selection_threshold(self) -> float:
        """Fitness an individual must reach to possibly be among the next parents.

        The ``parents``-th best of the population being built so far. It only grows (the
        parents are carried over), so an individual proven to fall below it can never be
        selected, now or later: racing may stop its evaluation early without changing
        which parents are selected.
        """
        kept = sorted(self._kept_fitnesses, reverse=True)
        if len(kept) < self.config.parents:
            return -math.inf
        return kept[self.config.parents - 1]

    def _call_evaluate(self, scales: list[float], individual) -> tuple[float, Any]:
        """``toolbox.evaluate`` on the scales alone; ``individual`` only names the genome in errors."""
        if self._evaluate_takes_threshold:
            returned = self.toolbox.evaluate(list(scales), threshold=self.selection_threshold())
        else:
            returned = self.toolbox.evaluate(list(scales))
        try:
            fitness, info = returned
            fitness = float(fitness)
        except (TypeError, ValueError):
            raise TypeError(
                f"evaluate must return (fitness, info) with a numeric fitness; got {returned!r} "
                f"for genome {list(individual)}"
            ) from None
        if not math.isfinite(fitness):
            raise ValueError(f"evaluate returned a non-finite fitness {fitness} for genome {list(individual)}")
        return fitness, info

    def _finish_generation(self, population: list) -> None:
        self.population = population
        self.completed_generation = self._generation
        # A raced-out individual has only an upper bound, not a fitness: the statistics use the
        # complete ones, and count (and keep the bounds of) the raced ones apart.
        complete = [i for i in population if not is_raced(i)]
        raced = [i for i in population if is_raced(i)]
        ranked = complete or population
        best = max(ranked, key=lambda individual: individual.fitness.values[0])
        fitnesses = [individual.fitness.values[0] for individual in complete]
        stats = {
            "generation": self._generation,
            "best_fitness": best.fitness.values[0],
            "mean_fitness": sum(fitnesses) / len(fitnesses) if fitnesses else None,
            "complete": len(complete),
            "raced_out": len(raced),
            "fitnesses": fitnesses,
            "raced_bounds": [individual.fitness.values[0] for individual in raced],
            "best_genome": [list(point) for point in best],
            "best_scales": list(best.scales),
            "processed": self.processed,
        }
        scores = (getattr(best, "info", None) or {}).get("scores")
        if isinstance(scores, dict):
            stats["best_scores"] = scores  # per role, or per condition: what the plots draw by generation
        if self.spec.num_layers >= 3:
            stats["best_smoothness"] = self._smoothness(best.scales)
            stats["mean_smoothness"] = sum(self._smoothness(i.scales) for i in population) / len(population)
        self.generation_stats.append(stats)
        self._boundary = self._snapshot()
        self._call_hooks("on_generation_end", stats)

    def _smoothness(self, scales) -> float:
        """Smoothness of a curve; of a ``both`` genome's two curves, the mean (never across the seam)."""
        n = self.spec.num_layers
        parts = [scales[k * n:(k + 1) * n] for k in range(len(scales) // n)]
        return sum(smoothness(part) for part in parts) / len(parts)

    def result(self) -> dict:
        return {
            "best": self.best,
            "completed_generation": self.completed_generation,
            "processed": self.processed,
            "evaluations": self.evaluations,
            "cache_size": len(self.cache),
            "stopped_early": self.should_stop,
        }

    # ------------------------------------------------------------------- state
    def _snapshot(self) -> dict:
        """The state at a generation boundary (what a resume replays from)."""
        version, internal, gauss_next = self.rng.getstate()
        return {
            "completed_generation": self.completed_generation,
            "population": None
            if self.population is None
            else [{"genome": [list(p) for p in ind], "fitness": ind.fitness.values[0]} for ind in self.population],
            "rng_state": [version, list(internal), gauss_next],
            "generation_stats": [dict(s) for s in self.generation_stats],
            "best": None if self.best is None else dict(self.best),
            "processed": self.processed,
        }

    def state_dict(self) -> dict:
        """Everything needed to resume: JSON-serialisable (if ``info`` values are)."""
        state = {
            "format": STATE_FORMAT,
            "spec": self.spec.to_dict(),
            "config": self.config.to_dict(),
            **self._boundary,
            "processed_total": self.processed,
            "cache": [[list(key), fitness, info] for key, (fitness, info) in self.cache.items()],
        }
        callbacks = self.callback_states()
        if callbacks:
            state["callbacks"] = callbacks
        return state

    def callback_states(self) -> dict:
        """The state of each callback with state of its own, by its ``state_key``."""
        return {cb.state_key: own for cb in self.callbacks if (own := cb.state_dict())}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`; :meth:`run` then continues where it stopped.

        The spec and config must match the saved ones (:func:`~lpes_harness.search.fingerprint.state_mismatches`),
        except ``generations``, which may grow to extend a finished run.
        """
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported search state format {state.get('format')!r}; expected {STATE_FORMAT}")
        mismatches = state_mismatches(state, self.spec.to_dict(), self.config.to_dict())
        if mismatches:
            raise ValueError("the checkpoint was made with different settings: " + "; ".join(mismatches))
        version, internal, gauss_next = state["rng_state"]
        self.rng.setstate((version, tuple(internal), gauss_next))
        self.cache = {tuple(key): (fitness, info) for key, fitness, info in state["cache"]}
        self.completed_generation = state["completed_generation"]
        self.population = None
        if state["population"] is not None:
            self.population = []
            for saved in state["population"]:
                individual = make_individual(saved["genome"])
                individual.scales = self.spec.scales(individual)
                individual.fitness.values = (saved["fitness"],)
                cached = self.cache.get(cache_key(individual.scales, self.config.cache_decimals))
                individual.info = cached[1] if cached else None
                self.population.append(individual)
        self.generation_stats = [dict(s) for s in state["generation_stats"]]
        self.best = None if state["best"] is None else dict(state["best"])
        self.processed = state["processed"]
        self._replay_until = state["processed_total"]
        saved_callbacks = state.get("callbacks") or {}
        for callback in self.callbacks:
            if callback.state_key in saved_callbacks:
                callback.load_state_dict(saved_callbacks[callback.state_key])
        self.resumed = True
        self._boundary = self._snapshot()
