"""Reading task data: JSON-lines files (plain or gzip) and the shared data folder.

Data never ships with the package. A task names its file through the ``data_path``
metadata key; when it does not, the file is looked up in the shared data folder:
``$LPES_DATA`` if set, else ``../shared/data`` next to an editable checkout.
"""

import functools
import gzip
import json
import os
from collections.abc import Sequence
from pathlib import Path

DATA_ENV_VAR = "LPES_DATA"

# repo root of an editable checkout: lpes_harness/tasks/data.py -> parents[2]
_CHECKOUT_ROOT = Path(__file__).resolve().parents[2]


class TaskDataError(ValueError):
    """Bad task input: a missing file, a malformed line, an unknown or invalid option."""


def default_data_roots() -> list[Path]:
    roots = []
    if os.environ.get(DATA_ENV_VAR):
        roots.append(Path(os.environ[DATA_ENV_VAR]).expanduser())
    roots.append(_CHECKOUT_ROOT.parent / "shared" / "data")
    return roots


def find_shared_file(relative: str) -> Path:
    """``relative`` inside the first shared data folder that has it; a clear error if none does."""
    roots = default_data_roots()
    for root in roots:
        if (root / relative).is_file():
            return root / relative
    tried = ", ".join(str(root / relative) for root in roots)
    raise TaskDataError(
        f"could not find the default data file {relative!r} (tried: {tried}). "
        f"Set the environment variable {DATA_ENV_VAR} to the shared data folder, "
        f"or name the file with --metadata '{{\"data_path\": \"/path/to/file.jsonl.gz\"}}'."
    )


def read_jsonl(path: str | os.PathLike, required_keys: Sequence[str] = ()) -> list[dict]:
    """All records of a JSON-lines file (``.gz`` or plain), checked line by line.

    Errors name ``file:line`` so a user can open the offending line directly.
    Results are cached per (resolved path, mtime): every position subtask reads the same file.
    """
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise TaskDataError(f"data_path {str(path)!r} does not exist or is not a file (cwd: {os.getcwd()})")
    resolved = resolved.resolve()
    return list(_read_jsonl_cached(str(resolved), resolved.stat().st_mtime_ns, tuple(required_keys)))


@functools.lru_cache(maxsize=8)
def _read_jsonl_cached(path: str, _mtime_ns: int, required_keys: tuple[str, ...]) -> tuple[dict, ...]:
    with open(path, "rb") as raw:
        is_gzip = raw.read(2) == b"\x1f\x8b"  # by content, not by suffix
    opener = gzip.open if is_gzip else open
    records = []
    with opener(path, "rt", encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise TaskDataError(f"{path}:{line_number}: malformed JSON line ({err.msg}, column {err.colno})") from None
            if not isinstance(record, dict):
                raise TaskDataError(f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}")
            missing = [key for key in required_keys if key not in record]
            if missing:
                raise TaskDataError(
                    f"{path}:{line_number}: missing key(s) {missing}; this task expects {list(required_keys)}"
                )
            records.append(record)
    if not records:
        raise TaskDataError(f"{path}: the file holds no records")
    return tuple(records)
