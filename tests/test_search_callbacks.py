"""Callbacks: atomic checkpoint, history.jsonl, progress bars, curve.png and fitness.png."""

import io
import json
import math
import os

import pytest

from lpes_harness.search import GeneticSearch, GenomeSpec, SearchConfig
from lpes_harness.core.files import atomic_write_json, atomic_write_text, read_jsonl
from lpes_harness.search.callbacks import CheckpointCallback, HistoryCallback, PlotCallback, ProgressCallback, load_checkpoint

CONFIG = SearchConfig(population=6, parents=2, mutants=3, crossovers=1, generations=2, seed=0)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fitness(scales):
    error = sum((s - 1.4 - 0.2 * math.cos(i)) ** 2 for i, s in enumerate(scales))
    return -error, {"begin": 0.5, "middle": 0.25, "end": 0.75}


def test_history_has_every_individual_with_genome_scales_fitness_info_and_time(tmp_path):
    spec = GenomeSpec(num_layers=10, num_points=3)
    history = HistoryCallback(tmp_path / "history.jsonl", tmp_path / "generations.jsonl")
    result = GeneticSearch(spec, fitness, CONFIG, [history]).run()
    records = read_jsonl(tmp_path / "history.jsonl")
    assert [r["index"] for r in records] == list(range(result["processed"]))
    for record in records:
        assert spec.scales(record["genome"]) == record["scales"]
        assert record["info"] == {"begin": 0.5, "middle": 0.25, "end": 0.75}
        assert record["seconds"] >= 0 and isinstance(record["fitness"], float)
    generations = read_jsonl(tmp_path / "generations.jsonl")
    assert [g["generation"] for g in generations] == [0, 1, 2]
    assert generations[-1]["best_fitness"] == result["best"]["fitness"]


def test_a_new_run_starts_a_fresh_history(tmp_path):
    spec = GenomeSpec(num_layers=10, num_points=3)
    (tmp_path / "history.jsonl").write_text('{"index": 0, "stale": true}\n')
    GeneticSearch(spec, fitness, CONFIG, [HistoryCallback(tmp_path / "history.jsonl")]).run()
    assert not any("stale" in r for r in read_jsonl(tmp_path / "history.jsonl"))


def test_resume_cuts_history_back_to_the_checkpoint(tmp_path):
    spec = GenomeSpec(num_layers=10, num_points=3)
    checkpoint = tmp_path / "checkpoint.json"

    class StopAfter(CheckpointCallback):
        def on_individual(self, search, record):
            if record["index"] < 9:
                super().on_individual(search, record)  # later individuals miss their checkpoint
            if record["index"] == 11:
                raise KeyboardInterrupt

    callbacks = [HistoryCallback(tmp_path / "history.jsonl"), StopAfter(checkpoint)]
    with pytest.raises(KeyboardInterrupt):
        GeneticSearch(spec, fitness, CONFIG, callbacks).run()
    assert len(read_jsonl(tmp_path / "history.jsonl")) == 12
    with open(tmp_path / "history.jsonl", "a") as handle:
        handle.write('{"index": 12, "torn')  # a torn last line

    resumed = GeneticSearch(spec, fitness, CONFIG, [HistoryCallback(tmp_path / "history.jsonl")])
    resumed.load_state_dict(load_checkpoint(checkpoint))
    result = resumed.run()
    assert [r["index"] for r in read_jsonl(tmp_path / "history.jsonl")] == list(range(result["processed"]))


def test_checkpoint_is_written_after_every_individual_and_loads_back(tmp_path):
    spec = GenomeSpec(num_layers=10, num_points=3)
    path = tmp_path / "run" / "checkpoint.json"
    seen = []

    class Spy(CheckpointCallback):
        def on_individual(self, search, record):
            super().on_individual(search, record)
            seen.append(load_checkpoint(self.path)["processed_total"])

    GeneticSearch(spec, fitness, CONFIG, [Spy(path)]).run()
    assert seen == list(range(1, len(seen) + 1))
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.json"]  # no temporary files left
    assert load_checkpoint(path)["completed_generation"] == CONFIG.generations


def test_the_checkpoint_costs_one_journal_line_per_individual_and_a_whole_state_per_generation(tmp_path, monkeypatch):
    from lpes_harness.search import callbacks

    spec = GenomeSpec(num_layers=10, num_points=3)
    path = tmp_path / "checkpoint.json"
    whole, journal = [], []

    class Spy(CheckpointCallback):
        def on_individual(self, search, record):
            super().on_individual(search, record)
            journal.append(len(read_jsonl(self.journal)))

    monkeypatch.setattr(callbacks, "atomic_write_json", lambda target, data: whole.append(data["processed_total"]))
    GeneticSearch(spec, fitness, CONFIG, [Spy(path)]).run()
    assert len(whole) == 1 + CONFIG.generations + 1  # the start, then each generation's end (0 included)
    # The journal grows by one line per individual and starts afresh after each whole state.
    assert all(b == a + 1 or b == 1 for a, b in zip(journal, journal[1:])) and journal[0] == 1


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "state.json"
    atomic_write_json(path, {"ok": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"not json": object()})
    assert json.loads(path.read_text()) == {"ok": 1}
    assert os.listdir(tmp_path) == ["state.json"]
    atomic_write_text(path, "new")
    assert path.read_text() == "new"


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no search checkpoint at .*nothing.json"):
        load_checkpoint(tmp_path / "nothing.json")


@pytest.mark.parametrize("spec", [GenomeSpec(num_layers=10, num_points=3),
                                  GenomeSpec(num_layers=10, num_points=3, curve="step"),
                                  GenomeSpec(num_layers=10, brute_force=True)])
def test_plots_are_written_as_png(tmp_path, spec):
    GeneticSearch(spec, fitness, CONFIG, [PlotCallback(tmp_path)]).run()
    for name in ("curve.png", "fitness.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_progress_bars_count_generations_and_individuals(tmp_path, monkeypatch):
    import sys

    spec = GenomeSpec(num_layers=10, num_points=3)
    buffer = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buffer)
    result = GeneticSearch(spec, fitness, CONFIG, [ProgressCallback(disable=False)]).run()
    text = buffer.getvalue()
    assert "generations" in text and "individuals" in text
    assert f"{CONFIG.generations + 1}/{CONFIG.generations + 1}" in text
    assert f"{result['processed']}/{CONFIG.planned_individuals()}" in text
