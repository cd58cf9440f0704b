"""What a search's time costs, before and while it runs: the start-up timing of one sample, the
worst-case estimate a run prints, and ``--time-budget``'s plan (:mod:`lpes_harness.search.budget`) and
deadline (:class:`~lpes_harness.search.callbacks.TimeLimitCallback`) applied to a run's flags."""

from __future__ import annotations

import math
import time

from lpes_harness.search.budget import (AUTO_FLOOR_SECONDS, AUTO_SAMPLE_TIMES, HELDOUT_MARGIN, RACING_SAVING,
                                        RANDOM_DRAW_SAVING, BudgetTooSmall, auto_budget, plan)
from lpes_harness.search.callbacks import TimeLimitCallback
from lpes_harness.search.config import SearchConfig
from lpes_harness.search.run_record import fail
from lpes_harness.search.selection import samples_factor, validation_forwards, validation_forwards_at_most


def time_one_sample(fitness) -> float:
    """Seconds one sample takes, timed now on one sample of each role (of each condition), weighted
    by how many samples each has."""
    # The first forward of a process pays one-off setup (kernel selection, allocator growth), and
    # the projection multiplies the timed sample by thousands: it is left out of the timing.
    fitness.score_samples(next(iter(fitness.sizes)), [0])
    total = 0.0
    for group, size in fitness.sizes.items():
        started = time.perf_counter()
        fitness.score_samples(group, [0])  # this process only: no collective call before the search starts
        total += (time.perf_counter() - started) * size
    return total / sum(fitness.sizes.values())


def print_estimate(config: SearchConfig, fitness, per_sample: float, sweep_points: int = 0,
                   heldout_samples: int = 0, args=None, share: float = 1.0) -> None:
    """Project the run's worst case (no cache hits, no racing) from the seconds a sample takes.

    ``heldout_samples``: all the samples of the held-out table after the search (0: none). ``share``: a
    validation or held-out forward's time against a search sample's (:func:`heldout_share`)."""
    samples = sum(fitness.sizes.values())
    individuals = config.planned_individuals() + sweep_points
    worst = individuals * samples * per_sample
    after = []
    if args is not None and args.uniform_tuning:
        after.append(f"uniform factors as many forwards as the search ({duration(config.planned_individuals() * samples * per_sample)} at most)")
    validating = args is not None and args.validation_samples
    if validating:
        positions = samples // args.num_samples
        planned = validation_forwards(args, positions)  # what --time-budget plans it at
        tied = validation_forwards_at_most(args, positions)
        if samples_factor(args) == 1:  # --selection-rule accuracy: one round, no doubling
            after.append(f"validation of up to {args.select_top + 3} candidates, {planned} forwards "
                         f"(~{duration(planned * per_sample * share)})")
        else:
            after.append(f"validation of up to {args.select_top + 3} candidates, {planned} forwards if two go on to "
                         f"the most samples (~{duration(planned * per_sample * share)}), {tied} at most, when all "
                         f"stay tied (~{duration(tied * per_sample * share)})")
    if heldout_samples:
        after.append(f"the held-out table, {heldout_samples} samples = {duration(heldout_samples * per_sample * share)}")
    if share < 1 and (heldout_samples or validating):  # a note on the parts before it, not a stage of its own
        after[-1] += f" (validation and table at {share:.2f} of a sample's time: a sample's prompts at the gold positions share their text)"
    print(
        f"cost estimate: at most {individuals} individuals x {samples} samples "
        f"({len(fitness.sizes)} roles) x {per_sample:.2f} s/sample = {duration(worst)} worst case; "
        f"the fitness cache and racing cut this (see history.jsonl 'raced' / 'cached')"
        + "".join(f"; then {part}" for part in after),
        flush=True,
    )


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# A held-out forward's time against a whole prompt's is its share of the tokens plus this: the shared text's
# tokens are not run again, but every new token still attends to the whole prompt, and each forward has its
# fixed cost. benchmarks/prefix_sharing.py on multi_needle (bundled SmolLM2, 2-core AVX2-only CPU, float32,
# 2 threads, alone): 0.688 of the tokens took 0.780 of the time (results/prefix_sharing).
SHARE_ALLOWANCE = 0.10


