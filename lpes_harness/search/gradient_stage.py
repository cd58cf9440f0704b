"""A search run's gradient stage (``--search-method gradient``): the factors found by Adam on a loss over
samples drawn across lengths, in place of the genetic search (:mod:`lpes_harness.search.search_stage`).

What it does, in order:

1. draws one condition per sample (``--gradient-samples`` of them) from ``--draw-sentences`` (and
   ``--draw-needles``) with ``--seed`` (:mod:`~lpes_harness.search.drawn_conditions`), and builds each
   sample's prompt and gold answer from the task's ``search`` split as the fitness reads them
   (:mod:`~lpes_harness.search.gradient_samples`);
2. runs :func:`~lpes_harness.search.gradient.gradient_search` on ``--family`` (two numbers an axis for
   ``lines``; every layer's factor for ``per-layer``) within the genome's bounds and held layers,
   ``--gradient-forwards`` forwards at most (a backward counts as two);
3. hands the later stages a history of one record per step (the factors it started from, ``fitness`` =
   minus its loss), so that ``uniform.json`` is tuned on the forwards this stage spent (times
   ``--uniform-share``) and the validation re-scores the ``--select-top`` lowest-loss steps, the start and
   the uniform factors by accuracy on validation samples: the loss steers, accuracy chooses.

Writes ``gradient.jsonl`` (a line a step), ``gradient_state.json`` (what ``--resume`` continues from),
``scales.json`` (the lowest loss so far), ``gradient.png``, and the curve's ``curve.png``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from lpes_harness.core.files import atomic_write_json
from lpes_harness.core.scaling import SCALINGS
from lpes_harness.search.run_context import Run
from lpes_harness.search.run_record import fail

GRADIENT_JOURNAL = "gradient.jsonl"  # run_record.RUN_STATE names both, for --overwrite
GRADIENT_STATE = "gradient_state.json"
FAMILIES = ("lines", "per-layer")


def build_family(args, spec):
    """The factor family of ``--family`` over the genome's axes: each axis its own bounds and held layers."""
    from lpes_harness.search.factor_families import Bounds, Lines, PerLayer

    halves = spec.halves()
    bounds = [Bounds(half.y_min, half.y_max) for half in halves]
    held = [list(half.held_layers) for half in halves]
    family = {"lines": Lines, "per-layer": PerLayer}[args.family]
    return family(args.scaling, spec.num_layers, bounds, held)


def start_params(family, spec):
    """The start: each axis flat at the genome's start value (``--initial-y``, the sweep's best where one ran)."""
    starts = [half.initial_y for half in spec.halves()]
    from lpes_harness.search.factor_families import Lines

    if isinstance(family, Lines):
        return family.initial([(y, y) for y in starts])
    return family.initial([y for y in starts for _ in range(spec.num_layers)])


def drawn(args, count: int) -> list[dict]:
    """``count`` samples' conditions: drawn from the ranges, or the task's own options for each sample."""
    from lpes_harness.search.drawn_conditions import ConditionRange, draw_conditions

    if args.draw_range is None:
        return [{"sample": i} for i in range(count)]
    return draw_conditions(args.seed, count, ConditionRange(args.draw_range, args.draw_needle_range))


def build_samples(args, lm, fitness_config, count: int, *, every_item: bool = False):
    """``count`` samples (the gradient and the racing stage's): one per drawn condition, from the task's search
    split, read as the fitness reads it. ``every_item``: each a group, the sample then its prompt asked about
    every other item (:func:`~lpes_harness.search.gradient_samples.position_question_groups`)."""
    from lpes_harness.search.gradient_samples import position_question_groups, position_token_samples

    percents = sorted({p for ps in fitness_config.positions.values() for p in ps})
    build = position_question_groups if every_item else position_token_samples
    return build(lm, args.task, "search", drawn(args, count), percents, args.seed, metadata=args.metadata,
                 chat_template=fitness_config.chat_template)


def seconds_by_length(samples, run_one, length=lambda sample: len(sample.prompt)) -> list[float]:
    """Each sample's seconds for ``run_one(sample)`` on this machine: the shortest and the longest sample timed
    (after one untimed run, which pays the process's one-off set-up), the others interpolated by their prompt
    length (the time is close to linear in it at these lengths: a forward and backward 3.7, 10.4 and 21.6 s at
    0.75k, 1.8k and 2.9k tokens for SmolLM2 in float32 on 2 AVX2 cores)."""
    short, long = min(samples, key=length), max(samples, key=length)
    timed = {}
    for name, sample in (("warm-up", short), ("short", short), ("long", long)):
        started = time.perf_counter()
        run_one(sample)
        timed[name] = time.perf_counter() - started
    low, high = length(short), length(long)
    slope = (timed["long"] - timed["short"]) / (high - low) if high > low else 0.0
    return [timed["short"] + slope * (length(s) - low) for s in samples]


