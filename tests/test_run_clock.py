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


def test_the_gap_starts_at_the_stopped_process_end_stamp_not_at_the_files_checkout_time(tmp_path):
    folder = _folder(tmp_path, {"started": "2026-12-01T01:00:00"})
    launched = time.time()
    for path in folder.iterdir():  # a clone: every file written just now
        os.utime(path, (launched - 5, launched - 5))
    assert 4 <= idle_since_last_write(folder, launched) <= 6  # no stamp: the files' times are all there is
    stamp_process_end(folder / "config.json")
    record = json.loads((folder / "config.json").read_text())
    ended = time.mktime(time.strptime(record["ended"], STAMP))
    assert abs(ended - time.time()) <= 2
    assert abs(idle_since_last_write(folder, ended + 3600) - 3600) < 1e-6  # an hour later, however new the files


def test_a_resumed_process_stamps_its_own_entry_and_its_gap_is_read_from_it(tmp_path):
    first_end = "2026-12-01T03:42:00"
    record = {"started": "2026-12-01T01:39:50", "ended": first_end,
              "resumes": [{"at": "2026-12-01T04:47:27", "idle_before_seconds": 3867.0}]}
    folder = _folder(tmp_path, record)
    launched = time.mktime(time.strptime("2026-12-01T08:08:32", STAMP))
    for path in folder.iterdir():
        os.utime(path, (launched - 10, launched - 10))
    # The last process (the resume of 04:47) left no stamp (killed): its files' times are the gap's start.
    assert abs(idle_since_last_write(folder, launched) - 10) < 1e-6
    stamp_process_end(folder / "config.json")
    saved = json.loads((folder / "config.json").read_text())
    assert saved["ended"] == first_end and "ended" in saved["resumes"][-1]  # the first process's stamp untouched


def test_no_record_no_stamp(tmp_path):
    stamp_process_end(tmp_path / "config.json")  # nothing to stamp: nothing written
    assert not (tmp_path / "config.json").exists()
    assert idle_since_last_write(tmp_path / "missing", time.time()) is None