def heldout_share(fitness, samples: int = 4) -> float:
    """A held-out table's time per forward against a whole prompt's, counted without a forward.

    The table scores a sample at every gold position together, and those prompts share their text up to
    the gold item (:func:`lpes_harness.lmeval.answer_logits.shared_token_fraction`). Counted on the first
    ``samples`` of the search split of each condition, built as the held-out ones are; 1 where the
    scorer shares nothing (a batch of several prompts a forward, a generate fitness)."""
    from lpes_harness.lmeval.answer_logits import resolve_batch_size, shared_token_fraction

    parts = list(getattr(fitness, "parts", {"": fitness}).values())
    shares = []
    for part in parts:
        scorer = getattr(part, "scorer", None)
        if scorer is None or scorer.mode == "generate" or resolve_batch_size(scorer.lm, scorer.batch_size) != 1:
            return 1.0
        fractions = [shared_token_fraction(scorer.lm, [scorer.prompt(scorer.tasks[p], scorer.docs[p][i])
                                                       for p in scorer.tasks])
                     for i in range(min([samples, *(len(d) for d in scorer.docs.values())]))]
        shares.append(max(fractions, default=1.0))
    return min(1.0, max(shares, default=1.0) + SHARE_ALLOWANCE)


def heldout_rows(args) -> int:
    """The held-out table's rows at most: vanilla, the curve, its PI (``--heldout-extra pi``) and a uniform
    factor (``uniform.json``, or the sweep's best with ``--heldout-extra uniform``)."""
    uniform = args.uniform_tuning or ((args.sweep_values or args.base_sweep_values) and "uniform" in args.heldout_extra)
    return 2 + ("pi" in args.heldout_extra) + bool(uniform)


def apply_budget(args, fitness, per_sample: float, spent: float) -> None:
    """--time-budget: size the search and its held-out table (lpes_harness.search.budget), or refuse."""
    positions = sum(fitness.sizes.values()) // args.num_samples
    share = heldout_share(fitness)
    if math.isinf(args.time_budget_seconds):  # --time-budget auto
        args.time_budget_seconds = auto_budget(per_sample, spent)
        print(f"--time-budget auto: {args.time_budget_seconds / 60:.1f} min (at least {AUTO_FLOOR_SECONDS / 60:.0f}; "
              f"{AUTO_SAMPLE_TIMES} samples at {per_sample:.2f} s after {spent:.0f} s of start-up)", flush=True)
    try:
        chosen = plan(args.time_budget_seconds, per_sample, positions=positions, search_samples=args.num_samples,
                      sweep_points=len(args.sweep_values) + len(args.base_sweep_values),
                      heldout_rows=heldout_rows(args), overhead_seconds=spent,
                      racing_saving=(RANDOM_DRAW_SAVING if args.initial == "random" else RACING_SAVING)[args.sample_order]
                      if args.racing else 0.0, initial=args.initial, chunk_size=args.chunk_size if args.racing else None,
                      heldout_share=share, heldout_samples=args.heldout_samples_asked,
                      tuning=bool(args.uniform_tuning), validation_forwards=validation_forwards(args, positions),
                      lines=len(args.line_values))
    except BudgetTooSmall as err:
        fail(f"--time-budget {args.time_budget}: {err}")
    for name in ("population", "parents", "mutants", "crossovers", "generations"):
        setattr(args, name, getattr(chosen, name))
    args.heldout_samples = chosen.heldout_samples  # per position of every condition: pooled, the power asked for
    # Not flags: a resume restores the time limit's own state instead.
    args.heldout_forwards = chosen.heldout_rows * positions * chosen.heldout_samples + chosen.validation_forwards
    args.seconds_per_sample = per_sample
    args.heldout_share = share
    print(chosen.describe(positions), flush=True)


