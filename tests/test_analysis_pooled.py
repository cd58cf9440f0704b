"""commands.pooled: rows of several held-out tables pooled into one paired test, sample by sample."""

from __future__ import annotations

import json

import pytest

from lpes_harness.evaluation import pooled
from lpes_harness.evaluation.stats import compare_paired
from lpes_harness.commands import pooled as pooled_command


def _write_table(folder, metadata, scores):
    folder.mkdir(parents=True)
    scored = {"task": "multi_needle", "split": "heldout", "metadata": metadata, "chat_template": "auto",
              "num_samples": 4, "scores": scores}
    (folder / "heldout.json").write_text(json.dumps({"table": {}, "scored": scored}))
    return folder


@pytest.fixture
def two_tables(tmp_path):
    a = _write_table(tmp_path / "60", {"num_sentences": 60},
                     {"vanilla": {"0": [1, 0, 0, 1], "50": [0, 0, 1, 0]},
                      "curve": {"0": [1, 1, 0, 1], "50": [1, 1, 1, 0]}})
    b = _write_table(tmp_path / "120", {"num_sentences": 120},
                     {"vanilla": {"0": [1, 1, 1, 1], "50": [1, 0, 1, 1]},
                      "curve": {"0": [0, 1, 1, 1], "50": [1, 0, 0, 1]}})
    return a, b


def test_pooled_equals_one_paired_test_over_the_concatenated_samples(two_tables):
    tables = [pooled.load_table(folder) for folder in two_tables]
    (result,) = pooled.pool(tables, ["curve"], ["vanilla"])
    # Table after table, position after position: the same order for both rows.
    expected = compare_paired([1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1],
                              [1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1])
    assert {k: result[k] for k in expected} == expected
    assert (result["gained"], result["lost"]) == (3, 2)


def test_positions_pair_by_percent_not_by_file_order(tmp_path):
    a = _write_table(tmp_path / "a", {"seed": 1}, {"vanilla": {"0": [1, 1], "100": [0, 0]},
                                                    "curve": {"100": [1, 1], "0": [1, 1]}})
    (result,) = pooled.pool([pooled.load_table(a)], ["curve"], ["vanilla"])
    assert (result["gained"], result["lost"]) == (2, 0)


def test_refuses_tables_of_the_same_samples(two_tables, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "heldout.json").write_text((two_tables[0] / "heldout.json").read_text())
    with pytest.raises(ValueError, match="same samples"):
        pooled.pool([pooled.load_table(two_tables[0]), pooled.load_table(copy)], ["curve"], ["vanilla"])


def test_refuses_a_row_one_table_lacks(two_tables, tmp_path):
    c = _write_table(tmp_path / "16", {"num_needles": 16}, {"vanilla": {"0": [1, 0, 0, 1]}})
    tables = [pooled.load_table(folder) for folder in (*two_tables, c)]
    assert pooled.shared_rows(tables) == ["vanilla"]
    with pytest.raises(ValueError, match="no row 'curve'"):
        pooled.pool(tables, ["curve"], ["vanilla"])


def test_refuses_rows_of_unequal_samples(tmp_path):
    a = _write_table(tmp_path / "a", {}, {"vanilla": {"0": [1, 0]}, "curve": {"0": [1, 0, 1]}})
    with pytest.raises(ValueError, match="not paired"):
        pooled.pool([pooled.load_table(a)], ["curve"], ["vanilla"])


def test_cli_prints_the_table_and_writes_json(two_tables, tmp_path, capsys):
    out = tmp_path / "pooled.json"
    pooled_command.main([str(two_tables[0]), str(two_tables[1] / "heldout.json"), "--json", str(out)])
    text = capsys.readouterr().out
    assert "16 paired samples a row" in text and "| curve | vanilla |" in text
    saved = json.loads(out.read_text())
    assert [r["row"] for r in saved["results"]] == ["curve"]


def test_cli_rejects_a_folder_without_a_table(tmp_path, capsys):
    with pytest.raises(SystemExit):
        pooled_command.main([str(tmp_path)])
    assert "no heldout.json" in capsys.readouterr().err
