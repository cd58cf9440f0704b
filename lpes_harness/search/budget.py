"""``lpes-search --time-budget 10m``: size a search and its held-out table to end in time.

On a 2-core CPU one forward is near the chip's limit, so the only way to a faster main job is
fewer forwards. The plan, from the seconds one sample takes (timed on the loaded model before
anything else runs):

1. **The held-out table first.** It must be able to show the gain it exists to show: enough
   paired samples that a gain of ``gain`` points (``discordant`` of the samples changing, most of
   them for the better) reaches exact McNemar p < ``alpha`` (:func:`heldout_samples_for`). Its
   rows (vanilla, the curve, and any extra) each score every one of those samples.
2. **Then the search** gets what is left: the sweep's points, and as many individuals as the
   forwards allow at the profile's samples per position, generation 0 being the population
   and each later one ``crossovers + mutants`` new individuals. What else runs after the search
   is set aside first: the validation's re-scoring, and with uniform tuning as many forwards
   again as the search used (each search forward is planned twice).

If the budget cannot hold that table and a search of at least one generation, the plan says so
before anything starts (:class:`BudgetTooSmall`), with the budget that would.

3. **A deadline for the search** (``search_deadline_seconds``, from the command's start): the budget
   less the held-out table's time, planned with a margin (:data:`HELDOUT_MARGIN`). The search stops
   there whatever it planned (:class:`~lpes_harness.search.callbacks.TimeLimitCallback`, which times
   the table at the search's own seconds a forward once it has some). A random
   search plans as many draws as could fit if every draw stopped after one racing chunk, and the
   deadline decides how many it makes: a draw that wrecks the model costs a chunk, a good one its
   whole fitness, and how many of each come is not known in advance.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from lpes_harness.evaluation.stats import mcnemar_exact
from lpes_harness.core.models import cpu_kind

# A +10-point gain with 3 % of samples lost: the rate of the demo's curves (4 to 7 lost in 200).
DEFAULT_GAIN, DEFAULT_LOST, DEFAULT_ALPHA = 0.10, 0.03, 0.01

# The share of an individual's search samples that racing is planned to save, by sample order. Measured
# on one demo search (GA seed 1 of results/search_efficiency, 31 evaluations, 1,240 forwards unraced):
# the roles order used 1,072 (13.5 % saved), the hardest order 756 (39 %; benchmarks/sample_order.py).
# Each is planned a little under what was measured: a plan that runs short is better than one that runs over.
RACING_SAVING = {"roles": 0.10, "hardest": 0.30}
# The same for a random search (--initial random): most random draws wreck the model, and racing against
# the start's fitness stops them after one chunk. Measured on the sweep-random runs of
# results/search_efficiency at 300 forwards (seeds 1-3, roles order): 58 draws in 692 forwards, 11.9
# a draw of 40 (70 % saved; the worst seed 16.0, 60 %); the demo's three runs (hardest order, AVX2-only CPU,
# results/demo_random_avx2): 48 draws in 444 forwards, 9.3 a draw (77 %); the demo's three runs on the
# avx512 CPU (hardest order, results/demo_avx512_noamx): 41, 33 and 32 draws in 284, 276 and 276 forwards
# (78-83 %). Planned, by sample order, a little under the worst run of each.
RANDOM_DRAW_SAVING = {"roles": 0.60, "hardest": 0.75}
# The held-out table's time is planned at this many times its forwards, at the start-up timing here and at
# the search's own seconds a forward in TimeLimitCallback. On the AVX2-only CPU the demo's tables ran at 0.99
# to 1.12 times the start-up timing (results/demo_random_avx2) and at 1.02 to 1.15 times the search's rate
# (1.03 to 1.06 in results/demo_deadline_avx2).
HELDOUT_MARGIN = 1.15
# A random search draws its genomes ahead, this many times as many as fit at the start-up timing if each stopped
# after one chunk: the deadline, timed at the search's own rate, decides how many are made, and the draws must
# not run out first. The start-up timing of one sample erred high by up to 1.3x: 1.41-1.99 s against the
# search's own 1.53-1.61 s a forward on an AVX-512 CPU without AVX512-BF16 (results/demo_avx512_nobf16), where
# the 1.99 s run made all 60 of its draws and ended 195 s inside its 20 minutes. A draw costs nothing until made.
DRAW_HEADROOM = 2


# make demo's budget by machine kind: a forward's cost is the demo's time. Measured a sample: 0.27-0.42 s (AMX,
# bfloat16), 0.9-1.25 s (AVX512-BF16: float32 on an Intel Xeon, bfloat16 on an AMD EPYC), 1.5-1.8 s (float32 on an
# AVX-512 Xeon without AVX512-BF16, where 10 minutes held the table and no search), 1.65-1.9 s (float32,
# AVX2 only). AVX-512 alone does not make a forward fast; native bfloat16 marks the CPUs that were. With AMX,
# 5 minutes (results/demo_line_amx, seeds 0-2: the search and its table in 275-286 s, 392-424 search forwards, a
# random draw's curve each, +22.0 to +30.0): 3 minutes ended in 149-161 s, as issue #46 aimed, but the search then
# had 36-108 draw forwards and every seed kept the rising line it starts from (+17.3).
DEMO_BUDGET_AMX, DEMO_BUDGET_FAST = "5m", "10m"
# Other CPUs differ more than their flags say: an AMD EPYC of family 23 model 1 (AVX2 only) took 4.74 s a
# sample, 2.5 times the AVX2-only CPU above, and the 20 minutes it was given held its held-out table but no search, so make demo
# stopped with "give at least 33 min". There the budget is sized at start-up (AUTO): 20 minutes, or as many
# samples' time as 20 minutes hold at 2 s a sample where this CPU is slower (the AVX2-only demo timed 1.46-2.36 s
# a sample at start-up and found a per-layer curve on each of 3 seeds: results/demo_line_avx2).
AUTO = "auto"
AUTO_FLOOR_SECONDS, AUTO_SAMPLE_TIMES = 1200.0, 600  # the 20 minutes every other CPU had


def demo_budget(cuda: bool, cpuinfo: str | None = None) -> str:
    """``make demo``'s ``--time-budget``: 10 minutes on a GPU or a CPU with avx512_bf16, 5 with AMX, else
    ``auto`` (:func:`auto_budget`)."""
    if cuda:
        return DEMO_BUDGET_FAST
    return {"AMX": DEMO_BUDGET_AMX, "avx512_bf16 without AMX": DEMO_BUDGET_FAST}.get(cpu_kind(cpuinfo), AUTO)


def auto_budget(seconds_per_sample: float, spent: float) -> float:
    """``--time-budget auto`` in seconds, once a sample is timed: 20 minutes, or :data:`AUTO_SAMPLE_TIMES` samples'
    time after the ``spent`` start-up where that is more, so a slow CPU gets the forwards a 2 s CPU gets in 20."""
    return max(AUTO_FLOOR_SECONDS, spent + AUTO_SAMPLE_TIMES * seconds_per_sample)


class BudgetTooSmall(ValueError):
    """The budget holds no search with a held-out table that can show the gain."""


def parse_duration(text, flag: str = "--time-budget") -> float:
    """``600``, ``600s``, ``10m``, ``1.5h``, ``1h30m`` -> seconds (> 0); ``auto`` -> infinity, until the
    start-up timing sets it (:func:`auto_budget`; a resume keeps the checkpoint's deadline)."""
    value = str(text).strip().lower()
    if value == AUTO:
        return math.inf
    parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", value)
    if not value or parts is None or not any(parts.groups()):
        raise ValueError(f"{flag} {text!r}: give a duration such as 600, 600s, 10m, 1.5h or 1h30m, or auto")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in parts.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise ValueError(f"{flag} {text!r}: must be more than 0 seconds")
    return total


def heldout_samples_for(positions: int, gain: float = DEFAULT_GAIN, lost: float = DEFAULT_LOST,
                        alpha: float = DEFAULT_ALPHA) -> int:
    """Samples per position such that ``gain`` (a fraction) with ``lost`` of the samples lost and
    ``gain + lost`` gained reaches exact McNemar p < ``alpha`` on all positions pooled."""
    for per_position in range(1, 10_000):
        n = per_position * positions
        gained, lost_n = math.floor((gain + lost) * n), math.ceil(lost * n)
        if gained > lost_n and mcnemar_exact(gained, lost_n) < alpha:
            return per_position
    raise ValueError(f"no held-out size shows a gain of {gain} at p < {alpha}")


@dataclass(frozen=True)
class Plan:
    seconds_per_sample: float
    budget_seconds: float
    heldout_samples: int  # per position
    heldout_rows: int
    search_samples: int  # per position
    sweep_points: int
    population: int
    parents: int
    mutants: int
    crossovers: int
    generations: int
    initial: str = "mutants"  # "random": a random search, every individual a draw of generation 0
    search_deadline_seconds: float = math.inf  # from the command's start: the search stops there
    expected_individuals: int = 0  # what the forwards hold at the planned racing saving
    heldout_share: float = 1.0  # the held-out table's time per forward, against a whole prompt's (shared text)
    tuning: bool = False  # uniform factors tuned after the search on as many forwards as it used
    validation_forwards: int = 0  # the honest choice's re-scoring after the search, as planned
    lines: int = 0  # --lines: generation 0's individuals after the start, planned unraced as the sweep's points

    @property
    def individuals(self) -> int:
        return self.population + self.generations * (self.crossovers + self.mutants)

    def describe(self, positions: int) -> str:
        heldout = self.heldout_rows * positions * self.heldout_samples
        deadline = f"about {self.search_deadline_seconds / 60:.1f} min after the start"
        if self.initial == "random":
            what = (f"random draws raced against the best so far until {deadline} (about {self.expected_individuals} "
                    f"at the planned racing saving; at most {self.individuals - 1 - self.lines})")
        else:
            what = (f"{self.individuals} individuals (population {self.population}, {self.generations} generations "
                    f"of {self.crossovers} crossover + {self.mutants} mutants), stopped at {deadline} if still running")
        lines = f"{self.lines} line{'s' * (self.lines != 1)} + " if self.lines else ""
        search = (f"time budget {self.budget_seconds / 60:.1f} min at {self.seconds_per_sample:.2f} s a sample: "
                  f"search of {self.sweep_points} sweep points + {lines}{what}, on {self.search_samples} samples per position")
        if self.tuning:
            search += "; then uniform factors on as many forwards as the search used"
        if self.validation_forwards:
            search += f"; then the validation's choice ({self.validation_forwards} forwards planned)"
        if not self.heldout_samples:
            return f"{search}; no held-out table (--heldout-samples 0): the whole budget is the search's"
        table = (f"{search}; then a held-out table of {self.heldout_rows} rows x {self.heldout_samples} samples per "
                 f"position ({heldout} forwards, planned at {HELDOUT_MARGIN:g}x{self._share()})")
        powered = heldout_samples_for(positions)
        if self.heldout_samples < powered:
            return (f"{table}, as --heldout-samples asks: fewer than the {powered} a +{100 * DEFAULT_GAIN:.0f}-point "
                    f"gain needs to reach p < {DEFAULT_ALPHA}")
        return f"{table}, enough for a +{100 * DEFAULT_GAIN:.0f}-point gain to reach p < {DEFAULT_ALPHA}"

    def _share(self) -> str:
        if self.heldout_share >= 1:
            return ""
        return f" x {self.heldout_share:.2f}, as a sample's prompts at the gold positions share their text"

    def to_dict(self) -> dict:
        return {**asdict(self), "individuals": self.individuals}


def plan(budget_seconds: float, seconds_per_sample: float, *, positions: int, search_samples: int,
         sweep_points: int, heldout_rows: int = 2, overhead_seconds: float = 0.0, racing_saving: float = 0.0,
         initial: str = "mutants", chunk_size: int | None = None, heldout_share: float = 1.0,
         heldout_samples: int | None = None, tuning: bool = False, validation_forwards: int = 0,
         lines: int = 0) -> Plan:
    """The largest search that, with its held-out table, fits ``budget_seconds`` (see the module docstring).

    ``overhead_seconds``: what is spent before the plan starts (the model load). ``racing_saving``: the
    fraction of an individual's samples racing is expected to save (0: plan for the worst case).
    ``chunk_size``: the fewest forwards a raced individual costs (a random search's most draws).
    ``heldout_share``: a held-out forward's time against a search forward's (below 1 where the table's
    prompts share their text: :func:`lpes_harness.search.timing.heldout_share`). ``heldout_samples``: the
    held-out table's samples per position as the user asked them (``--heldout-samples``; 0: no table), kept
    whatever their power; None: the fewest that show the gain (:func:`heldout_samples_for`). ``tuning``: uniform
    factors are tuned after the search on as many forwards as it used (``--uniform-tuning``), so each search
    forward is planned twice. ``validation_forwards``: the validation's re-scoring after the search, planned
    at the table's margin and share. ``lines``: individuals scored right after the start (``--lines``), planned
    unraced as the sweep's points (a line worth trying is expected to beat the start, and then runs whole)."""
    heldout = heldout_samples_for(positions) if heldout_samples is None else heldout_samples
    heldout_forwards = heldout_rows * positions * heldout
    after_seconds = HELDOUT_MARGIN * heldout_share * (heldout_forwards + validation_forwards) * seconds_per_sample
    forwards = (budget_seconds - overhead_seconds - after_seconds) / seconds_per_sample
    runs = 2 if tuning else 1  # each search forward, and the tuning's as many again
    per_individual = positions * search_samples * (1 - racing_saving) * runs
    # The sweep's points are planned unraced: the first has no bound to race against, and each later
    # one races only the points before it, not a search's best.
    sweep_forwards = (sweep_points + lines) * positions * search_samples
    individuals = int((forwards - sweep_forwards) / per_individual)
    # The smallest search worth the name: 6 candidates beside the start (a population of 4 and one generation
    # of 2 children), the lines counted among them.
    if individuals + lines < 6:
        need = overhead_seconds + after_seconds + seconds_per_sample * (sweep_forwards + max(0, 6 - lines) * per_individual)
        if not heldout:
            holds = "no search of 6 individuals beside its sweep (and no held-out table, as --heldout-samples 0 asks)"
        else:
            why = (f"able to show a +{100 * DEFAULT_GAIN:.0f}-point gain at p < {DEFAULT_ALPHA}" if heldout_samples is None
                   else "of the size --heldout-samples asks")
            holds = (f"a held-out table {why} ({heldout_rows} rows x {heldout} samples per position at "
                     f"{seconds_per_sample:.2f} s a sample) but no search beside it")
        raise BudgetTooSmall(f"a time budget of {budget_seconds / 60:.1f} min holds {holds}; give at least "
                             f"{math.ceil(need / 60)} min")
    common = dict(seconds_per_sample=seconds_per_sample, budget_seconds=budget_seconds, heldout_samples=heldout,
                  heldout_rows=heldout_rows, search_samples=search_samples, sweep_points=sweep_points, initial=initial,
                  search_deadline_seconds=_search_deadline(budget_seconds, overhead_seconds + sweep_forwards * seconds_per_sample,
                                                           after_seconds, tuning),
                  expected_individuals=individuals,
                  heldout_share=heldout_share, tuning=tuning, validation_forwards=validation_forwards, lines=lines)
    if initial == "random":  # the start (the sweep's best, already scored) and a draw for every other individual
        # Drawn ahead (cheap), made until the deadline: DRAW_HEADROOM times as many as fit if each stopped
        # after one chunk.
        draws = individuals
        if chunk_size:
            draws = max(individuals, int(DRAW_HEADROOM * (forwards - sweep_forwards) / (chunk_size * runs)))
        # Generation 0 is the start, the lines, then the draws (GeneticSearch): the lines count among its mutants.
        return Plan(**common, population=draws + lines + 1, parents=1, mutants=draws + lines, crossovers=0,
                    generations=0)
    drawn = max(4, min(12, individuals // 3))  # generation 0 beside the lines
    children = max(2, min(drawn - 2, 7))  # at least 2 parents: a crossover needs two
    crossovers = 1
    mutants = children - crossovers
    population = drawn + lines
    parents = population - children
    generations = max(1, (individuals - drawn) // children)
    return Plan(**common, population=population, parents=parents, mutants=mutants, crossovers=crossovers,
                generations=generations)


def _search_deadline(budget_seconds: float, before_seconds: float, after_seconds: float, tuning: bool) -> float:
    """When the search must stop, from the command's start: what comes after it set aside, and with uniform
    tuning (as many forwards as the search) half of what is left between the load and sweep and that."""
    if not tuning:
        return budget_seconds - after_seconds
    return before_seconds + (budget_seconds - before_seconds - after_seconds) / 2
