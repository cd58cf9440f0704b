"""``lpes-search --status --output DIR``: where a run stands, read from its folder alone.

A robust search runs for hours in stages (sweep, genetic search, uniform factors, validation,
held-out table), each resumable from its own file. This reads those files, loads no model and
writes nothing, so it can be asked while the run goes on in another shell, or after a kill, to
decide whether ``--resume`` is needed and what is left.
"""

from __future__ import annotations

import math

from pathlib import Path
from types import SimpleNamespace

from lpes_harness.core.files import read_json_or_none, read_jsonl
from lpes_harness.core.scaling import DEFAULT, scaling_of
from lpes_harness.search.config import SearchConfig
from lpes_harness.search.run_record import (RUN_RECORD, SELECTION_FILE, UNIFORM_FILE, UNIFORM_JOURNAL, folder_in_use,
                                           forwards_of, run_seconds, stopped_run_seconds)
from lpes_harness.search.selection import (samples_factor, top_individuals, validation_forwards,
                                           validation_forwards_at_most)
from lpes_harness.search.sweep import parse_sweep
from lpes_harness.search.timing import heldout_rows
from lpes_harness.search.uniform_tuning import best_point

NOT_STARTED = "not started"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _sweep_line(folder: Path, record: dict, sweep: dict | None) -> str:
    if sweep is not None:
        points = sweep.get("points") or []
        scaling = (record.get("settings") or {}).get("scaling", DEFAULT)
        # A sweep written before it named its kind swept the run's own scaling (both: its first axis, positions).
        kind = sweep.get("best_kind") or scaling_of(scaling).axes[0]
        return f"done, {len(points)} uniform factor(s); the search starts from {kind} {sweep.get('best')}"
    journalled = read_jsonl(folder / "sweep.jsonl")
    if journalled:
        return f"under way, {len(journalled)} factor(s) scored"
    # The sweep comes before the search: a search begun without one had none (--sweep none).
    begun = any((folder / name).is_file() for name in ("history.jsonl", "checkpoint.json", "gradient.jsonl",
                                                        "racing.jsonl"))
    return "none: the search started from its --initial-y" if begun else NOT_STARTED


def _search_line(folder: Path, record: dict, result: dict | None) -> tuple[str, list[dict], bool]:
    """The genetic search's line, its history, and whether it is finished."""
    history = read_jsonl(folder / "history.jsonl")
    checkpoint = read_json_or_none(folder / "checkpoint.json") or {}
    # A resume may grow --generations: its settings are the latest, "search" the first run's.
    planned = (record.get("settings") or {}).get("generations", (record.get("search") or {}).get("generations"))
    completed = checkpoint.get("completed_generation")
    if not history and completed is None:
        return NOT_STARTED, history, False
    budget_stop = bool((result or {}).get("stopped_early"))  # --time-budget ended it
    done = budget_stop or (completed is not None and planned is not None and completed >= planned)
    state = "done, stopped by its time budget" if budget_stop else "done" if done else "under way"
    # -1: a checkpoint made before the initial population (generation 0) was whole.
    generations = ("no generation complete" if completed is None or completed < 0
                   else f"generation {completed} of {planned} complete")
    # The run's own best (as of its last generation's end), else the fittest individual scored in full
    # so far: a raced-out one's fitness is an upper bound only.
    best = checkpoint.get("best") or next(iter(top_individuals(history, 1)), None)
    origin = f", {best['origin']}" if best and best.get("origin") else ""  # older runs did not record it
    best_text = "" if best is None else f"; best fitness {best['fitness']:.4f} (generation {best.get('generation')}{origin})"
    seconds = sum(float(line.get("seconds") or 0) for line in history)
    return (f"{state}, {generations}, {len(history)} individuals scored ({_hours(seconds)} of scoring, summed), "
            f"{forwards_of(history)} forwards{best_text}"), history, done


