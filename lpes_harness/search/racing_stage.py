"""A search run's racing stage (``--search-method racing``): random pairs of lines over depth, raced by successive
halving on samples drawn across lengths (:mod:`lpes_harness.search.line_racing`), in place of the genetic search.

What it does, in order:

1. draws one condition per sample (``--racing-samples`` of them) from ``--draw-sentences`` (and ``--draw-needles``)
   with ``--seed``, and builds each sample's prompt and gold answer from the task's ``search`` split as the
   fitness reads them (the gradient stage's samples, :func:`~lpes_harness.search.gradient_stage.build_samples`);
2. draws ``--racing-draws`` line pairs (each axis's first and last factor, log-uniform in its ``--y-min/--y-max``
   or ``--base-y-*`` bounds, Latin-hypercube spread, from ``--seed``), puts the plain model first, and races them:
   ``--racing-first`` samples each, then the better half on twice as many, to ``--racing-samples``; greedy
   accuracy ranks, ``--loss`` breaks ties;
3. hands the later stages a history of one record per candidate: ``fitness`` its accuracy on the samples it
   reached, ``info.raced`` for those cut before the last rung (a bound, as the GA's raced individuals), so that
   the validation re-scores the ``--select-top`` finalists, the plain model (the start) and ``uniform.json``.

Writes ``racing.json`` (the settings and the candidates), ``racing.jsonl`` (a line a score: what ``--resume``
serves back), ``scales.json`` (the race's winner; the validation replaces it with the run's choice) and
``racing.png``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from lpes_harness.core.files import atomic_write_json
from lpes_harness.search.run_context import Run
from lpes_harness.search.run_record import fail

RACING_FILE, RACING_JOURNAL = "racing.json", "racing.jsonl"  # run_record.RUN_STATE names both, for --overwrite


def racing_config(args):
    from lpes_harness.search.line_racing import RacingConfig

    return RacingConfig(draws=args.racing_draws, samples=args.racing_samples, first=args.racing_first, seed=args.seed)


def candidates(args, spec) -> list[list[tuple[float, float]]]:
    """The plain model's flat lines first, then the draws."""
    from lpes_harness.search.line_racing import latin_ends

    bounds = [(h.y_min, h.y_max) for h in spec.halves()]
    return [[(1.0, 1.0)] * len(bounds)] + latin_ends(args.racing_draws, bounds, args.seed)


def build_groups(args, lm, fitness_config, count: int) -> list[list]:
    """The race's samples, each a group of :class:`~lpes_harness.search.gradient.TokenSample` s scored together: the
    drawn sample alone, or with ``--every-item`` followed by its prompt asked about each of its other items."""
    from lpes_harness.search.gradient_stage import build_samples

    if args.every_item:
        return build_samples(args, lm, fitness_config, count, every_item=True)
    return [[sample] for sample in build_samples(args, lm, fitness_config, count)]


def group_scores(model, group) -> list:
    """The answer log-probabilities of a group's questions: one forward for one question (as the race always
    scored), one forward of the shared text and each question's own tokens for several."""
    from lpes_harness.search.gradient import answer_log_probs
    from lpes_harness.search.shared_prefix import group_log_probs

    return [answer_log_probs(model, group[0])] if len(group) == 1 else group_log_probs(model, group)


def forward_seconds(lm, groups) -> list[float]:
    """Each sample's forward (its group's) on this machine (:func:`~lpes_harness.search.gradient_stage.seconds_by_length`)."""
    import torch

    from lpes_harness.search.gradient_stage import seconds_by_length

    with torch.no_grad():
        return seconds_by_length(groups, lambda group: group_scores(lm.model, group), length=lambda g: len(g[0].prompt))


def race_seconds(config, seconds: list[float]) -> float:
    """The race's time: each rung's new samples for every candidate it keeps."""
    total, before = 0.0, 0
    for alive, seen in config.rungs():
        total += alive * sum(seconds[before:seen])
        before = seen
    return total


def racing_plan(args, lm, fitness_config, fitness, spec, spent: float):
    """The run's cost with the racing stage, printed before it runs, from its own samples timed here (and a
    fitness sample for the stages after it). Returns the samples built, which the stage then uses."""
    from lpes_harness.search.timing import print_stage_plan

    samples = build_groups(args, lm, fitness_config, args.racing_samples)
    config = racing_config(args)
    racing = race_seconds(config, forward_seconds(lm, samples))
    rungs = " -> ".join(f"{alive} on {seen}" for alive, seen in config.rungs())
    print_stage_plan(args, fitness, spent, method="racing lines", detail="", search_forwards=config.forwards(),
                     search=("the race", f"{config.draws} line pairs and the plain model ({rungs} samples), "
                                         f"{config.forwards()} forwards", racing),
                     stops="the race stops before a rung that its uniform factors and validation could not follow "
                           "in time")
    return samples


