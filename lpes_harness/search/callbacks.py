"""Observers of a search: checkpoint, history.jsonl, progress bars, plots, a time limit.

Each is a :class:`~lpes_harness.search.loop.Callback`; the loop calls their hooks and never
their names. Whole files (checkpoint, plots, rewritten history) are written atomically: to a
temporary file in the same folder, fsynced, then ``os.replace``-d over the target, so a
kill leaves either the old file or the new one. ``history.jsonl`` is appended one line
per individual in a single write; on resume it is cut back to the individuals the
checkpoint covers, dropping any line written after the last checkpoint.

The checkpoint costs O(1) per individual, as Lightning checkpoints at epoch ends: the whole
state (``checkpoint.json``) is written when the search starts, at the end of each generation
and when it fails; in between each individual appends one line to ``checkpoint.jsonl`` (its
index, cache key, fitness and info). :func:`load_checkpoint` reads both back as one state.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from lpes_harness.core.files import append_jsonl, atomic_write_json, atomic_write_text, kill_point, read_jsonl
from lpes_harness.evaluation.plots import plot_condition_scores, plot_fitness
from lpes_harness.search.curve_plot import plot_curve
from lpes_harness.search.loop import Callback, GeneticSearch, cache_key
from lpes_harness.search.run_record import forwards_of
from lpes_harness.search.sample_order import load_order_state, order_state

# ------------------------------------------------------------------- checkpoint


def journal_path(path: str | os.PathLike) -> Path:
    """The per-individual lines that complete the checkpoint at ``path`` (``checkpoint.jsonl``)."""
    return Path(path).with_suffix(".jsonl")


def load_checkpoint(path: str | os.PathLike) -> dict:
    """The state a :class:`CheckpointCallback` saved (for ``GeneticSearch.load_state_dict``): the whole
    state at ``path``, with the individuals its journal added since."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no search checkpoint at {path}; nothing to resume")
    with open(path, encoding="utf-8") as handle:
        state = json.load(handle)
    # A torn last line (a kill mid-write) is skipped: that one individual is evaluated again.
    for line in read_jsonl(journal_path(path)):
        if line["index"] < state["processed_total"]:
            continue  # the whole state was written after it (a kill before the journal was removed)
        state["cache"].append([line["key"], line["fitness"], line["info"]])
        state["processed_total"] = line["index"] + 1
        if "callbacks" in line:
            state["callbacks"] = line["callbacks"]
    return state


# -------------------------------------------------------------------- callbacks


class SampleOrderCallback(Callback):
    """The fitness's sample-order statistics (``--sample-order hardest``) as callback state: saved
    with the checkpoint and with every journalled individual, restored on resume, so that a resumed
    search races its samples in the order the uninterrupted one would have (the same forwards and
    raced bounds, not only the same choices). Nothing is saved in the roles order."""

    def __init__(self, fitness):
        self.fitness = fitness

    def state_dict(self) -> dict:
        return order_state(self.fitness) or {}

    def load_state_dict(self, state: dict) -> None:
        load_order_state(self.fitness, state)