def _gradient_line(folder: Path, record: dict, result: dict | None) -> tuple[str, list[dict], bool]:
    """``--search-method gradient``: its line, its steps as the later stages read them, and whether it is finished."""
    from lpes_harness.search.gradient_stage import GRADIENT_JOURNAL, history_of

    settings = record.get("settings") or {}
    steps = read_jsonl(folder / GRADIENT_JOURNAL)
    planned = int(settings.get("gradient_forwards") or 0) // (3 * int(settings.get("gradient_samples") or 1))
    if not steps:
        return NOT_STARTED, [], False
    budget_stop = bool((result or {}).get("stopped_early"))
    done = budget_stop or len(steps) >= planned
    state = "done, stopped by its time budget" if budget_stop else "done" if done else "under way"
    lowest = min(steps, key=lambda s: s["loss"])
    return (f"{state}, step {len(steps)} of {planned}, {steps[-1]['forwards']} forwards (a backward counts as two); "
            f"lowest loss {lowest['loss']:.4f} at step {lowest['step']}"), history_of(steps), done


def _racing_line(folder: Path, record: dict, result: dict | None) -> tuple[str, list[dict], bool]:
    """``--search-method racing``: its line, one record a candidate (its scores so far), and whether it is finished."""
    from lpes_harness.search.racing_stage import RACING_JOURNAL

    scores = read_jsonl(folder / RACING_JOURNAL)
    if not scores:
        return NOT_STARTED, [], False
    planned = _planned_race(record.get("settings") or {})
    by_candidate: dict[int, list[dict]] = {}
    for row in scores:
        by_candidate.setdefault(row["candidate"], []).append(row)
    most = max(map(len, by_candidate.values()))
    history = [{"index": c, "scales": [], "fitness": sum(r["right"] for r in rows) / len(rows),
                "origin": "initial" if c == 0 else "draw",
                "info": {"samples": len(rows), "raced": len(rows) < most, "right": sum(r["right"] for r in rows),
                         "loss": sum(r["loss"] for r in rows) / len(rows)}}
               for c, rows in sorted(by_candidate.items())]
    budget_stop = bool((result or {}).get("stopped_early"))
    done = budget_stop or (result is not None) or len(scores) >= planned
    state = "done, stopped by its time budget" if budget_stop else "done" if done else "under way"
    # The race's own order: more right, then the lower mean loss, then the lower index.
    front = sorted((h for h in history if h["info"]["samples"] == most),
                   key=lambda h: (-h["info"]["right"], h["info"]["loss"], h["index"]))
    # A score is a prompt's share of its questions right (one question, or every item with --every-item), so the
    # mean over samples reads as accuracy; their sum (what the race ranks by) only counts on equal samples.
    standings = ", ".join(f"{h['index']} {h['fitness']:.3f}" for h in front[:4])
    return (f"{state}, {len(scores)} of {planned} forwards, {len(by_candidate)} candidates scored; on {most} "
            f"samples (mean share of questions right): {standings}"
            + (f" and {len(front) - 4} more" if len(front) > 4 else "")), history, done


def _planned_race(settings: dict) -> int:
    """The race's forwards, from the run's racing settings."""
    from lpes_harness.search.line_racing import RacingConfig

    return RacingConfig(int(settings.get("racing_draws") or 1), int(settings.get("racing_samples") or 1),
                        int(settings.get("racing_first") or 1)).forwards()


def _uniform_forwards_used(uniforms: list[dict], sweep: dict | None) -> int:
    """The uniform factors' forwards so far; the sweep's count too (its factors are uniform points): the
    same sum the run makes."""
    used = sum(int(p.get("forwards") or 0) for p in uniforms)
    return used + forwards_of((sweep or {}).get("points") or [])


def _uniform_line(folder: Path, record: dict, history: list[dict], uniforms: list[dict], sweep: dict | None) -> str:
    if not (record.get("settings") or {}).get("uniform_tuning"):
        return "not asked for (--no-uniform-tuning)"
    chosen = read_json_or_none(folder / UNIFORM_FILE)
    if chosen is not None:
        return f"done: {chosen.get('label')} (fitness {float(chosen.get('fitness', float('nan'))):.4f})"
    if not uniforms:
        return NOT_STARTED
    used = _uniform_forwards_used(uniforms, sweep)
    best = best_point(uniforms)
    best_text = "" if best is None else f"; the best of them {best['label']} ({best['fitness']:.4f})"
    return (f"under way, {len(uniforms)} factor(s) scored, {used} of at least {forwards_of(history)} forwards "
            f"(the genetic search's){best_text}")


