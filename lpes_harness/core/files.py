"""Atomic file writes: a reader (or a resumed run) never sees a half-written file.

Each write goes to a temporary file in the target's folder, is flushed to disk, then
renamed over the target (``os.replace`` is atomic on one file system). A journal line
(:func:`append_jsonl`) is appended in one ``write``: it is there whole or not at all.

:func:`kill_point` is the test hook that kills a process at a chosen point, to show that a
run killed there resumes as if nothing happened (``tests/test_search_kill.py``).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

KILL_ENV = "LPES_TEST_KILL_AT"
_kill_counts: dict[str, int] = {}


def kill_point(name: str) -> None:
    """Test hook: with ``LPES_TEST_KILL_AT=NAME:N`` in the environment, the ``N``-th time this
    process passes point ``NAME`` it kills itself with SIGKILL (no cleanup, no ``finally``), as
    a crash, an out-of-memory kill or ``kill -9`` would. Without the variable (always, outside
    tests) it does nothing.

    Points: ``sweep`` (a sweep point journalled), ``individual`` (an individual journalled in
    ``checkpoint.jsonl``), ``generation`` (the checkpoint written at a generation's end) and
    ``score-cache`` (a block of held-out scores saved in ``scores.cache.json``).
    """
    wanted = os.environ.get(KILL_ENV)
    if not wanted:
        return
    point, _, count = wanted.partition(":")
    if point != name:
        return
    _kill_counts[name] = _kill_counts.get(name, 0) + 1
    if _kill_counts[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def append_jsonl(path: str | os.PathLike, record) -> None:
    """Append ``record`` as one JSON line, in a single ``write``: a kill leaves the line whole or
    absent (and :func:`read_jsonl` skips a torn last line all the same)."""
    data = (json.dumps(record) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make results unreadable to others
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj, indent: int | None = None) -> None:
    separators = None if indent else (",", ":")
    atomic_write_text(path, json.dumps(obj, indent=indent, separators=separators) + "\n")


def save_figure(figure, path: str | os.PathLike, dpi: int = 120) -> None:
    """Save a matplotlib figure as PNG, atomically (the PNG is rendered in memory first)."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    atomic_write_bytes(path, buffer.getvalue())


def read_jsonl(path: str | os.PathLike, *, missing_ok: bool = True, strict: bool = False, numbered: bool = False) -> list:
    """The JSON lines of a file; blank lines skipped.

    A line that is not JSON is skipped (a torn last line, written by a killed process) unless
    ``strict``: then only the last line may be torn, and any other raises ``ValueError``
    naming ``path:line``. ``numbered`` gives ``(line number, record)`` pairs. A missing file
    is no lines when ``missing_ok``, else ``FileNotFoundError``.
    """
    if missing_ok and not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if strict and number != len(lines):
                raise ValueError(f"{path}:{number}: not a JSON line") from None
            continue
        records.append((number, record) if numbered else record)
    return records


def read_json_or_none(path: str | os.PathLike) -> dict | None:
    """A JSON object from ``path``; None where it is missing, not an object, or cut off by a kill mid-write
    (atomic writes make that rare): for readers that report on a folder, never fail on it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
