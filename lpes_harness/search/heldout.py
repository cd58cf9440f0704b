"""The held-out table at the end of a search: vanilla and the run's rows on the same held-out samples,
paired, one block per condition.

One condition (no ``--condition``): ``heldout.{md,json,png}`` and ``scores.cache.json`` in the run
folder, as always. Several: ``heldout/<condition>/`` each, and ``heldout/summary.{md,json,png}``:
per condition and row, the difference from vanilla with its 95 % interval, gained / lost samples and
the exact McNemar p. Scores are cached as ``evaluation.paired`` caches them: a killed table resumes,
and ``python -m lpes_harness.commands.paired --output <that folder>`` reuses them.

:func:`heldout_stage` is the run's last stage; its rows: :func:`heldout_methods`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping, Sequence

from lpes_harness.evaluation.conditions import Condition, apply_chat_template, slug
from lpes_harness.core.files import atomic_write_json
from lpes_harness.core.scaling import SCALINGS
from lpes_harness.methods.setup import MethodSetup
from lpes_harness.search.run_context import Run
from lpes_harness.search.run_record import add_run_seconds
from lpes_harness.search.selection import Candidate, row_name
from lpes_harness.search.sweep import Swept

SUMMARY = "summary"


def heldout_stage(run: Run, sweep: Swept | None, chosen: Candidate, result: dict) -> None:
    """The held-out table of ``--heldout-samples``: vanilla and the run's rows (:func:`heldout_methods`) on
    the same held-out samples. Writes the tables (:func:`evaluate`), adds ``heldout`` to ``result`` and
    writes ``result.json`` again; nothing when the run's choice is the plain model (vanilla alone)."""
    args = run.args
    methods = heldout_methods(args, run.spec, chosen, sweep, result.get("uniform")) if args.heldout_samples else {}
    if len(methods) == 1:  # vanilla alone: the run chose the plain model, and there is nothing to compare
        print("no held-out table: the run's choice is uniform 1, the plain model, and no other row differs from it",
              flush=True)
    elif methods:
        result["heldout"] = evaluate(run.lm, args, run.conditions, run.several, methods, run.output,
                                     batch_size=run.fitness_config.batch_size)
        result["total_seconds_with_heldout"] = round(time.perf_counter() - run.launched, 1)
        add_run_seconds(result, run.record_path, "run_seconds_with_heldout")
        atomic_write_json(run.output / "result.json", result)


def heldout_methods(args, spec, chosen: Candidate, sweep: Swept | None, uniform: dict | None) -> dict:
    """The held-out table's rows (row name -> :class:`~lpes_harness.methods.setup.MethodSetup`): vanilla,
    the curve's PI (``--heldout-extra pi``; a uniform winner is its own PI), the run's curve named for what
    it is, and the best uniform factor (uniform.json, else the sweep's best when ``--heldout-extra
    uniform``). No row repeats vanilla's scales: a run that chose the plain model may leave vanilla alone."""
    from lpes_harness.evaluation.paired import lpes_methods

    rows = {"vanilla": SCALINGS[args.scaling].identity(spec.num_layers)}
    if "pi" in args.heldout_extra and not chosen.is_uniform:
        pi = lpes_methods(chosen.scales, (), spec.held_layers, args.scaling, spec.position_held_layers)["PI"]
        rows["PI"] = list(pi.scales)
    # A run whose choice is uniform 1 (its start, when no curve beat the plain model) is vanilla: its row
    # would score the same model twice.
    if list(chosen.scales) != rows["vanilla"]:
        rows[row_name(chosen.label, chosen.kind)] = list(chosen.scales)
    if uniform is not None:
        extra = (f"{uniform['label']} (uniform.json)", uniform["scales"])
    elif sweep is not None and "uniform" in args.heldout_extra:
        best = sweep.best_point()
        extra = (best["label"], best["scales"]) if best else None
    else:
        extra = None
    if extra and extra[1] not in rows.values():
        rows[extra[0]] = list(extra[1])
    return {name: MethodSetup.of_scales(row) for name, row in rows.items()}