class TimeLimitCallback(Callback):
    """Stops the search (``search.should_stop``) in time for what must come after it: ``--time-budget``'s
    deadline.

    ``seconds``: from the search's start to the budget's end. ``after_forwards``: the forwards still to
    run after the search (the validation and the held-out table), at the seconds a forward of this search
    has taken once it has scored :data:`RATE_AFTER_FORWARDS` (before that, ``seconds_per_forward``, the
    start-up timing), times ``margin``. ``matched``: forwards run after the search for each of its own (1
    with uniform tuning, which spends as many as the search used), at the search's rate. The search stops
    as soon as what is left is less than the longest individual it has evaluated (and as much again per
    ``matched``): the next one's worst case, not its mean. Racing makes the two far apart: most random draws
    stop after one chunk (8 s on an AVX-512 CPU without AVX512-BF16), but one that keeps up with the best
    runs whole (72 s), and such a draw, started with 17 s left on the mean's rule, ended the demo's search 55 s
    past its deadline (results/demo_avx512_nobf16). What it spent is callback state: a resumed search counts
    on from it, and one already past its limit processes nothing new (the loop still replays what it had)."""

    RATE_AFTER_FORWARDS = 40  # one unraced individual of the demo: enough for the search's own rate

    def __init__(self, seconds: float | None, after_forwards: int = 0, seconds_per_forward: float = 0.0,
                 margin: float = 1.0, matched: float = 0.0):
        self.limit = seconds  # None: restored from a checkpoint by load_state_dict
        self.after_forwards, self.seconds_per_forward, self.margin = after_forwards, seconds_per_forward, margin
        self.matched = matched
        self.spent = 0.0
        self.individuals = 0
        self.longest = 0.0  # seconds of the longest individual evaluated (a cached one costs nothing)
        self.forwards, self.forward_seconds = 0, 0.0  # what the search scored, and the seconds that took
        self._since = None

    def rate(self) -> float:
        """Seconds a forward takes: this search's own, once it has scored enough, else the start-up timing."""
        if self.forwards >= self.RATE_AFTER_FORWARDS:
            return self.forward_seconds / self.forwards
        return self.seconds_per_forward

    def seconds_left(self) -> float:
        """What the search may still spend, the work after it set aside."""
        return self.limit - self.spent - (self.margin * self.after_forwards + self.matched * self.forwards) * self.rate()

    def on_search_start(self, search: GeneticSearch) -> None:
        if self.limit is None:
            raise ValueError("TimeLimitCallback: no limit given and none restored from a checkpoint")
        self._since = time.perf_counter()
        if self.seconds_left() <= 0:
            search.should_stop = True

    def on_individual(self, search: GeneticSearch, record: dict) -> None:
        now = time.perf_counter()
        self.spent += now - self._since
        self._since = now
        self.individuals += 1
        if not record["cached"]:
            self.forwards += forwards_of([record])
            self.forward_seconds += record["seconds"]
            self.longest = max(self.longest, record["seconds"])
        next_one = max(self.longest, self.spent / self.individuals)  # the mean: the loop's own time, where it dominates
        if self.seconds_left() < (1 + self.matched) * next_one:
            search.should_stop = True

    def state_dict(self) -> dict:
        return {"limit_seconds": self.limit, "after_forwards": self.after_forwards,
                "seconds_per_forward": self.seconds_per_forward, "margin": self.margin, "matched": self.matched,
                "spent_seconds": round(self.spent, 3), "individuals": self.individuals,
                "forwards": self.forwards, "forward_seconds": round(self.forward_seconds, 3),
                "longest_seconds": round(self.longest, 3)}

    def load_state_dict(self, state: dict) -> None:
        self.limit, self.after_forwards = state["limit_seconds"], state["after_forwards"]
        self.seconds_per_forward, self.margin = state["seconds_per_forward"], state["margin"]
        self.matched = state.get("matched", 0.0)  # a checkpoint made before uniform tuning was planned
        self.spent, self.individuals = state["spent_seconds"], state["individuals"]
        self.forwards, self.forward_seconds = state["forwards"], state["forward_seconds"]
        self.longest = state.get("longest_seconds", 0.0)  # a checkpoint made before the worst case was kept


class CheckpointCallback(Callback):
    """Saves ``search.state_dict()`` at the start, at every generation's end and on failure, and
    appends each processed individual to the journal (:func:`journal_path`) in between.

    ``extra`` keys are saved next to the state (e.g. ``{"fingerprint": ...}`` from
    :mod:`lpes_harness.search.fingerprint`, which a resume compares); ``load_state_dict``
    ignores them.
    """

    def __init__(self, path: str | os.PathLike, extra: dict | None = None):
        self.path = Path(path)
        self.journal = journal_path(self.path)
        self.extra = dict(extra or {})

    def _write(self, search: GeneticSearch) -> None:
        atomic_write_json(self.path, {**search.state_dict(), **self.extra})
        # The whole state holds everything the journal did: it starts afresh. (A kill between the
        # two leaves old lines, which load_checkpoint skips by their index.)
        self.journal.unlink(missing_ok=True)

    def on_search_start(self, search: GeneticSearch) -> None:
        if not search.resumed:  # a resumed run's checkpoint and journal are still good: keep appending
            self._write(search)

    def on_individual(self, search: GeneticSearch, record: dict) -> None:
        line = {"index": record["index"], "key": list(cache_key(record["scales"], search.config.cache_decimals)),
                "fitness": record["fitness"], "info": record["info"]}
        callbacks = search.callback_states()
        if callbacks:
            line["callbacks"] = callbacks
        _append_line(self.journal, line)
        kill_point("individual")  # test hook (lpes_harness.core.files.kill_point): a kill mid-generation

    def on_generation_end(self, search: GeneticSearch, stats: dict) -> None:
        self._write(search)
        kill_point("generation")  # test hook: a kill between two generations

    def on_exception(self, search: GeneticSearch, error: BaseException) -> None:
        self._write(search)  # what a resume needs, as of the last processed individual


