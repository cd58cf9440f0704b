"""The loop evaluates what the operators make, dispatches every hook, and fails cleanly."""

import json
import random

import pytest
from test_search_loop import SMALL, synthetic_fitness

from lpes_harness.search import Callback, GeneticSearch, GenomeSpec
from lpes_harness.search.callbacks import CheckpointCallback, ProgressCallback, load_checkpoint
from lpes_harness.search.operators import build_toolbox

SPEC = GenomeSpec(num_layers=12, num_points=3)


def test_toolbox_mate_only_varies_its_children_are_evaluated_by_the_loop():
    toolbox = build_toolbox(SPEC, random.Random(0))
    search = GeneticSearch(SPEC, synthetic_fitness, SMALL)
    search.run()
    parents = search.population[:2]
    children = toolbox.mate(parents[0], parents[1])
    assert {child.origin for child in children} <= {"crossover", "crossover_fallback"} and 1 <= len(children) <= 2
    assert not hasattr(toolbox, "evaluate") and not any(child.fitness.valid for child in children)


def test_a_failing_run_closes_the_bars_and_flushes_the_checkpoint(tmp_path):
    calls = {"n": 0}

    def failing(scales):
        calls["n"] += 1
        if calls["n"] == 7:
            raise RuntimeError("out of memory")
        return synthetic_fitness(scales)

    seen = []

    class Watch(Callback):
        def on_exception(self, search, error):
            seen.append(str(error))

    progress = ProgressCallback(disable=True)
    path = tmp_path / "checkpoint.json"
    search = GeneticSearch(SPEC, failing, SMALL, [CheckpointCallback(path), progress, Watch()])
    with pytest.raises(RuntimeError, match="out of memory"):
        search.run()
    assert seen == ["out of memory"]
    assert progress._individuals.disable and progress._generations.disable  # closed without error
    saved = load_checkpoint(path)
    assert saved["processed_total"] == 6  # the failed individual is not claimed
    resumed = GeneticSearch(SPEC, synthetic_fitness, SMALL)
    resumed.load_state_dict(saved)
    assert resumed.run()["best"] == GeneticSearch(SPEC, synthetic_fitness, SMALL).run()["best"]


class Counter(Callback):
    def __init__(self):
        self.individuals = 0

    def on_individual(self, search, record):
        self.individuals += 1

    def state_dict(self):
        return {"individuals": self.individuals}

    def load_state_dict(self, state):
        self.individuals = state["individuals"]


def test_callbacks_keep_their_own_state_in_the_search_state():
    counter = Counter()
    search = GeneticSearch(SPEC, synthetic_fitness, SMALL, [counter])
    search.run()
    state = json.loads(json.dumps(search.state_dict()))
    assert state["callbacks"] == {"Counter": {"individuals": counter.individuals}}
    restored = Counter()
    GeneticSearch(SPEC, synthetic_fitness, SMALL, [restored]).load_state_dict(state)
    assert restored.individuals == counter.individuals
    assert "callbacks" not in GeneticSearch(SPEC, synthetic_fitness, SMALL).state_dict()  # none with state
