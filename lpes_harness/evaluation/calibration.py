"""Which size of a task shows this model's position bias with room to gain? ``lpes-check --grid``.

    lpes-check --task multi_needle --pretrained gemma3-270m --num-samples 12 \\
        --grid '{"num_sentences": [120, 240, 480], "num_needles": [8, 16]}' --out calibration/

Runs the check (``validity.check_task``) at every combination of the grid's task options, with
the model loaded once, and prints one row per setting: prompt length, accuracy by gold
position, gold removed, the verdict, and whether the setting shows a U-curve *with room*:
the worst position at most ``WORST_MAX``, both ends at least ``ENDS_MIN`` and gold removed at
most ``REMOVED_MAX``. Each setting's full result is written to ``--out`` as it finishes, and a
setting whose file is there already (same model, task, options and sample count) is read back
instead of run again: a stopped grid resumes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from pathlib import Path

from lpes_harness.core.files import atomic_write_json, read_json_or_none

WORST_MAX = 0.70  # vanilla's worst position: room for a search to gain
ENDS_MIN = 0.90  # both ends: the model retrieves where it attends well
REMOVED_MAX = 0.10  # gold removed: the answer needs the context


def grid_settings(grid: Mapping[str, list]) -> list[dict]:
    """Every combination of the grid's values, in the order given: ``{"a": [1, 2], "b": [3]}`` -> 2 settings."""
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError("--grid must be a non-empty JSON object of option -> list of values")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"--grid: {key!r} must map to a non-empty list of values, got {values!r}")
    return [dict(zip(grid, combination)) for combination in itertools.product(*grid.values())]


def setting_name(setting: Mapping) -> str:
    return "_".join(f"{key}-{value}" for key, value in setting.items()) or "defaults"


def room(result: Mapping) -> tuple[bool, str]:
    """Does this setting show a U-curve with room to gain? And if not, why not."""
    cells = list(result["by_position"].values())
    worst, ends = min(c["accuracy"] for c in cells), (cells[0]["accuracy"], cells[-1]["accuracy"])
    why = []
    if worst > WORST_MAX:
        why.append(f"worst {worst:.2f} > {WORST_MAX:.2f}")
    if min(ends) < ENDS_MIN:
        why.append(f"an end {min(ends):.2f} < {ENDS_MIN:.2f}")
    if result["gold_removed"]["accuracy"] > REMOVED_MAX:
        why.append(f"gold removed {result['gold_removed']['accuracy']:.2f} > {REMOVED_MAX:.2f}")
    return not why, "; ".join(why)


def calibrate(check: Callable[[dict], dict], settings: list[dict], *, base_metadata: Mapping, out: Path | None,
              identity: Mapping) -> list[dict]:
    """``check(metadata) -> result`` at each setting; results kept in ``out`` and reused from there."""
    results = []
    for setting in settings:
        metadata = {**base_metadata, **setting}
        path = out / f"{setting_name(setting)}.json" if out else None
        saved = read_json_or_none(path) if path else None
        if saved is not None and saved.get("calibration_identity") == {**identity, "metadata": metadata}:
            results.append(saved)
            continue
        result = check(metadata)
        result["calibration_identity"] = {**identity, "metadata": metadata}
        if path:
            atomic_write_json(path, result, indent=1)
        results.append(result)
    return results


def format_table(results: list[dict], settings: list[dict]) -> str:
    positions = list(results[0]["by_position"])
    lines = ["| " + " | ".join(list(settings[0]) + ["prompt tokens"] + [f"{p} %" for p in positions]
                               + ["gold removed", "U-curve with room", "verdict"]) + " |",
             "|" + "---:|" * (len(settings[0]) + 1 + len(positions) + 1) + "---|---|"]
    for setting, result in zip(settings, results):
        ok, why = room(result)
        verdict = "measures retrieval" if result["verdict"].startswith("measures") else "does NOT measure retrieval"
        cells = [str(v) for v in setting.values()] + [str(result.get("prompt_tokens", "?"))]
        cells += [f"{result['by_position'][p]['accuracy']:.2f}" for p in positions]
        cells += [f"{result['gold_removed']['accuracy']:.2f}", "yes" if ok else f"no: {why}", verdict]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