def racing_stage(run: Run, sweep) -> tuple[dict, list[dict]]:
    """The race: ``(result, history)``, as :func:`~lpes_harness.search.search_stage.search_stage` returns them.
    Adds the stage's forwards to ``run.forwards``."""
    import torch
    from tqdm.auto import tqdm

    from lpes_harness.core import rope
    from lpes_harness.search.gradient import loss_from
    from lpes_harness.search.gradient_stage import build_family
    from lpes_harness.search.line_racing import race

    args, output, spec = run.args, run.output, run.spec  # --family is lines here: the flags refuse per-layer
    family, config = build_family(args, spec), racing_config(args)
    drawn = candidates(args, spec)
    known = _read_known(output, args, drawn) if args.resume else {}
    atomic_write_json(output / RACING_FILE, {"settings": _settings(args), "candidates": drawn,
                                             "rungs": config.rungs()})
    samples = run.drawn_samples or build_groups(args, run.lm, run.fitness_config, args.racing_samples)
    questions = sum(len(group) for group in samples)
    print(f"racing lines: {config.draws} line pairs and the plain model on {len(samples)} samples"
          + (f" ({questions} questions: each prompt asked about every item, one forward a prompt)"
             if questions > len(samples) else "")
          + (f" drawn over num_sentences {args.draw_range[0]}-{args.draw_range[1]}" if args.draw_range else "")
          + "; rungs " + " -> ".join(f"{alive} on {seen}" for alive, seen in config.rungs())
          + f" samples, {config.forwards()} forwards", flush=True)
    bar = tqdm(total=config.forwards(), initial=0, desc="racing", disable=args.no_progress or None)
    started = time.perf_counter()
    clock = _RungClock(run, started)
    journal = (output / RACING_JOURNAL).open("a")

    def score(entry, sample: int) -> tuple[float, float]:
        rope.install(run.lm.model, family.factors(family.initial(entry.ends)).tolist(), args.scaling)
        group = samples[sample]
        with torch.no_grad():
            scored = group_scores(run.lm.model, group)
        right = [lp.argmax(-1).tolist() == list(q.answer) for lp, q in zip(scored, group)]
        losses = [float(loss_from(lp, q, args.loss)) for lp, q in zip(scored, group)]
        if len(group) == 1:
            return right[0], losses[0]
        return sum(right) / len(group), sum(losses) / len(group)

    def on_score(entry, sample: int, right: bool, loss: float) -> None:
        journal.write(json.dumps({"candidate": entry.index, "sample": sample, "right": right, "loss": loss}) + "\n")
        journal.flush()
        clock.scored()
        bar.update(1)

    scales, scaling = rope.get_scales(run.lm.model), rope.get_scaling(run.lm.model)
    rope.remove(run.lm.model)  # each score installs its candidate in the run's --scaling; lpes_hf's come back after
    try:
        bar.update(len(known))
        found = race(score, drawn, config, known=known, on_score=on_score, stop_before_rung=clock.out_of_time)
    finally:
        rope.remove(run.lm.model)
        rope.install(run.lm.model, scales, scaling)
        journal.close()
        bar.close()
    history = history_of(found.entries, family, len(found.winner.right))
    run.forwards["search"] = found.forwards
    winner = next(r for r in history if r["index"] == found.winner.index)
    _write_winner(run, winner)
    _plot(output, found, family, args.scaling)
    result = {"best": winner, "stopped_early": found.stopped, "processed": len(history), "method": "racing",
              "wall_seconds": round(time.perf_counter() - started, 1), "fitness_evaluations": 0,
              "racing": {"draws": config.draws, "samples": len(samples), "first": config.first, "loss": args.loss,
                         "forwards": found.forwards, "winner": found.winner.to_dict()}}
    if sweep is not None:
        result["sweep"] = sweep.summary()
    if found.stopped:
        print(f"the time budget stopped the race after rung {found.winner.rung}", flush=True)
    got = sum(found.winner.right)
    print(f"race won by candidate {found.winner.index} ({_ends_text(found.winner.ends, args.scaling)}): "
          + (f"{got:g} of {len(found.winner.right)} right" if questions == len(samples) else
             f"{got / len(found.winner.right):.3f} of each prompt's questions right on average, {len(found.winner.right)} "
             "prompts") + f" ({found.forwards} forwards)", flush=True)
    return result, history


def history_of(entries, family, final: int) -> list[dict]:
    """The candidates as the later stages read a search's history: ``fitness`` the accuracy on the samples each
    reached, ``info.raced`` for those cut before the last rung's ``final`` samples; the plain model is ``initial``."""
    records = []
    for entry in entries:
        n = len(entry.right)
        records.append({"index": entry.index, "generation": entry.rung, "ends": [list(e) for e in entry.ends],
                        "scales": family.factors(family.initial(entry.ends)).tolist(),
                        "fitness": sum(entry.right) / n if n else 0.0,
                        "origin": "initial" if entry.index == 0 else "draw",
                        "info": {"samples": n, "raced": n < final, "right": sum(entry.right),
                                 "loss": sum(entry.loss) / n if n else None}})
    return records