def _validation_line(folder: Path, record: dict) -> str:
    if not (record.get("settings") or {}).get("validation_samples"):
        return "not asked for (--validation-samples 0): the search's best is the run's curve"
    selection = read_json_or_none(folder / SELECTION_FILE)
    if selection is not None:
        stopped = f" ({selection['stopped_by_budget']})" if selection.get("stopped_by_budget") else ""
        return f"done: {selection.get('chosen')}, {selection.get('message')}{stopped}"
    if not (folder / "validation").is_dir():
        return NOT_STARTED
    # A block holds a candidate's scores at one position of one condition; a later round adds samples to it.
    return f"under way, {sum(map(sum, _validation_blocks(folder).values()))} candidate score(s) cached under validation/ (one candidate on one sample)"


def _chose_the_plain_model(folder: Path) -> bool:
    """The run's choice is every factor 1: it scores no table of vanilla against itself."""
    scales = read_json_or_none(folder / "scales.json") or {}
    values = [*(scales.get("scales") or []), *(scales.get("base_scales") or [])]
    return bool(values) and all(float(v) == 1.0 for v in values)


def _heldout_line(folder: Path, record: dict, result: dict | None) -> str:
    samples = (record.get("settings") or {}).get("heldout_samples", record.get("heldout_samples"))
    names = [c.get("name") for c in record.get("conditions") or []]
    several = len(names) > 1
    if several:
        done = (folder / "heldout" / "summary.json").is_file()
        started = (folder / "heldout").is_dir()
    else:  # one table in the run folder itself (search.heldout.folders)
        done = (folder / "heldout.json").is_file()
        started = (folder / "scores.cache.json").is_file()
    if done:
        return f"done, {len(names)} conditions" if several else "done"
    if samples == 0:
        return "not asked for (--heldout-samples 0)"
    if samples is None:  # a record from before runs wrote their table's size
        return "none in this folder (its config.json does not say whether one was asked for)"
    if started:
        written = len(list((folder / "heldout").glob("*/heldout.json")))
        return f"under way, {written} of {len(names)} conditions written" if several else "under way (scores in scores.cache.json)"
    if result is not None and _chose_the_plain_model(folder):
        return "none: the run chose the plain model (every factor 1), and vanilla against itself is no table"
    return NOT_STARTED


def _time_line(record: dict, result: dict | None, running: bool) -> str:
    """How many processes the run took, and its time over them (the gaps between them left out): up
    to now while it runs, result.json's once it finished, to its last process's end stamp once stopped.
    A stopped run whose last process was killed has none: only its files' times could tell it, and a
    copy or a clone rewrites those."""
    resumes = len(record.get("resumes") or [])
    processes = f"{resumes + 1} process(es)" + (f" ({resumes} resume(s))" if resumes else "")
    if running:
        seconds = run_seconds(record)
    elif result is not None:
        seconds = result.get("run_seconds_with_heldout", result.get("run_seconds"))
        if seconds is None and not resumes:  # one process: its own clock is the run's
            seconds = result.get("total_seconds_with_heldout", result.get("total_seconds"))
    else:
        seconds = stopped_run_seconds(record)
        if seconds is not None:
            return f"{processes}; run time {_hours(seconds)} up to its stop (model loads included, the gaps left out)"
        return f"{processes}; the run's time is in result.json once it finishes"
    if seconds is None:
        return f"{processes}; run time unknown (a resume made before the gaps between processes were recorded)"
    if running:
        return f"{processes}; run time {_hours(seconds)} so far"
    return f"{processes}; run time {_hours(seconds)} (" + (
        "model loads included, the gaps between processes left out)" if resumes else "model load included)")


def _positions(record: dict) -> int:
    """Gold positions the fitness scores, over every condition (one sample at each is one forward)."""
    percents = {p for ps in ((record.get("fitness") or {}).get("positions") or {}).values() for p in ps}
    return len(percents) * max(1, len(record.get("conditions") or []))


def _eval_records(folder: Path, history: list[dict], uniforms: list[dict], sweep: dict | None) -> list[dict]:
    """Every record scored so far with its seconds: sweep points, the search's individuals, uniform factors."""
    points = (sweep or {}).get("points") or read_jsonl(folder / "sweep.jsonl")
    return [r for r in [*points, *history, *uniforms]
            if not r.get("cached") and (r.get("info") or {}).get("eval_seconds")]