def folders(output: Path, conditions: Sequence[Condition], several: bool) -> dict[str, Path]:
    """Where each condition's table and score cache go."""
    if not several:
        return {conditions[0].name: Path(output)}
    return {c.name: Path(output) / "heldout" / slug(c.name) for c in conditions}


def cache(folder: Path, condition: Condition, args):
    from lpes_harness.evaluation import paired
    from lpes_harness.evaluation.score_cache import ScoreCache

    identity = paired.cache_identity(condition.task, condition.metadata, condition.chat_template, args.pretrained,
                                     args.dtype_chosen, args.scaling)
    return ScoreCache(Path(folder) / paired.CACHE_FILE, identity)


def check_caches(output: Path, conditions: Sequence[Condition], several: bool, args) -> None:
    """Before the search, not after it: held-out scores left in the folders by another run.

    ``--overwrite`` starts afresh, so they go. Otherwise they are reused when they were made for
    the same samples, model and dtype, and a file made for others stops the command now instead of
    at the held-out table hours later (``ValueError``, one line)."""
    from lpes_harness.evaluation.paired import CACHE_FILE

    for condition in conditions:
        folder = folders(output, conditions, several)[condition.name]
        if args.overwrite:
            (folder / CACHE_FILE).unlink(missing_ok=True)
        else:
            cache(folder, condition, args)


def evaluate(lm, args, conditions: Sequence[Condition], several: bool, methods: Mapping[str, MethodSetup],
             output: Path, batch_size=1) -> dict:
    """Score ``methods`` (row name -> set-up, vanilla first) on ``args.heldout_samples`` per position of every condition,
    ``batch_size`` prompts a forward (the fitness's, as its configuration resolved it)."""
    from lpes_harness.evaluation import paired
    from lpes_harness.evaluation.paired_table import format_plain, paired_table, write_comparison

    started = time.perf_counter()
    averages, files = {}, {}
    for condition in conditions:
        folder = folders(output, conditions, several)[condition.name]
        folder.mkdir(parents=True, exist_ok=True)
        print(f"held-out{f' ({condition.name})' if several else ''}: {', '.join(methods)} on {args.heldout_samples} "
              f"samples per position (the same samples for each)...", flush=True)
        total = len(methods) * len(paired.task_positions(condition.task)) * args.heldout_samples
        with paired.sample_bar(total, disable=args.no_progress or None) as progress:
            scored = paired.score_methods(lm, condition.task, methods, num_samples=args.heldout_samples,
                                          metadata=condition.metadata, chat_template=apply_chat_template(condition.chat_template),
                                          cache=cache(folder, condition, args), progress=progress,
                                          batch_size=batch_size)
        if args.layer_type:
            scored["layer_type"] = args.layer_type  # the table's notes say which layers PI moved
        if getattr(args, "position_layer_type", None):
            scored["position_layer_type"] = args.position_layer_type
        table = paired_table(scored)
        files[condition.name] = write_comparison(table, scored, folder)
        print(format_plain(table))
        averages[condition.name] = {k: r["average"] for k, r in table["rows"].items()}
    if several:
        summary = write_summary(output / "heldout", conditions, files)
        print(summary)
    print(f"held-out tables: {', '.join(str(f['md']) for f in files.values())} ({time.perf_counter() - started:.0f} s)")
    if not several:
        return {"table_file": str(files[conditions[0].name]["json"].name), "average": averages[conditions[0].name]}
    return {"tables": {name: str(f["json"]) for name, f in files.items()}, "average": averages}


def write_summary(folder: Path, conditions: Sequence[Condition], files: Mapping[str, Mapping]) -> str:
    """One table over the conditions: every row against vanilla, pooled over the positions."""
    import json

    from lpes_harness.evaluation.transfer import format_rows, plot_rows, rows
    from lpes_harness.core.files import atomic_write_json, atomic_write_text

    table = []
    for condition in conditions:
        table += rows(condition.name, json.loads(Path(files[condition.name]["json"]).read_text(encoding="utf-8")))
    text = format_rows(table)
    atomic_write_text(folder / f"{SUMMARY}.md", text + "\n")
    atomic_write_json(folder / f"{SUMMARY}.json", table, indent=1)
    plot_rows(table, folder / f"{SUMMARY}.png", title="Held-out samples of the searched conditions")
    return text
