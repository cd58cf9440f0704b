"""The run folder's record: ``config.json`` (the run's settings and fingerprint, what ``--resume``
restores and compares), the refusals of a resume that would mix two experiments, the lock that
keeps a second lpes-search off a folder in use, and a fresh start's clean-up. Every refusal is one
line on stderr with exit status 2, before anything is written. Also the names of the run folder's files
that ``--status`` reads, and what a run's scored records cost in forwards (:func:`forwards_of`)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from lpes_harness.core.files import atomic_write_json, read_json_or_none
from lpes_harness.search.fingerprint import mismatches

STAMP = "%Y-%m-%dT%H:%M:%S"  # config.json's times: local, to the second
RUN_RECORD = "config.json"  # in the run folder: its "settings" are what --resume restores
UNIFORM_FILE = "uniform.json"  # the uniform stage's best factor
UNIFORM_JOURNAL = "uniform_tuning.jsonl"  # every uniform factor it scored, as it went
SELECTION_FILE = "selection.json"  # the validation stage's rounds and choice


def run_folder(args) -> Path:
    """The folder a run writes to (``--output``, else ``results/<run name>``), from lpes-search's parsed flags."""
    return Path(args.output or Path("results") / (args.run_name or f"{args.task}_{args.curve}_seed{args.seed}"))


def read_run_record(folder: Path) -> dict | None:
    """The run's ``config.json``, or None when there is none; ValueError when it is not JSON."""
    path = Path(folder) / RUN_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not a run record (a JSON object)")
    return record


def fail(message: str):
    """One line on stderr, exit status 2 (as the command line's own errors)."""
    print(f"lpes-search: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def check_resume(output: Path, record: dict | None, checkpoint: dict | None, current: dict) -> None:
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
        fail(prefix + "; ".join(problems) + " (this run folder was made before runs recorded their settings for "
              "--resume: give its flags again" + (f", as in its command: {command})" if command else ")"))
    for line in problems[:-1]:  # one line per difference: one changed flag is one line
        print(f"lpes-search: error: {prefix}{line}", file=sys.stderr)
    fail(prefix + problems[-1])


@contextlib.contextmanager
def holding_run_folder(folder: Path):
    """Hold ``folder`` for this run, or refuse in one line when another lpes-search holds it: a
    ``--resume`` typed while the run goes on would score every stage twice and append each journal
    line twice. The lock is the kernel's (``flock`` on the folder itself), so no file is written and
    none is left stale: a killed run's lock goes with its process. Released when the block ends. No
    lock where there is no ``flock`` (not POSIX)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        fail(f"{folder} is in use: another lpes-search is running on it; let it finish or stop it first "
             f"(lpes-search --status --output {folder} says where it stands)")
    try:
        yield
    finally:
        os.close(descriptor)


def folder_in_use(folder: Path) -> bool:
    """Whether an lpes-search holds ``folder`` now (:func:`holding_run_folder`); takes nothing."""
    try:
        import fcntl
        descriptor = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(descriptor)  # and with it the shared lock, if it was taken
    return False


# What a fresh start (a new run, or --overwrite) removes first: the state a resume would read (the
# uniform tuning's journal too: its points would be taken as this run's), and the old run's results,
# history and plots, which would otherwise sit beside the new run's until its own replace them (a kill
# in between leaves the two mixed). Score caches stay (scores.cache.json, those of each condition's
# held-out table and of validation/): their scores are keyed by scales and checked against the task
# and model, so they are valid for any run that asks for the same scales.
RUN_STATE = ("checkpoint.json", "checkpoint.jsonl", "sweep.json", "sweep.jsonl", "result.json", UNIFORM_JOURNAL,
             "gradient_state.json", "gradient.jsonl",  # --search-method gradient's
             "racing.json", "racing.jsonl")  # --search-method racing's
RUN_RESULTS = ("scales.json", UNIFORM_FILE, SELECTION_FILE, "heldout.json", "heldout.md", "heldout.png",
               "history.jsonl", "generations.jsonl", "curve.png", "fitness.png", "conditions.png", "sweep.png",
               "uniform.png", "gradient.png", "racing.png")
# A run over several conditions: heldout/summary.* and heldout/<condition>/heldout.*.
CONDITION_RESULTS = ("heldout/summary.*", "heldout/*/heldout.*")


def clear_run_state(output: Path) -> None:
    for name in RUN_STATE + RUN_RESULTS:
        (output / name).unlink(missing_ok=True)
    for pattern in CONDITION_RESULTS:
        for path in output.glob(pattern):
            path.unlink(missing_ok=True)


def idle_since_last_write(folder: Path, launched: float) -> float | None:
    """Seconds from the run folder's last write to ``launched`` (epoch seconds), None for an empty folder.

    Read by a resume before it writes. A process that ended (finished, failed or stopped by Ctrl-C)
    stamped its end in config.json (:func:`stamp_process_end`): that stamp, as a fresh clone of the
    folder gives every file the checkout's time. A killed one leaves no stamp, but its last journal
    line, checkpoint or plot says when it last did work."""
    last = _last_process(read_json_or_none(folder / RUN_RECORD) or {})
    if last.get("ended"):
        return max(0.0, launched - _epoch(last["ended"]))
    times = [p.stat().st_mtime for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    return max(0.0, launched - max(times)) if times else None


def stamp_process_end(path: Path) -> None:
    """Write this process's end time (``ended``) into its entry of config.json (the first process's is the
    record itself, a resume's its entry in ``resumes``): the next resume's gap starts there."""
    record = read_json_or_none(path)
    if record is None:
        return
    _last_process(record)["ended"] = time.strftime(STAMP)
    atomic_write_json(path, record)


def _last_process(record: dict) -> dict:
    return (record.get("resumes") or [record])[-1]


def write_config(path: Path, resume: bool, record: dict, launched: float | None = None,
                 idle_before: float | None = None) -> None:
    """config.json is the first run's record; a resume appends to its ``resumes`` list, never replaces it.

    Only ``settings`` and ``fingerprint``, what the next ``--resume`` restores and compares, become
    this run's (they differ only where a resume may differ: a grown ``--generations``, ``--threads``,
    ...; the resume's entry lists them under ``changed``). ``started`` is when the first process was
    launched (``launched``, epoch seconds; now if not given), and a resume's entry keeps
    ``idle_before_seconds``: from the folder's last write before it to its launch. :func:`run_seconds`
    leaves those gaps out of the run's time."""
    now = time.strftime(STAMP)
    if resume and path.exists():
        first = json.loads(path.read_text())
        entry = {"command": record["command"], "at": now}
        if idle_before is not None:
            entry["idle_before_seconds"] = round(idle_before, 1)
        previous = first.get("settings") or {}
        changed = {name: {"saved": previous[name], "now": value} for name, value in record["settings"].items()
                   if name in previous and previous[name] != value}
        if changed:
            entry["changed"] = changed
        machine = (record.get("model") or {}).get("machine")
        if machine and machine != (first.get("model") or {}).get("machine"):
            entry["machine"] = machine  # the run's timings now span two machines
        first.setdefault("resumes", []).append(entry)
        first["settings"], first["fingerprint"] = record["settings"], record["fingerprint"]
        atomic_write_json(path, first)
    else:
        started = time.strftime(STAMP, time.localtime(launched)) if launched is not None else now
        atomic_write_json(path, {**record, "started": started})


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, STAMP))