def _left_line(folder: Path, record: dict, history: list[dict], uniforms: list[dict], sweep: dict | None,
               stages: dict[str, str]) -> str | None:
    """What is left of an unfinished run, in forwards and in time at the seconds a forward has taken in
    this run: the search at its own forwards per individual so far (racing and the cache as they went),
    the validation at its planned rounds; and the upper bound (no racing, every validation candidate
    tied). None before anything was timed or once nothing is left."""
    settings = record.get("settings") or {}
    timed = _eval_records(folder, history, uniforms, sweep)
    forwards_timed = forwards_of(timed)
    if not settings or not forwards_timed:
        return None
    rate = sum(r["info"]["eval_seconds"] for r in timed) / forwards_timed
    positions = _positions(record)
    per_individual = positions * int(settings.get("num_samples") or 0)
    typical, most = {}, {}
    if not stages["sweep"].startswith(("done", "none")):
        points = len(parse_sweep(settings.get("sweep"))) + (
            len(parse_sweep(settings.get("base_sweep"))) if scaling_of(settings.get("scaling")).paired else 0)
        typical["sweep"] = most["sweep"] = max(0, points - len(read_jsonl(folder / "sweep.jsonl"))) * per_individual
    method = next(m for m, name in SEARCH_STAGE.items() if name in stages)
    gradient = method == "gradient"
    search_done = stages[SEARCH_STAGE[method]].startswith("done")
    search = record.get("search") or {}

    # A resume may grow --generations: its settings are the latest, "search" the first run's.
    sizes = {name: settings.get(name, search.get(name)) for name in ("population", "parents", "mutants", "crossovers",
                                                                     "generations")}
    planned = SearchConfig(**{k: int(v) for k, v in sizes.items() if v is not None}).planned_individuals()
    if not search_done and gradient:  # a step's forwards are fixed: the samples, each a forward and a backward
        step = 3 * int(settings.get("gradient_samples") or 1)
        left = max(0, int(settings.get("gradient_forwards") or 0) // step - len(history))
        typical["search"] = most["search"] = left * step
    elif not search_done and method == "racing":  # the rungs fix the race's forwards
        typical["search"] = most["search"] = max(0, _planned_race(settings) - forwards_of(history))
    elif not search_done:
        scored = [r for r in history if not r.get("cached")]
        mean = forwards_of(scored) / len(scored) if scored else per_individual
        left = max(0, planned - len(history))
        typical["search"], most["search"] = round(left * mean), left * per_individual
    if stages["uniform factors"].startswith(("under way", NOT_STARTED)):
        share = float(settings.get("uniform_share") or 1.0)  # of the forwards the search spends
        used = _uniform_forwards_used(uniforms, sweep)
        typical["uniform factors"] = max(0, math.ceil(share * (forwards_of(history) + typical.get("search", 0))) - used)
        most["uniform factors"] = max(0, math.ceil(share * (forwards_of(history) + most.get("search", 0))) - used)
    if stages["validation"].startswith(("under way", NOT_STARTED)):
        args = SimpleNamespace(select_top=int(settings.get("select_top") or 0),
                               validation_samples=int(settings.get("validation_samples") or 0),
                               selection_rule=settings.get("selection_rule") or "two-se")
        blocks = _validation_blocks(folder)
        cached = sum(map(sum, blocks.values()))
        typical["validation"] = _validation_left(blocks, args, positions, cached)
        most["validation"] = max(0, validation_forwards_at_most(args, positions) - cached)
    if stages["held-out table"].startswith(("under way", NOT_STARTED)):
        # The rows the start-up estimate plans (a uniform choice drops its PI row: fewer, not more).
        rows = heldout_rows(SimpleNamespace(uniform_tuning=settings.get("uniform_tuning"),
                                            sweep_values=parse_sweep(settings.get("sweep")),
                                            base_sweep_values=parse_sweep(settings.get("base_sweep")),
                                            heldout_extra=settings.get("heldout_extra") or []))
        typical["held-out table"] = most["held-out table"] = rows * positions * int(settings.get("heldout_samples") or 0)
    if not any(most.values()):
        return None
    # The validation and the table score a sample at every gold position together, and those prompts share
    # their text: their forwards take this share of a search forward's time (measured at the run's start).
    share = float(record.get("heldout_share") or 1.0)

    def seconds(forwards: dict) -> float:
        return rate * sum(n * (share if name in ("validation", "held-out table") else 1.0) for name, n in forwards.items())

    parts = ", ".join(f"{name} {typical[name]}" for name in typical if most[name])
    shared = f", {share:.2f} of that for the validation's and the table's" if share < 1 else ""
    return (f"left: ~{_hours(seconds(typical))} ({parts} forwards), at most {_hours(seconds(most))} "
            f"({sum(most.values())} forwards: no racing, every validation candidate tied); at {rate:.2f} s a "
            f"forward, this run's so far{shared}")


def _validation_left(blocks: dict[str, list[int]], args, positions: int, cached: int) -> int:
    """The validation's forwards still to score (``blocks``: :func:`_validation_blocks`). In its first round,
    the plan's less what is cached; past it (a tie drew more samples than the plan's two doubled candidates),
    the round under way is finished from the cache (the candidates at its sample count, on every position of
    every condition) and the later rounds are planned at two candidates, as :func:`validation_forwards` plans them."""
    first = args.validation_samples
    n = max((c for lengths in blocks.values() for c in lengths), default=0)
    if n <= first:
        return max(0, validation_forwards(args, positions) - cached)
    # Blocks a candidate has not reached yet (a condition or position not scored in this round) count 0.
    left = sum(n * positions - sum(min(c, n) for c in lengths) for lengths in blocks.values() if n in lengths)
    maximum = samples_factor(args) * first
    while n < maximum:
        more = min(2 * n, maximum)
        left, n = left + 2 * (more - n) * positions, more
    return left


def _validation_blocks(folder: Path) -> dict[str, list[int]]:
    """Each candidate's (its scales, as the cache keys them) block lengths under validation/, one block per
    condition and gold position: one score in a block is one forward."""
    blocks: dict[str, list[int]] = {}
    for cache in (folder / "validation").glob("*/scores.cache.json"):
        for key, block in ((read_json_or_none(cache) or {}).get("blocks") or {}).items():
            blocks.setdefault(key.rpartition("@")[0], []).append(len(block))
    return blocks


SEARCH_STAGE = {"ga": "genetic search", "gradient": "gradient search", "racing": "racing"}


def run_status(folder: Path) -> list[str]:
    """Lines that say what a run folder holds, stage by stage, and what to do next. ``ValueError``
    when the folder holds no run."""
    folder = Path(folder)
    record = read_json_or_none(folder / RUN_RECORD)
    if record is None:
        if (folder / "checkpoint.json").is_file():
            record = {}
        else:
            raise ValueError(f"no run in {folder} (no {RUN_RECORD}, no checkpoint.json)")
    model = record.get("model") or {}
    search = record.get("search") or {}
    lines = [f"run {folder}: profile {record.get('profile', '?')}, seed {search.get('seed', '?')}, "
             f"{model.get('pretrained', '?')} in {model.get('dtype', '?')}, started {record.get('started', '?')}"]
    if model.get("machine"):
        lines.append(f"  made on: {model['machine']}")
    running = folder_in_use(folder)
    sweep, result = read_json_or_none(folder / "sweep.json"), read_json_or_none(folder / "result.json")
    if record.get("started"):
        lines.append(f"  {_time_line(record, result, running)}")
    method = (record.get("settings") or {}).get("search_method") or "ga"
    method = method if method in SEARCH_STAGE else "ga"
    lines_of = {"gradient": _gradient_line, "racing": _racing_line}.get(method, _search_line)
    search_line, history, search_done = lines_of(folder, record, result)
    uniforms = read_jsonl(folder / UNIFORM_JOURNAL)  # the uniform factors scored so far, read once
    stages = [("sweep", _sweep_line(folder, record, sweep)), (SEARCH_STAGE[method], search_line),
              ("uniform factors", _uniform_line(folder, record, history, uniforms, sweep)),
              ("validation", _validation_line(folder, record)), ("held-out table", _heldout_line(folder, record, result))]
    lines += [f"  {name}: {text}" for name, text in stages]
    finished = result is not None and search_done and all(
        text.startswith(("done", "not asked", "none")) for _, text in stages)
    left = None if finished else _left_line(folder, record, history, uniforms, sweep, dict(stages))
    if left:
        lines.append(f"  {left}")
    if running:
        lines.append("running: an lpes-search holds this folder now (ask --status again to follow it)")
    elif finished:
        lines.append(f"finished: lm_eval --model lpes_hf --model_args scales={folder / 'scales.json'}")
    else:
        lines.append(f"stopped before the end: lpes-search --resume --output {folder} continues it")
    return lines