def step_seconds(lm, samples, family, loss: str) -> float:
    """A full-batch step's seconds on this machine: a forward and backward of each sample (:func:`seconds_by_length`)."""
    from lpes_harness.core import rope
    from lpes_harness.core.rope_grad import DifferentiableRoPE
    from lpes_harness.search.gradient import _frozen, sample_loss

    scales, scaling = rope.get_scales(lm.model), rope.get_scaling(lm.model)
    rope.remove(lm.model)
    params = family.initial().requires_grad_(True)
    try:
        with _frozen(lm.model), DifferentiableRoPE(lm.model, family.scaling) as path:
            def forward_backward(sample):
                path.factors = family.factors(params)
                sample_loss(lm.model, sample, loss).backward()

            return sum(seconds_by_length(samples, forward_backward))
    finally:
        rope.install(lm.model, scales, scaling)


def gradient_plan(args, lm, fitness_config, fitness, spec, spent: float):
    """The run's cost with the gradient stage, printed before it runs, from its own steps timed here (and a
    fitness sample for the stages after it); ``--time-budget auto`` is set from that sample as the GA's is.
    Returns the samples built, which the stage then uses."""
    from lpes_harness.search.timing import duration, print_stage_plan

    samples = build_samples(args, lm, fitness_config, args.gradient_samples)
    step = step_seconds(lm, samples, build_family(args, spec), args.loss)
    steps = args.gradient_forwards // (len(samples) * 3)
    forwards = steps * len(samples) * 3
    print_stage_plan(args, fitness, spent, method="gradient search", detail=f"a step {duration(step)} here, ",
                     search_forwards=forwards,
                     search=("the gradient search", f"{steps} steps of {len(samples)} samples (a forward and a "
                                                    f"backward each), {forwards} forwards", steps * step),
                     stops="the gradient search stops early, before a step that its uniform factors and validation "
                           "could not follow in time")
    return samples


def gradient_stage(run: Run, sweep) -> tuple[dict, list[dict]]:
    """The gradient search: ``(result, history)``, as :func:`~lpes_harness.search.search_stage.search_stage`
    returns them. Adds the stage's forwards to ``run.forwards``."""
    from tqdm.auto import tqdm

    from lpes_harness.core import rope
    from lpes_harness.search.gradient import FORWARDS_PER_SAMPLE_STEP, GradientConfig, gradient_search

    args, output, spec = run.args, run.output, run.spec
    family = build_family(args, spec)
    state_path, journal = output / GRADIENT_STATE, output / GRADIENT_JOURNAL
    resume = _read_state(state_path, args) if args.resume else None
    print(f"gradient search: {args.family} ({family.initial().numel()} numbers), loss {args.loss}, lr {args.lr}, "
          f"{args.gradient_samples} samples" + (f" drawn over num_sentences {args.draw_range[0]}-{args.draw_range[1]}"
                                                 if args.draw_range else "")
          + f", {args.gradient_forwards} forwards at most (a backward counts as two)", flush=True)
    built = time.perf_counter()
    samples = run.drawn_samples or build_samples(args, run.lm, run.fitness_config, args.gradient_samples)
    print(f"  {len(samples)} samples ready in {time.perf_counter() - built:.0f} s; prompts of "
          f"{min(len(s.prompt) for s in samples)}-{max(len(s.prompt) for s in samples)} tokens", flush=True)
    config = GradientConfig(lr=args.lr, budget_forwards=args.gradient_forwards, loss=args.loss, seed=args.seed)
    step_cost = len(samples) * FORWARDS_PER_SAMPLE_STEP
    steps = args.gradient_forwards // step_cost
    if steps < 1:
        fail(f"--gradient-forwards {args.gradient_forwards} holds no step: one step of {len(samples)} samples costs "
             f"{step_cost} forwards (a backward counts as {FORWARDS_PER_SAMPLE_STEP - 1})")
    done = len(resume["history"]) if resume else 0
    bar = tqdm(total=steps, initial=done, desc="gradient steps", disable=args.no_progress or None)
    started = time.perf_counter()
    clock = _StepClock(run, started)

    def on_step(step) -> None:
        bar.update(1)
        bar.set_postfix({"loss": f"{step.loss:.4f}"}, refresh=False)
        clock.stepped()

    def on_checkpoint(state) -> None:
        atomic_write_json(state_path, {"settings": _state_settings(args), **state})
        _write_journal(journal, state["history"])
        _write_best(run, history_of(state["history"]))  # the state holds every step, a resumed run's earlier ones too

    scales, scaling = rope.get_scales(run.lm.model), rope.get_scaling(run.lm.model)
    rope.remove(run.lm.model)  # the differentiable path installs its own hooks; lpes_hf's come back after
    try:
        found = gradient_search(run.lm.model, samples, family, config, start=start_params(family, spec),
                                on_step=on_step, resume=resume, on_checkpoint=on_checkpoint,
                                stop_before_step=clock.out_of_time)
    finally:
        rope.install(run.lm.model, scales, scaling)
        bar.close()
    history = history_of(found.history)
    _plot(output, history, args.scaling)
    run.forwards["search"] = found.forwards
    best = min(history, key=lambda r: -r["fitness"])
    result = {"best": best, "stopped_early": clock.stopped, "processed": len(history), "method": "gradient",
              "wall_seconds": round(time.perf_counter() - started, 1), "fitness_evaluations": 0,
              "gradient": {"family": args.family, "loss": args.loss, "lr": args.lr, "samples": len(samples),
                           "forwards": found.forwards, "steps": len(history), "best_loss": found.loss}}
    if sweep is not None:
        result["sweep"] = sweep.summary()
    if clock.stopped:
        print(f"the time budget stopped the gradient search after {len(history)} steps", flush=True)
    print(f"lowest loss {found.loss:.4f} at step {best['index']} of {len(history)} ({found.forwards} forwards)", flush=True)
    return result, history