def run_seconds(record: dict, now: float | None = None) -> float | None:
    """The run's wall time over all its processes, from config.json's ``started`` to ``now``, less the
    gaps between one process's last write and the next resume: what the run took had it not stopped.
    None where a resume predates ``idle_before_seconds`` (its gap is unknown)."""
    resumes = record.get("resumes") or []
    if "started" not in record or any("idle_before_seconds" not in entry for entry in resumes):
        return None
    now = time.time() if now is None else now
    return round(now - _epoch(record["started"]) - sum(entry["idle_before_seconds"] for entry in resumes), 1)


def stopped_run_seconds(record: dict) -> float | None:
    """A stopped run's time, as :func:`run_seconds` counts it, up to the end its last process stamped
    (:func:`stamp_process_end`); None where that process left no stamp (it was killed)."""
    ended = _last_process(record).get("ended")
    return run_seconds(record, _epoch(ended)) if ended else None


def record_genome(path: Path, spec) -> None:
    """config.json's ``genome`` once the sweep has chosen the start (``initial_y``)."""
    record = json.loads(path.read_text())
    if record.get("genome") != spec.to_dict():
        atomic_write_json(path, {**record, "genome": spec.to_dict()})


def settings_record(args) -> dict:
    """The run's settings under their flag names, as ``config.json``'s ``"settings"`` keeps them for
    ``--resume``: each of ``args.setting_names`` (the command's flags, set where they were parsed) with
    the value this run has, after profile, config file, command line and ``--time-budget``'s sizing."""
    return json.loads(json.dumps({name: getattr(args, name) for name in args.setting_names if hasattr(args, name)},
                                 default=str))


def forwards_of(records: Sequence[dict]) -> int:
    """The forwards a list of scored records (history lines, sweep points) cost: cache hits none."""
    total = 0
    for record in records:
        if record.get("cached"):
            continue
        samples = (record.get("info") or {}).get("samples", 0)
        total += sum(samples.values()) if isinstance(samples, dict) else int(samples)
    return total


def add_run_seconds(result: dict, record_path: Path, key: str) -> None:
    """A resumed run's ``total_seconds`` is its last process's: ``run_seconds`` spans every process (the
    gaps between them left out), where config.json can tell it."""
    seconds = run_seconds(json.loads(record_path.read_text()))
    if seconds is not None:
        result[key] = seconds
