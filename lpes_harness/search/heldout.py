"""The held-out table at the end of a search: vanilla and the run's rows on the same held-out samples,
paired, one block per condition.

One condition (no ``--condition``): ``heldout.{md,json,png}`` and ``scores.cache.json`` in the run
folder, as always. Several: ``heldout/<condition>/`` each, and ``heldout/summary.{md,json,png}``:
per condition and row, the difference from vanilla with its 95 % interval, gained / lost samples and
the exact McNemar p. Scores are cached as ``analysis.paired`` caches them: a killed table resumes,
and ``python -m lpes_harness.commands.paired --output <that folder>`` reuses them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping, Sequence

from lpes_harness.evaluation.conditions import Condition, slug

SUMMARY = "summary"


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


def evaluate(lm, args, conditions: Sequence[Condition], several: bool, methods: Mapping[str, Sequence[float]],
             output: Path, batch_size=1) -> dict:
    """Score ``methods`` (vanilla first) on ``args.heldout_samples`` per position of every condition,
    ``batch_size`` prompts a forward (the fitness's, as its configuration resolved it)."""
    from lpes_harness.evaluation import paired
    from lpes_harness.evaluation.paired_table import format_plain, paired_table, write_comparison

    started = time.perf_counter()
    chat = {"auto": None, "on": True, "off": False}
    averages, files = {}, {}
    for condition in conditions:
        folder = folders(output, conditions, several)[condition.name]
        folder.mkdir(parents=True, exist_ok=True)
        print(f"held-out{f' ({condition.name})' if several else ''}: {', '.join(methods)} on {args.heldout_samples} "
              f"samples per position (the same samples for each)...", flush=True)
        total = len(methods) * len(paired.task_positions(condition.task)) * args.heldout_samples
        with paired.sample_bar(total, disable=args.no_progress or None) as progress:
            scored = paired.score_methods(lm, condition.task, methods, num_samples=args.heldout_samples,
                                          metadata=condition.metadata, chat_template=chat[condition.chat_template],
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
