"""A search's history for the report: ``history.jsonl`` (every individual) and ``generations.jsonl``.

Per generation: best and mean fitness, and the smoothness of the best and of the population
(:func:`lpes_harness.core.curves.smoothness`), as ``lpes-report`` tabulates and plots them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lpes_harness.core.files import read_jsonl


class ReportError(ValueError):
    """Bad input to the report: the message names the argument and what is accepted."""


def read_history(path: str | os.PathLike) -> list[dict]:
    """The search's history lines; unknown keys are kept, blank or cut-off last lines skipped."""
    try:
        lines = read_jsonl(path, missing_ok=False, strict=True, numbered=True)
    except FileNotFoundError:
        raise ReportError(f"{path}: no such history file (a search writes history.jsonl in its --output)") from None
    except ValueError as err:
        raise ReportError(str(err)) from None
    records = []
    for number, record in lines:
        if "generation" not in record or "fitness" not in record:
            raise ReportError(f"{path}:{number}: a history line needs 'generation' and 'fitness', got {sorted(record)}")
        records.append(record)
    if not records:
        raise ReportError(f"{path}: no history lines")
    return records


def smoothness(scales: Sequence[float]) -> float:
    from lpes_harness.core.curves import smoothness as curve_smoothness

    return curve_smoothness(scales)


def history_by_generation(records: Iterable[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Per generation: best and mean fitness, smoothness of the best and mean smoothness."""
    generations: dict[int, list[Mapping[str, Any]]] = {}
    for record in records:
        generations.setdefault(int(record["generation"]), []).append(record)
    rows = []
    for generation in sorted(generations):
        members = generations[generation]
        best = max(members, key=lambda r: float(r["fitness"]))
        smooth = [smoothness(r["scales"]) for r in members if len(r.get("scales") or []) >= 3]
        rows.append(
            {
                "generation": generation,
                "best_fitness": float(best["fitness"]),
                "mean_fitness": sum(float(r["fitness"]) for r in members) / len(members),
                "best_smoothness": smoothness(best["scales"]) if len(best.get("scales") or []) >= 3 else math.nan,
                "mean_smoothness": sum(smooth) / len(smooth) if smooth else math.nan,
            }
        )
    return rows


def population_stats(path: Path) -> list[dict[str, float]] | None:
    """The search's own per-generation statistics over each whole population, when present.

    ``history.jsonl`` holds only the individuals evaluated in a generation (the parents
    carried over are not repeated), so the population's best and mean come from
    ``generations.jsonl``, which the search writes beside it.
    """
    if not path.is_file():
        return None
    rows = []
    for stats in read_jsonl(path):  # a line cut off by a stopped run is skipped
        if not {"generation", "best_fitness", "mean_fitness"} <= set(stats):
            return None
        best_scales = stats.get("best_scales") or []
        rows.append({
            "generation": int(stats["generation"]),
            "best_fitness": float(stats["best_fitness"]),
            "mean_fitness": float(stats["mean_fitness"]),
            "best_smoothness": float(stats.get("best_smoothness", smoothness(best_scales) if len(best_scales) >= 3 else math.nan)),
            "mean_smoothness": float(stats.get("mean_smoothness", math.nan)),
        })
    return rows or None


def best_individual(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    return max(records, key=lambda r: float(r["fitness"]))
