"""Tiny data folders laid out like the shared data folder, written in a test's tmp_path."""

import csv
import json
from pathlib import Path

MMLU_MAPPING = {
    "astronomy": {"name": "astronomy", "category": "STEM"},
    "world_religions": {"name": "world religions", "category": "Humanities"},
}
CEVAL_MAPPING = {"logic": {"name": "逻辑学", "category": "Humanities"}}


def _write_csv(path: Path, rows, header=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        if header:
            writer.writerow(header)
        writer.writerows(rows)


def mc_rows(subject: str, count: int, start: int = 0):
    # The answer letter cycles A, B, C, D so tests can tell rows apart by it.
    return [[f"{subject} question {i}?", f"a{i}", f"b{i}", f"c{i}", f"d{i}", "ABCD"[i % 4]] for i in range(start, start + count)]


def write_mmlu(root: Path, test_rows: int = 3) -> Path:
    folder = root / "mmlu"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mapping.json").write_text(json.dumps(MMLU_MAPPING), encoding="utf-8")
    for subject in MMLU_MAPPING:
        _write_csv(folder / "test" / f"{subject}_test.csv", mc_rows(subject, test_rows, start=100))
        _write_csv(folder / "dev" / f"{subject}_dev.csv", mc_rows(subject, 5))
    return folder


def write_ceval(root: Path) -> Path:
    folder = root / "ceval"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mapping.json").write_text(json.dumps(CEVAL_MAPPING, ensure_ascii=False), encoding="utf-8")
    header = ["id", "question", "A", "B", "C", "D", "answer"]
    val = [[i, *row] for i, row in enumerate(mc_rows("逻辑", 2, start=10))]
    dev = [[i, *row, "解析"] for i, row in enumerate(mc_rows("逻辑", 5))]
    _write_csv(folder / "val" / "logic_val.csv", val, header)
    _write_csv(folder / "dev" / "logic_dev.csv", dev, header + ["explanation"])
    return folder


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path