class _RungClock:
    """``--time-budget`` for the race (:class:`~lpes_harness.search.timing.StageDeadline`), a rung's time taken at
    this run's seconds a forward so far."""

    def __init__(self, run: Run, started: float):
        from lpes_harness.search.timing import StageDeadline

        self.deadline, self.started, self.count = StageDeadline(run, started), started, 0

    def scored(self) -> None:
        self.count += 1

    def out_of_time(self, rung: int, alive: int, new_samples: int) -> bool:
        if not self.count:
            return False
        per_forward = (time.perf_counter() - self.started) / self.count
        return not self.deadline.allows(alive * new_samples * per_forward)


def _settings(args) -> dict:
    """What a saved race must agree with to be resumed: its samples and candidates."""
    return {"racing_draws": args.racing_draws, "racing_samples": args.racing_samples, "racing_first": args.racing_first,
            "loss": args.loss, "draw_range": list(args.draw_range or []),
            "draw_needle_range": list(args.draw_needle_range or []), "seed": args.seed, "scaling": args.scaling,
            "task": args.task, "every_item": bool(args.every_item)}


def _read_known(output: Path, args, drawn) -> dict:
    """The scores a stopped race made, keyed ``(candidate, sample)``; refused if it was another race."""
    saved = output / RACING_FILE
    if not saved.is_file():
        return {}
    state = json.loads(saved.read_text())
    current = _settings(args)
    if state.get("settings") != current or state.get("candidates") != json.loads(json.dumps(drawn)):
        changed = sorted(k for k in current if (state.get("settings") or {}).get(k) != current[k]) or ["the bounds"]
        fail(f"--resume: {saved} was made with other racing settings ({', '.join(changed)}); use --overwrite")
    from lpes_harness.core.files import atomic_write_text

    known, kept = {}, []
    journal = output / RACING_JOURNAL
    for line in journal.read_text().splitlines() if journal.is_file() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill: scored again
            continue
        known[(row["candidate"], row["sample"])] = (row["right"], row["loss"])
        kept.append(line + "\n")
    if journal.is_file():  # without the cut line, which the next score would otherwise be appended to
        atomic_write_text(journal, "".join(kept))
    return known


def _ends_text(ends, scaling: str) -> str:
    from lpes_harness.core.scaling import SCALINGS

    return ", ".join(f"{axis} {a:g} -> {b:g}" for axis, (a, b) in zip(SCALINGS[scaling].axes, ends))


def _write_winner(run: Run, winner: dict) -> None:
    """``scales.json``: the race's winner (the validation stage replaces it with the run's choice)."""
    from lpes_harness.core.scales_file import write_scales_file

    write_scales_file(run.output / "scales.json", winner["scales"], scaling=run.args.scaling, curve="line",
                      method="racing", ends=winner["ends"], fitness=winner["fitness"], model=run.model_name,
                      dtype=run.args.dtype_chosen)


def _plot(output: Path, found, family, scaling: str) -> None:
    """``racing.png``: each candidate's accuracy on the samples it had at each rung (left), and the winner's
    factors over depth (right)."""
    from lpes_harness.core.scaling import SCALINGS
    from lpes_harness.evaluation.plots import new_figure, save_agg

    figure = new_figure(figsize=(10, 3.6))
    race_axes, factors = figure.subplots(1, 2)
    cuts = sorted({len(e.right) for e in found.entries})
    for entry in found.entries:
        points = [n for n in cuts if n <= len(entry.right)]
        style = ({"color": "black", "linewidth": 2, "label": "plain model"} if entry.index == 0 else
                 {"color": "tab:red", "linewidth": 2, "label": "winner"} if entry is found.winner else
                 {"color": "grey", "alpha": 0.5, "linewidth": 0.8})
        race_axes.plot(points, [sum(entry.right[:n]) / n for n in points], marker=".", **style)
    race_axes.set_xlabel("samples scored")
    race_axes.set_ylabel("accuracy so far")
    race_axes.legend()
    kind = SCALINGS[scaling]
    values = family.factors(family.initial(found.winner.ends)).tolist()
    for axis, half in zip(kind.axes, kind.halves(values) if kind.paired else [values]):
        factors.plot(range(len(half)), half, marker=".", label=axis)
    factors.axhline(1.0, color="grey", linewidth=0.5)
    factors.set_xlabel("layer")
    factors.set_ylabel("factor")
    factors.legend()
    factors.set_title(f"winner: candidate {found.winner.index}")
    save_agg(figure, output / "racing.png")
