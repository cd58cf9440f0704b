"""A resume's gap (the time between two processes, left out of the run's time) comes from the stopped
process's own end stamp where it wrote one: a fresh clone gives every file the checkout's time, so the
files' times would make the gap vanish and the run look an hour longer (seed 3 of the robust SmolLM2
search, resumed from a clone, counted its 1 h gap as 6 min)."""

import json
import os
import time

from lpes_harness.search.run_record import STAMP, idle_since_last_write, stamp_process_end


def _folder(tmp_path, record: dict):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(record))
    (folder / "history.jsonl").write_text("{}\n")
    return folder


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, STAMP))


def _clock_at(monkeypatch, now: float) -> None:
    """A fake clock for the stamps: ``time.strftime`` without a time formats ``now`` (with one, as before)."""
    real = time.strftime
    monkeypatch.setattr(time, "strftime", lambda form, when=None: real(form, time.localtime(now) if when is None else when))


def test_the_gap_starts_at_the_stopped_process_end_stamp_not_at_the_files_checkout_time(tmp_path, monkeypatch):
    folder = _folder(tmp_path, {"started": "2026-12-01T01:00:00"})
    launched = _epoch("2026-12-01T02:00:00")
    for path in folder.iterdir():  # a clone: every file written just now
        os.utime(path, (launched - 5, launched - 5))
    assert abs(idle_since_last_write(folder, launched) - 5) < 1e-6  # no stamp: the files' times are all there is
    _clock_at(monkeypatch, launched + 60)  # the process ends a minute after its launch
    stamp_process_end(folder / "config.json")
    record = json.loads((folder / "config.json").read_text())
    ended = _epoch(record["ended"])
    assert record["ended"] == "2026-12-01T02:01:00" and ended == launched + 60  # the end stamp is the clock's now
    assert abs(idle_since_last_write(folder, ended + 3600) - 3600) < 1e-6  # an hour later, however new the files


def test_a_resumed_process_stamps_its_own_entry_and_its_gap_is_read_from_it(tmp_path, monkeypatch):
    first_end = "2026-12-01T03:42:00"
    record = {"started": "2026-12-01T01:39:50", "ended": first_end,
              "resumes": [{"at": "2026-12-01T04:47:27", "idle_before_seconds": 3867.0}]}
    folder = _folder(tmp_path, record)
    launched = _epoch("2026-12-01T08:08:32")
    for path in folder.iterdir():
        os.utime(path, (launched - 10, launched - 10))
    # The last process (the resume of 04:47) left no stamp (killed): its files' times are the gap's start.
    assert abs(idle_since_last_write(folder, launched) - 10) < 1e-6
    _clock_at(monkeypatch, launched + 600)
    stamp_process_end(folder / "config.json")
    saved = json.loads((folder / "config.json").read_text())
    assert saved["ended"] == first_end  # the first process's stamp untouched
    assert saved["resumes"][-1]["ended"] == "2026-12-01T08:18:32"  # this process's: the clock's now


def test_no_record_no_stamp(tmp_path):
    stamp_process_end(tmp_path / "config.json")  # nothing to stamp: nothing written
    assert not (tmp_path / "config.json").exists()
    assert idle_since_last_write(tmp_path / "missing", time.time()) is None