class HistoryCallback(Callback):
    """Appends every individual to ``path`` (JSON lines), and each generation's statistics to
    ``generations_path`` when given."""

    def __init__(self, path: str | os.PathLike, generations_path: str | os.PathLike | None = None):
        self.path = Path(path)
        self.generations_path = Path(generations_path) if generations_path else None

    def on_search_start(self, search: GeneticSearch) -> None:
        if search.resumed:
            keep = [r for r in read_jsonl(self.path) if r.get("index", -1) < search.replay_until]
            keep_generations = []
            if self.generations_path:
                keep_generations = [
                    r for r in read_jsonl(self.generations_path)
                    if r.get("generation", 1 << 30) <= search.completed_generation
                ]
        else:
            keep, keep_generations = [], []
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in keep))
        if self.generations_path:
            atomic_write_text(self.generations_path, "".join(json.dumps(r) + "\n" for r in keep_generations))

    def on_individual(self, search: GeneticSearch, record: dict) -> None:
        _append_line(self.path, record)

    def on_generation_end(self, search: GeneticSearch, stats: dict) -> None:
        if self.generations_path:
            _append_line(self.generations_path, stats)


def _append_line(path: Path, record: dict) -> None:
    append_jsonl(path, record)  # one write: a line is either there whole or not at all


class ProgressCallback(Callback):
    """tqdm bars over generations and over individuals, with the best fitness so far.

    The generation bar shows the best and mean fitness of the complete individuals, and how
    many were raced out (see :func:`generation_postfix`).
    """

    def __init__(self, disable: bool | None = None):
        self.disable = disable
        self._generations = self._individuals = None

    def on_search_start(self, search: GeneticSearch) -> None:
        from tqdm.auto import tqdm

        config = search.config
        self._generations = tqdm(
            total=config.generations + 1, initial=search.completed_generation + 1,
            desc="generations", position=0, disable=self.disable,
        )
        self._individuals = tqdm(
            total=config.planned_individuals(), initial=search.replay_until,
            desc="individuals", position=1, disable=self.disable,
        )

    def on_individual(self, search: GeneticSearch, record: dict) -> None:
        self._individuals.update(1)
        postfix = {"best": f"{search.best['fitness']:.4f}"}
        limit = next((c for c in search.callbacks if isinstance(c, TimeLimitCallback)), None)
        if limit is not None:  # the total is then an upper bound: the deadline ends the bar
            postfix["time left"] = f"{max(0.0, limit.seconds_left()) / 60:.1f} min"  # the search's, the table's set aside
        self._individuals.set_postfix(postfix, refresh=False)

    def on_generation_end(self, search: GeneticSearch, stats: dict) -> None:
        self._generations.update(1)
        self._generations.set_postfix(generation_postfix(stats))

    def on_search_end(self, search: GeneticSearch, result: dict) -> None:
        self._close()

    def on_exception(self, search: GeneticSearch, error: BaseException) -> None:
        self._close()  # the terminal is left clean for the traceback

    def _close(self) -> None:
        for bar in (self._individuals, self._generations):
            if bar is not None:
                bar.close()


def generation_postfix(stats: dict) -> dict:
    """What the generation bar shows: best and mean over complete individuals, raced-out count apart."""
    mean = stats.get("mean_fitness")
    postfix = {"best": f"{stats['best_fitness']:.4f}", "mean": "n/a" if mean is None else f"{mean:.4f}"}
    if "raced_out" in stats:
        postfix["complete"] = stats["complete"]
        postfix["raced_out"] = stats["raced_out"]
    return postfix


class PlotCallback(Callback):
    """Redraws ``curve.png`` (the best genome) and ``fitness.png`` after every generation."""

    def __init__(self, directory: str | os.PathLike, scaling: str = "position", conditions: bool = False):
        self.directory = Path(directory)
        self.scaling = scaling  # what the scales multiply: the curve's axis says so
        self.conditions = conditions  # a search over conditions: conditions.png too

    def on_generation_end(self, search: GeneticSearch, stats: dict) -> None:
        plot_curve(self.directory / "curve.png", search.spec, stats["best_genome"], stats["best_scales"],
                   title=f"best after generation {stats['generation']}: fitness {stats['best_fitness']:.4f}",
                   scaling=self.scaling)
        plot_fitness(self.directory / "fitness.png", search.generation_stats)
        if self.conditions:  # the best individual's score per condition, by generation
            plot_condition_scores(self.directory / "conditions.png", search.generation_stats)
