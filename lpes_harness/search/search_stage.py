"""A search run's genetic search stage: the loop (:class:`~lpes_harness.search.loop.GeneticSearch`) from the
sweep's start, with the run's callbacks, resumed from ``checkpoint.json`` where the run has one.

Reads the run's flags, fitness, genome spec and clock, and the sweep (its complete points are known
fitnesses: the loop's cache holds them). Writes, as it goes, ``history.jsonl``, ``generations.jsonl``,
``scales.json`` (the best so far), ``curve.png``, ``fitness.png``, ``checkpoint.json`` and
``checkpoint.jsonl``. Returns the loop's result (with the sweep's summary, for ``result.json``) and the
search's history, every individual scored over all the run's processes.
"""

from __future__ import annotations

import time
from pathlib import Path

from lpes_harness.core.files import read_jsonl
from lpes_harness.core.scaling import DEFAULT
from lpes_harness.search.callbacks import (CheckpointCallback, HistoryCallback, PlotCallback, ProgressCallback,
                                         SampleOrderCallback)
from lpes_harness.search.genome import ramp_genome
from lpes_harness.search.loop import Callback, GeneticSearch, cache_key
from lpes_harness.search.run_context import Run
from lpes_harness.search.run_record import fail
from lpes_harness.search.sweep import Swept
from lpes_harness.search.timing import time_limit
from lpes_harness.search.uniform_tuning import forwards_of


class BestScalesCallback(Callback):
    """Keeps ``scales.json`` (and the best control points) up to date after each generation."""

    def __init__(self, directory: Path, model_name: str, dtype: str | None = None, scaling: str = DEFAULT):
        self.directory = directory
        self.model_name = model_name
        self.dtype = dtype
        self.scaling = scaling

    def on_generation_end(self, search, stats) -> None:
        from lpes_harness.core.scales_file import write_scales_file

        best = search.best
        write_scales_file(
            self.directory / "scales.json",
            best["scales"],
            scaling=self.scaling,  # what the factors multiply: lpes_hf scales=<file> applies the same
            curve="per-layer" if search.spec.brute_force else search.spec.curve,
            control_points=best["genome"],
            fitness=best["fitness"],
            scores=(best.get("info") or {}).get("scores"),
            generation=stats["generation"],
            model=self.model_name,
            dtype=self.dtype,  # the precision the scales were searched in
        )


def search_stage(run: Run, sweep: Swept | None) -> tuple[dict, list[dict]]:
    """The genetic search: ``(result, history)``. Adds the search's forwards to ``run.forwards``."""
    from lpes_harness.search import distributed

    args, output = run.args, run.output
    callbacks = [
        *time_limit(args, run.launched, run.saved_state),
        HistoryCallback(output / "history.jsonl", output / "generations.jsonl"),
        BestScalesCallback(output, run.model_name, args.dtype_chosen, args.scaling),
        PlotCallback(output, args.scaling, conditions=run.several),
        ProgressCallback(disable=args.no_progress or None),
        SampleOrderCallback(run.fitness),
        CheckpointCallback(run.checkpoint_path, extra={"fingerprint": run.fingerprint}),  # last: the files above agree with it
    ]
    search = GeneticSearch(run.spec, run.fitness, run.config, callbacks,
                           lines=[ramp_genome(run.spec, a, b) for a, b in args.line_values])
    for point in sweep.points if sweep else []:
        if not (point.get("info") or {}).get("raced"):  # a complete sweep point is a known fitness
            search.cache[cache_key(point["scales"], run.config.cache_decimals)] = (point["fitness"], point["info"])
    try:
        if run.resume_search:
            # Before any file is written: a checkpoint made with other settings changes nothing.
            try:
                search.load_state_dict(run.saved_state)
            except ValueError as err:
                fail(f"--resume {output}: {err}")
            run.write_record()
        started = time.perf_counter()
        result = search.run()
    finally:
        distributed.release(run.context, run.fitness)  # other ranks stop waiting, also when rank 0 fails
    result["wall_seconds"] = round(time.perf_counter() - started, 1)  # the GA itself
    result["fitness_evaluations"] = run.fitness.evaluations
    if sweep is not None:
        result["sweep"] = sweep.summary()
    best = result["best"]
    if result["stopped_early"]:
        print(f"the time budget stopped the search after {result['processed']} individuals", flush=True)
    origin = f", {best['origin']}" if best.get("origin") else ""  # initial, line, random, mutant, crossover
    print(f"best fitness {best['fitness']:.4f} (generation {best['generation']}{origin}), scores {best['info'].get('scores')}")
    history = read_jsonl(output / "history.jsonl")  # every process's individuals, a resumed run's too
    run.forwards["search"] = forwards_of(history)
    return result, history
