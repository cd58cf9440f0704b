"""The search command (``lpes-search``, or ``python searches/ga.py``): wires model, fitness, loop and callbacks.

The flags, profiles and input checks are in :mod:`lpes_harness.search.cli`.

Everything a run makes goes to ``--output`` (default ``results/<run-name>/``):

- ``scales.json``       the best layer scales so far (``lpes_hf scales=<path>`` reads it);
- ``config.json``       every setting of the run, and the command line;
- ``history.jsonl``     every individual: genome, scales, per-position scores, fitness, time;
- ``generations.jsonl`` best / mean fitness and smoothness per generation;
- ``curve.png``, ``fitness.png``;
- ``checkpoint.json``   the full search state at every generation's end, and ``checkpoint.jsonl``
                        one line per individual since (``--resume`` reads both);
- ``sweep.json``        the uniform sweep, and while it runs ``sweep.jsonl``, one line per point.

``config.json`` is written once the model is loaded, before the sweep: from then on the folder
holds a run that ``--resume --output DIR`` continues with the settings recorded there
(``"settings"``, :func:`lpes_harness.search.cli.settings_record`) and checks against the
recorded fingerprint; nothing scored is lost to a kill (sweep points, individuals and held-out
blocks are each on disk as soon as they are scored).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path

from lpes_harness.files import append_jsonl, atomic_write_json, kill_point, read_jsonl
from lpes_harness.models import choose_dtype, default_device
from lpes_harness.search.callbacks import CheckpointCallback, HistoryCallback, PlotCallback, ProgressCallback, load_checkpoint
from lpes_harness.search.cli import RUN_RECORD, parse_args, read_run_record, run_folder, settings_record
from lpes_harness.search.config import SearchConfig
from lpes_harness.search.fingerprint import fingerprint, mismatches
from lpes_harness.search.fitness import FitnessConfig
from lpes_harness.search.loop import Callback, GeneticSearch, cache_key
from lpes_harness.search.sweep import plot_sweep, run_sweep, snap_initial_y

# ----------------------------------------------------------------------------- callbacks


class BestScalesCallback(Callback):
    """Keeps ``scales.json`` (and the best control points) up to date after each generation."""

    def __init__(self, directory: Path, model_name: str, dtype: str | None = None, scaling: str = "position"):
        self.directory = directory
        self.model_name = model_name
        self.dtype = dtype
        self.scaling = scaling

    def on_generation_end(self, search, stats) -> None:
        from lpes_harness.scales_file import write_scales_file

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


# ----------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> dict:
    from lpes_harness.search import distributed
    from lpes_harness.search.genome import GenomeSpec

    launched = time.perf_counter()  # the wall time a user waits: model load and sweep included
    settings = settings_record(args)  # as given: before the sweep moves args.initial_y
    output = run_folder(args)
    checkpoint_path = output / "checkpoint.json"
    record_path = output / RUN_RECORD
    holds_run = checkpoint_path.exists() or record_path.exists()
    if holds_run and not (args.resume or args.overwrite):
        _fail(f"{output} already holds a run: pass --resume to continue it or --overwrite to start afresh")
    if args.resume and not holds_run:
        _fail(f"--resume: no run in {output} to continue (no {RUN_RECORD}, no checkpoint.json)")
    try:
        record = read_run_record(output) if args.resume else None
    except ValueError as err:
        _fail(f"--resume {output}: {err}")
    resume_search = args.resume and checkpoint_path.exists()  # else a resume before the search began

    config = SearchConfig.from_settings(args)  # the flags have the config's names
    fitness_config = FitnessConfig(
        task=args.task, fitness=args.fitness, objective=args.objective, weights=args.weights_dict, positions=args.positions_dict,
        metadata=args.metadata, num_samples=args.num_samples, chunk_size=args.chunk_size, racing=args.racing,
        scorer=args.scorer, chat_template={"auto": None, "on": True, "off": False}[args.chat_template],
        batch_size=int(args.batch_size) if str(args.batch_size).isdigit() else args.batch_size,
    )
    args.dtype_chosen = choose_dtype(args.dtype_requested, args.device or default_device())
    current = fingerprint({**vars(args), **vars(fitness_config), "dtype": args.dtype_chosen})
    if args.resume:  # before anything is loaded or written: a resume never mixes two experiments
        _check_resume(output, record, load_checkpoint(checkpoint_path) if resume_search else None, current)
    if args.heldout_samples:
        _check_heldout_cache(output, args)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    context = distributed.init()
    lm = load_lm(args)
    from lpes_harness import rope

    n_layers = rope.num_layers(lm.model)
    fitness = distributed.make_fitness(lm, fitness_config, context)
    if not context.is_main:
        distributed.serve(fitness, context)  # follow rank 0's evaluations until it is done
        return {}

    print(f"model dtype {args.dtype_chosen} (--dtype {args.dtype}); chat template "
          f"{'on' if fitness.chat_template else 'off'}; task {args.task}, positions {fitness_config.positions}", flush=True)
    from lpes_harness.analysis.paired import task_positions

    spec = GenomeSpec(
        num_layers=n_layers, num_points=args.control_points, y_min=args.y_min, y_max=args.y_max,
        y_step=args.y_step, curve=args.curve, brute_force=args.brute_force, initial_y=args.initial_y,
        held_layers=_held_layers(lm, args.layer_type),
    )

    def run_record() -> dict:
        return {
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "search": config.to_dict(), "genome": spec.to_dict(),
            "fitness": dict(vars(fitness_config)),
            "model": {"pretrained": args.pretrained or "bundled SmolLM2-135M-Instruct (GGUF)",
                      "model_args": args.model_args, "num_layers": n_layers,
                      "dtype": args.dtype_chosen, "dtype_requested": args.dtype},
            "chat_template": fitness.chat_template,
            "sweep": args.sweep_values, "heldout_samples": args.heldout_samples,
            "processes": context.world, "profile": args.profile,
            "settings": settings,  # what `--resume --output DIR` restores
            "fingerprint": current,  # what it compares before the search has a checkpoint
        }

    if not resume_search:
        # From here on the folder holds a run that --resume continues: before the sweep and the
        # start-up timing, so that nothing they score is lost to a kill.
        if not args.resume:
            _clear_run_state(output)  # --overwrite: an old run's state must not be resumed into this one
        _write_config(record_path, args.resume, run_record())
    # The held-out table scores every position of the task for vanilla, LPES and --heldout-extra's
    # rows: PI, and at worst the sweep's best uniform scale (left out when it is 1).
    heldout_methods = 2 + ("pi" in args.heldout_extra) + bool(args.sweep_values and "uniform" in args.heldout_extra)
    print_estimate(config, fitness, args.sweep_values,
                   heldout_methods * len(task_positions(args.task)) * args.heldout_samples)
    sweep = None
    if args.sweep_values:
        sweep = _load_or_run_sweep(output, args, fitness, spec)
        args.initial_y = snap_initial_y(sweep["best"], args.y_min, args.y_max, args.y_step)
        spec = dataclasses.replace(spec, initial_y=args.initial_y)
        print(f"sweep: best uniform scale {sweep['best']:g} -> the search starts from y = {args.initial_y:g} "
              f"(range [{args.y_min:g}, {args.y_max:g}] kept)", flush=True)
        if not resume_search:
            _record_genome(record_path, spec)  # the genome the search starts from
    callbacks = [
        HistoryCallback(output / "history.jsonl", output / "generations.jsonl"),
        BestScalesCallback(output, args.pretrained or "SmolLM2-135M-Instruct", args.dtype_chosen, args.scaling),
        PlotCallback(output, args.scaling),
        ProgressCallback(disable=args.no_progress or None),
        CheckpointCallback(checkpoint_path, extra={"fingerprint": current}),  # last: the files above agree with it
    ]
    search = GeneticSearch(spec, fitness, config, callbacks)
    for point in (sweep or {}).get("points", []):
        if not (point.get("info") or {}).get("raced"):  # a complete sweep point is a known fitness
            search.cache[cache_key(spec.uniform(point["scale"]), config.cache_decimals)] = (point["fitness"], point["info"])
    try:
        if resume_search:
            # Before any file is written: a checkpoint made with other settings changes nothing.
            try:
                search.load_state_dict(load_checkpoint(checkpoint_path))
            except ValueError as err:
                _fail(f"--resume {output}: {err}")
            _write_config(record_path, True, run_record())
        started = time.perf_counter()
        result = search.run()
    finally:
        distributed.release(context)  # other ranks stop waiting, also when rank 0 fails
    result["wall_seconds"] = round(time.perf_counter() - started, 1)  # the GA itself
    result["total_seconds"] = round(time.perf_counter() - launched, 1)  # load + sweep + GA
    result["fitness_evaluations"] = fitness.evaluations
    if sweep is not None:
        result["sweep"] = {"best": sweep["best"], "points": [{k: p[k] for k in ("scale", "fitness")} for p in sweep["points"]]}
        plot_sweep(sweep, output / "sweep.png", result["best"]["scales"])
    atomic_write_json(output / "result.json", result)
    best = result["best"]
    print(f"best fitness {best['fitness']:.4f} (generation {best['generation']}), scores {best['info'].get('scores')}")
    print(f"scales written to {output / 'scales.json'}; use: lm_eval --model lpes_hf --model_args scales={output / 'scales.json'}")
    if args.heldout_samples:
        result["heldout"] = evaluate_heldout(lm, args, fitness, spec, best["scales"], sweep, output)
        result["total_seconds_with_heldout"] = round(time.perf_counter() - launched, 1)
        atomic_write_json(output / "result.json", result)
    return result


def _fail(message: str):
    """One line on stderr, exit status 2 (as the command line's own errors)."""
    print(f"lpes-search: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _check_resume(output: Path, record: dict | None, checkpoint: dict | None, current: dict) -> None:
    """Refuse, before anything is written and with exit status 2, a resume whose settings differ from
    the run's: one line per difference (so one changed flag is one line), compared with the
    checkpoint's fingerprint or, before the search has a checkpoint (a kill in the sweep), with the
    one ``config.json`` recorded. A folder from before runs recorded their settings gets one line
    that says to give its flags again."""
    saved = (checkpoint or record or {}).get("fingerprint")
    what = "the checkpoint was" if checkpoint is not None else "the run was"
    problems = mismatches(saved, current) if saved else [f"{'the checkpoint' if checkpoint else 'the run'} has no "
                                                         "fingerprint (made before it existed)"]
    if not problems:
        return
    prefix = f"--resume {output}: {what} made with different settings: "
    if not (record or {}).get("settings"):
        # A folder from before runs recorded their settings: the flags not given took their
        # defaults, so many may differ; one line says what to do.
        command = (record or {}).get("command")
        _fail(prefix + "; ".join(problems) + " (this run folder was made before runs recorded their settings for "
              "--resume: give its flags again" + (f", as in its command: {command})" if command else ")"))
    for line in problems[:-1]:  # one line per difference: one changed flag is one line
        print(f"lpes-search: error: {prefix}{line}", file=sys.stderr)
    _fail(prefix + problems[-1])


# What a fresh start (a new run, or --overwrite) removes first: the state a resume would read.
RUN_STATE = ("checkpoint.json", "checkpoint.jsonl", "sweep.json", "sweep.jsonl", "result.json")


def _clear_run_state(output: Path) -> None:
    for name in RUN_STATE:
        (output / name).unlink(missing_ok=True)


def _write_config(path: Path, resume: bool, record: dict) -> None:
    """config.json is the first run's record; a resume appends to its ``resumes`` list, never replaces it.

    Only ``settings`` and ``fingerprint``, what the next ``--resume`` restores and compares, become
    this run's (they differ only where a resume may differ: a grown ``--generations``, ``--threads``,
    ...; the resume's entry lists them under ``changed``)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    if resume and path.exists():
        first = json.loads(path.read_text())
        entry = {"command": record["command"], "at": now}
        previous = first.get("settings") or {}
        changed = {name: {"saved": previous[name], "now": value} for name, value in record["settings"].items()
                   if name in previous and previous[name] != value}
        if changed:
            entry["changed"] = changed
        first.setdefault("resumes", []).append(entry)
        first["settings"], first["fingerprint"] = record["settings"], record["fingerprint"]
        atomic_write_json(path, first)
    else:
        atomic_write_json(path, {**record, "started": now})


def _record_genome(path: Path, spec: GenomeSpec) -> None:
    """config.json's ``genome`` once the sweep has chosen the start (``initial_y``)."""
    record = json.loads(path.read_text())
    if record.get("genome") != spec.to_dict():
        atomic_write_json(path, {**record, "genome": spec.to_dict()})


def _heldout_cache(output: Path, args):
    from lpes_harness.analysis import paired
    from lpes_harness.analysis.score_cache import ScoreCache

    identity = paired.cache_identity(args.task, args.metadata, args.chat_template, args.pretrained, args.dtype_chosen,
                                     args.scaling)
    return ScoreCache(output / paired.CACHE_FILE, identity)


def _check_heldout_cache(output: Path, args) -> None:
    """Before the search, not after it: held-out scores left in ``output`` by another run.

    ``--overwrite`` starts afresh, so they go. Otherwise they are reused when they were made for
    the same samples, model and dtype (what ``analysis.paired --output`` shares), and a file made
    for others stops the command now instead of at the held-out table an hour later."""
    from lpes_harness.analysis.paired import CACHE_FILE

    if args.overwrite:
        (output / CACHE_FILE).unlink(missing_ok=True)
        return
    try:
        _heldout_cache(output, args)
    except ValueError as err:
        raise SystemExit(f"lpes-search: error: {err}") from None


def evaluate_heldout(lm, args, fitness, spec: GenomeSpec, scales, sweep, output: Path) -> dict:
    """The best curve and vanilla on held-out samples, paired; with --heldout-extra's rows: the curve's
    PI and the sweep's best uniform scale (both by default)."""
    from lpes_harness.analysis import paired
    from lpes_harness.analysis.paired import lpes_methods, score_methods
    from lpes_harness.analysis.paired_table import format_plain, paired_table, write_comparison

    uniform = sweep is not None and sweep["best"] != 1.0 and "uniform" in args.heldout_extra
    # PI and the uniform row move the layers the search moved (--layer-type holds the others at 1).
    methods = lpes_methods(scales, [sweep["best"]] if uniform else [], spec.held_layers)
    if "pi" not in args.heldout_extra:
        del methods["PI"]
    print(f"held-out: {', '.join(methods)} on {args.heldout_samples} samples per position "
          f"(the same samples for each)...", flush=True)
    started = time.perf_counter()
    # Cached as the paired command caches: a killed held-out stage resumes (--resume), and
    # `python -m lpes_harness.analysis.paired --output <this run>` reuses these scores.
    cache = _heldout_cache(output, args)
    total = len(methods) * len(paired.task_positions(args.task)) * args.heldout_samples
    with paired.sample_bar(total, disable=args.no_progress or None) as progress:
        scored = score_methods(lm, args.task, methods, num_samples=args.heldout_samples, metadata=args.metadata,
                               chat_template=fitness.chat_template, cache=cache, progress=progress)
    if args.layer_type:
        scored["layer_type"] = args.layer_type  # the table's notes say which layers PI moved
    table = paired_table(scored)
    files = write_comparison(table, scored, output)
    print(format_plain(table))
    print(f"held-out table: {files['md']}, plot: {files['png']} ({time.perf_counter() - started:.0f} s)")
    return {"table_file": str(files["json"].name), "average": {k: r["average"] for k, r in table["rows"].items()}}


def _held_layers(lm, layer_type: str | None) -> tuple[int, ...]:
    """The layers ``--layer-type`` keeps at 1: those of every other attention type."""
    if not layer_type:
        return ()
    from lpes_harness.analysis.layer_types import config_layer_types, layers_not_of

    types = config_layer_types(lm.model.config)
    try:
        held = layers_not_of(types, layer_type)
    except ValueError as err:
        raise SystemExit(f"lpes-search: error: {err}") from None
    moved = [str(i) for i, kind in enumerate(types) if kind == layer_type]
    print(f"--layer-type {layer_type}: the search moves layers {', '.join(moved)}; the other "
          f"{len(held)} stay at 1", flush=True)
    return held


def _load_or_run_sweep(output: Path, args, fitness, spec: GenomeSpec) -> dict:
    """The sweep of this run: read back on --resume (same values), else scored now and saved.

    Each point is journalled in ``sweep.jsonl`` as soon as it is scored: a sweep killed part way
    resumes with the points it had (they are not scored again), and ``sweep.json`` replaces the
    journal once the sweep is complete."""
    path, journal = output / "sweep.json", output / "sweep.jsonl"
    if args.resume and path.exists():
        saved = json.loads(path.read_text())
        if [p["scale"] for p in saved["points"]] == sorted(args.sweep_values):
            journal.unlink(missing_ok=True)  # left by a kill between the two
            return saved
    known = {}
    if args.resume:  # the run's settings were checked: its journal holds points of this very sweep
        known = {line["scale"]: (line["fitness"], line["info"]) for line in read_jsonl(journal)
                 if line.get("scale") in args.sweep_values}
    else:
        journal.unlink(missing_ok=True)
    print(f"sweep: uniform scales {', '.join(f'{v:g}' for v in args.sweep_values)}"
          f"{f' ({len(known)} scored before the stop, read back from {journal.name})' if known else ''}", flush=True)

    def journal_point(point: dict) -> None:
        append_jsonl(journal, point)
        kill_point("sweep")  # test hook (lpes_harness.files.kill_point): a kill in the sweep

    sweep = run_sweep(fitness, args.sweep_values, spec.uniform, known=known, on_point=journal_point)
    for point in sweep["points"]:
        info = point["info"] or {}
        print(f"  uniform {point['scale']:g}: fitness {point['fitness']:.4f}{' (raced out)' if info.get('raced') else ''} "
              f"{info.get('scores')}", flush=True)
    atomic_write_json(path, sweep)
    journal.unlink(missing_ok=True)
    return sweep


def load_lm(args):
    from lm_eval.utils import simple_parse_args_string

    from lpes_harness.lm import LPESLM

    extra = simple_parse_args_string(args.model_args)
    extra.pop("dtype", None)  # resolved into args.dtype_chosen (auto -> bfloat16 only where native)
    extra["scaling"] = args.scaling  # --model-args may repeat it, never contradict it (cli._check)
    # lm-eval's own "auto" probes ever larger batches at the full window: slow on a CPU, and the
    # one-pass fitness batches by itself (FitnessConfig.batch_size); so lm-eval gets a number.
    batch_size = int(args.batch_size) if str(args.batch_size).isdigit() else 1
    return LPESLM(pretrained=args.pretrained, device=args.device, batch_size=batch_size, dtype=args.dtype_chosen, **extra)


def print_estimate(config: SearchConfig, fitness, sweep_values=(), heldout_samples: int = 0) -> None:
    """Time one sample per role now, and project the run's worst case (no cache hits, no racing).

    ``heldout_samples``: all the samples of the held-out table after the search (0: none)."""
    # The first forward of a process pays one-off setup (kernel selection, allocator growth), and
    # the projection multiplies the timed sample by thousands: it is left out of the timing.
    fitness.score_samples(next(iter(fitness.sizes)), [0])
    started = time.perf_counter()
    for role in fitness.sizes:
        fitness.score_samples(role, [0])  # this process only: no collective call before the search starts
    per_sample = (time.perf_counter() - started) / len(fitness.sizes)
    samples = sum(fitness.sizes.values())
    individuals = config.planned_individuals() + len(sweep_values)
    worst = individuals * samples * per_sample
    heldout = (f"; then the held-out table, {heldout_samples} samples = {_duration(heldout_samples * per_sample)}"
               if heldout_samples else "")
    print(
        f"cost estimate: at most {individuals} individuals x {samples} samples "
        f"({len(fitness.sizes)} roles) x {per_sample:.2f} s/sample = {_duration(worst)} worst case; "
        f"the fitness cache and racing cut this (see history.jsonl 'raced' / 'cached'){heldout}",
        flush=True,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    run(args)


if __name__ == "__main__":
    main()