def time_limit(args, launched: float, saved_state: dict | None) -> list:
    """--time-budget's stop (a :class:`TimeLimitCallback`, first in the list so that the checkpoint saves its
    latest state): the budget less what the run has spent so far (load, timing, sweep), the held-out
    table's time set aside; on a resume, what the checkpoint kept (nothing: a run made before it existed)."""
    if not args.time_budget_seconds:
        return []
    if saved_state is not None:  # a resume: the checkpoint's state
        if TimeLimitCallback.__name__ not in (saved_state.get("callbacks") or {}):
            return []
        return [TimeLimitCallback(None)]
    limit = TimeLimitCallback(launched + args.time_budget_seconds - time.perf_counter(), after_forwards=args.heldout_forwards,
                              seconds_per_forward=args.seconds_per_sample, margin=HELDOUT_MARGIN * args.heldout_share,
                              matched=1.0 if args.uniform_tuning else 0.0)
    after = "the uniform factors as much time again and what follows its time" if limit.matched else "the held-out table its time"
    print(f"the search stops by {max(0.0, limit.seconds_left()) / (1 + limit.matched) / 60:.1f} min from now, leaving "
          f"{after} (the time budget's deadline)", flush=True)
    return [limit]


class StageDeadline:
    """``--time-budget`` for a search stage that runs in chunks (the gradient search's steps, the race's rungs): a
    chunk starts only if it, the uniform factors' share of the stage's time with it, and the validation can still
    end by the run's deadline."""

    def __init__(self, run, started: float):
        self.args, self.started = run.args, started
        self.deadline = run.launched + self.args.time_budget_seconds if self.args.time_budget_seconds else None
        self.validation = 0.0
        if self.deadline is not None and self.args.validation_samples:
            from lpes_harness.search.selection import gold_positions

            positions = gold_positions([run.configs[c.name] for c in run.conditions])
            self.validation = validation_forwards(self.args, positions) * time_one_sample(run.fitness)

    def allows(self, chunk_seconds: float) -> bool:
        """Whether a chunk of ``chunk_seconds`` may start now."""
        if self.deadline is None:
            return True
        now = time.perf_counter()
        spent = now - self.started + chunk_seconds  # the stage's time with the chunk
        after = self.args.uniform_share * spent * bool(self.args.uniform_tuning) + self.validation
        return now + chunk_seconds + after <= self.deadline


def print_stage_plan(args, fitness, spent: float, *, method: str, detail: str, search: tuple[str, str, float],
                     search_forwards: int, stops: str) -> None:
    """The cost of a run whose search stage is a chunked one (the gradient search, the race), printed before it
    runs: ``search`` (its name, what it does, its seconds timed by the stage), then the stages after it, timed
    from one fitness sample (``uniform.json`` on ``--uniform-share`` of ``search_forwards``, the validation,
    the held-out table). ``--time-budget auto`` is set from that sample as the GA's is; ``stops`` says where
    the stage stops when the estimate is over the budget. ``detail``: what the header says before the sample."""
    per_sample = time_one_sample(fitness)
    share = heldout_share(fitness) if (args.validation_samples or args.heldout_samples) else 1.0
    if args.time_budget_seconds and args.time_budget_seconds == float("inf"):
        args.time_budget_seconds = auto_budget(per_sample, spent)
    parts = [search]
    if args.uniform_tuning:
        uniform = math.ceil(args.uniform_share * search_forwards)
        parts.append(("uniform.json", f"{uniform} forwards", uniform * per_sample))
    positions = sum(fitness.sizes.values()) // args.num_samples
    if args.validation_samples:
        planned = validation_forwards(args, positions)
        how = ("one round of the candidates, chosen by accuracy" if samples_factor(args) == 1
               else "if two candidates go on to the most samples")
        parts.append(("the validation", f"{planned} forwards {how}", planned * per_sample * share))
    if args.heldout_samples:
        table = heldout_rows(args) * positions * args.heldout_samples
        parts.append(("the held-out table", f"{table} forwards", table * per_sample * share))
    total = spent + sum(seconds for *_, seconds in parts)
    print(f"cost estimate ({method}; {detail}a fitness sample {per_sample:.2f} s): "
          + "; then ".join(f"{name}, {what} = {duration(seconds)}" for name, what, seconds in parts)
          + f"; about {duration(total)} in all with the {duration(spent)} of start-up", flush=True)
    if args.time_budget_seconds and total > args.time_budget_seconds:
        print(f"--time-budget {duration(args.time_budget_seconds)}: {stops}", flush=True)