def history_of(steps) -> list[dict]:
    """The steps as the later stages read a search's history: ``fitness`` is minus the step's loss, ``info``'s
    ``samples`` its forwards (for the uniform factors' matched budget); step 0, the start, is ``initial``."""
    records, before = [], 0
    for step in steps:
        step = step if isinstance(step, dict) else vars(step)
        records.append({"index": step["step"], "generation": step["step"], "scales": step["factors"],
                        "fitness": -step["loss"], "origin": "initial" if step["step"] == 0 else "gradient",
                        "info": {"loss": step["loss"], "samples": step["forwards"] - before,
                                 "rejected": bool(step.get("rejected"))}})
        before = step["forwards"]
    return records


class _StepClock:
    """``--time-budget`` for the gradient stage (:class:`~lpes_harness.search.timing.StageDeadline`), each step's
    time taken to be the last one's."""

    def __init__(self, run: Run, started: float):
        from lpes_harness.search.timing import StageDeadline

        self.deadline, self.stopped, self.last, self.mark = StageDeadline(run, started), False, None, started

    def stepped(self) -> None:
        now = time.perf_counter()
        self.last, self.mark = now - self.mark, now

    def out_of_time(self, step: int) -> bool:
        if self.last is None:
            return False
        self.stopped = not self.deadline.allows(self.last)
        return self.stopped


def _state_settings(args) -> dict:
    """What a saved state must agree with to be resumed: the samples and the optimiser's settings."""
    return {"family": args.family, "loss": args.loss, "lr": args.lr, "gradient_samples": args.gradient_samples,
            "draw_range": list(args.draw_range or []), "draw_needle_range": list(args.draw_needle_range or []),
            "seed": args.seed, "scaling": args.scaling, "task": args.task}


def _read_state(path: Path, args) -> dict | None:
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    saved, current = state.pop("settings", {}), _state_settings(args)
    if saved != current:
        changed = sorted(k for k in current if saved.get(k) != current[k])
        fail(f"--resume: {path} was made with other gradient settings ({', '.join(changed)}); use --overwrite")
    return state


def _write_journal(path: Path, steps: list[dict]) -> None:
    from lpes_harness.core.files import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(step) + "\n" for step in steps))


def _write_best(run: Run, history: list[dict]) -> None:
    """``scales.json``: the lowest loss so far (the validation stage replaces it with the run's choice)."""
    from lpes_harness.core.scales_file import write_scales_file

    best = min(history, key=lambda r: -r["fitness"])
    write_scales_file(run.output / "scales.json", best["scales"], scaling=run.args.scaling,
                      curve="line" if run.args.family == "lines" else "per-layer", method="gradient",
                      loss=best["info"]["loss"], step=best["index"], model=run.model_name, dtype=run.args.dtype_chosen)


def _plot(output: Path, history: list[dict], scaling: str) -> None:
    """``gradient.png``: the loss per step (left) and the lowest-loss factors over depth (right)."""
    from lpes_harness.evaluation.plots import new_figure, save_agg

    figure = new_figure(figsize=(10, 3.6))
    losses, factors = figure.subplots(1, 2)
    losses.plot([r["index"] for r in history], [r["info"]["loss"] for r in history], marker="o", label="step")
    rejected = [r for r in history if r["info"].get("rejected")]
    if rejected:  # the points backtracking went back from
        losses.plot([r["index"] for r in rejected], [r["info"]["loss"] for r in rejected], "x", color="red",
                    markersize=10, label="rejected: back to the lowest, half the rate")
        losses.legend()
    losses.set_xlabel("step")
    losses.set_ylabel("loss (search samples)")
    best = min(history, key=lambda r: -r["fitness"])
    kind = SCALINGS[scaling]
    for axis, values in zip(kind.axes, kind.halves(best["scales"]) if kind.paired else [best["scales"]]):
        factors.plot(range(len(values)), values, marker=".", label=axis)
    factors.axhline(1.0, color="grey", linewidth=0.5)
    factors.set_xlabel("layer")
    factors.set_ylabel("factor")
    factors.legend()
    factors.set_title(f"lowest loss, step {best['index']}")
    save_agg(figure, output / "gradient.png")

