"""Rows of several held-out tables pooled into one paired test: "does the curve help over all conditions?".

The command, with what it writes: :mod:`lpes_harness.commands.pooled`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.evaluation.stats import compare_paired, format_p


def load_table(path: str | Path) -> dict:
    """One condition's ``heldout.json`` (``path`` may be its folder); returns its ``scored`` part."""
    path = Path(path)
    path = path / "heldout.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"{path}: no heldout.json there (write one with commands.paired or commands.transfer)")
    scored = json.loads(path.read_text(encoding="utf-8")).get("scored")
    if not isinstance(scored, Mapping) or not isinstance(scored.get("scores"), Mapping):
        raise ValueError(f"{path}: not a held-out table (no per-sample 'scored.scores')")
    return {"path": str(path), **scored}


def _samples_identity(table: Mapping) -> str:
    return json.dumps({key: table.get(key) for key in ("task", "split", "metadata", "chat_template")}, sort_keys=True)


def pooled_scores(tables: Sequence[Mapping], row: str) -> list[float]:
    """One row's per-sample scores, table after table and position after position (a fixed order,
    so two rows' lists pair sample by sample)."""
    out = []
    for table in tables:
        scores = table["scores"].get(row)
        if scores is None:
            raise ValueError(f"{table['path']} has no row {row!r}; its rows: {sorted(table['scores'])}")
        for percent in sorted(scores, key=int):
            out.extend(scores[percent])
    return out


def check_paired(tables: Sequence[Mapping], rows: Sequence[str]) -> None:
    """Refuse tables of the same samples, and rows whose sample counts differ within a table."""
    seen = {}
    for table in tables:
        identity = _samples_identity(table)
        if identity in seen:
            raise ValueError(f"{table['path']} and {seen[identity]} hold the same samples "
                             f"({identity}); pooling them would count each sample twice")
        seen[identity] = table["path"]
        counts = {row: {p: len(v) for p, v in table["scores"][row].items()} for row in rows if row in table["scores"]}
        if len({json.dumps(c, sort_keys=True) for c in counts.values()}) > 1:
            raise ValueError(f"{table['path']}: rows hold different samples per position ({counts}); not paired")


def pool(tables: Sequence[Mapping], rows: Sequence[str], against: Sequence[str]) -> list[dict]:
    """Every row against every reference row, over all tables: one :func:`compare_paired` each."""
    check_paired(tables, list(rows) + list(against))
    results = []
    for reference in against:
        base = pooled_scores(tables, reference)
        for row in rows:
            if row != reference:
                results.append({"row": row, "against": reference, **compare_paired(pooled_scores(tables, row), base)})
    return results


def shared_rows(tables: Sequence[Mapping]) -> list[str]:
    """The rows every table holds, in the first table's order."""
    return [row for row in tables[0]["scores"] if all(row in table["scores"] for table in tables[1:])]


def as_json(results: Sequence[Mapping], tables: Sequence[Mapping]) -> dict:
    """What ``pooled.json`` holds: the tables pooled and every comparison."""
    return {"tables": [table["path"] for table in tables], "results": list(results)}


def format_results(results: Sequence[Mapping], tables: Sequence[Mapping]) -> str:
    conditions = ", ".join(Path(table["path"]).parent.name for table in tables)
    n = results[0]["n"] if results else 0
    lines = [f"Pooled over {len(tables)} tables ({conditions}), {n} paired samples a row.", "",
             "| row | against | accuracy | against's | difference [95 %] | gained / lost | p |", "|---|---|---|---|---|---|---|"]
    for r in results:
        low, high = r["difference_interval"]
        lines.append(f"| {r['row']} | {r['against']} | {r['accuracy']:.3f} | {r['baseline_accuracy']:.3f} | "
                     f"{100 * r['difference']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] | "
                     f"{r['gained']} / {r['lost']} | {format_p(r['p'])} |")
    return "\n".join(lines)
