"""``lpes-compare``'s run: every method tuned on one budget of forwards, then all scored on the same held-out samples.

Stages, each resumable (``compare.json`` is the journal; every score lives in a score cache, so a killed
run replays what it had and scores only what it lacked):

1. **plan**: one search sample of each condition timed for the plain model and for each method (its first
   setting), the held-out size chosen (``--heldout-samples``, or what 35 % of the budget holds) and every
   method given the same tuning forwards, so that tuning, held-out table and latency fit ``--budget``;
2. **tune**: each method's candidates (:mod:`.compare_methods`) raced by successive halving on the
   search split (:mod:`.method_racing`), every method on the same forwards;
3. **held-out**: vanilla and each method's winner on the held-out split of every condition;
4. **latency**: one prefill forward of one held-out prompt through each row's lm-eval model, timed in
   this run on this machine;
5. the board (:mod:`lpes_harness.evaluation.compare_board`).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from lpes_harness.core.files import atomic_write_json, read_json_or_none
from lpes_harness.core.models import config_layer_types
from lpes_harness.evaluation.baseline_rows import BaselineLoader
from lpes_harness.evaluation.conditions import Condition, apply_chat_template, slug
from lpes_harness.evaluation.paired import cache_identity, sample_bar, score_rows
from lpes_harness.evaluation.score_cache import ScoreCache
from lpes_harness.methods import METHODS, rope_entry, stack_key
from lpes_harness.methods.setup import MethodSetup
from lpes_harness.search.compare_methods import NotRun, Setting, authors_setting, line_family, settings_of
from lpes_harness.search.method_racing import RacePlan, plan_race, run_race

JOURNAL = "compare.json"
HELDOUT_SHARE = 0.35  # of the budget left after start-up, when --heldout-samples is auto
MAX_HELDOUT = 100  # samples per position per condition that auto chooses at most
MARGIN = 0.9  # the plan spends 90 % of what is left: loads and tqdm are not in the timing
LATENCY_REPEATS = 3


@dataclass
class CompareArgs:
    """A compare's settings, as the command checked them."""

    pretrained: str | None
    task: str
    conditions: list[Condition]
    methods: list[str]
    budget: float  # seconds
    heldout_samples: int | None  # per position per condition; None: auto
    seed: int
    dtype: str
    draws: int
    output: Path
    command: str
    moice_gates: str | None = None
    poshidden_setting: str | None = None
    tuning_forwards: int | None = None  # per method; None: what the budget holds
    stacks: bool = False  # rows of the LPES winner under each stacking method's winner
    authors_defaults: tuple[str, ...] = ()  # the methods that also get a row at their authors' defaults

    def record(self) -> dict:
        """What a resume must find unchanged (``stacks`` and ``authors_defaults`` only when set: a compare
        journalled before the flag existed resumes as it was)."""
        return {"pretrained": self.pretrained, "task": self.task, "conditions": [c.to_dict() for c in self.conditions],
                "methods": self.methods, "budget": self.budget, "heldout_samples": self.heldout_samples,
                "seed": self.seed, "dtype": self.dtype, "draws": self.draws, "moice_gates": self.moice_gates,
                "poshidden_setting": self.poshidden_setting, "tuning_forwards": self.tuning_forwards,
                **({"stacks": True} if self.stacks else {}),
                **({"authors_defaults": list(self.authors_defaults)} if self.authors_defaults else {})}

    def stacked_methods(self) -> list[str]:
        """The methods whose winner gets the LPES winner under it (``--stacks``): those that stack, when LPES runs."""
        if not self.stacks or "lpes" not in self.methods:
            return []
        return [m for m in self.methods if m != "lpes" and METHODS[m].stacks_with_lpes]

    def defaulted_methods(self) -> list[str]:
        """The methods of the run that get a row at their authors' defaults (``--authors-defaults``)."""
        return [m for m in self.methods if m in self.authors_defaults]


def check_resumable(args: CompareArgs) -> dict | None:
    """The journal of an earlier run of the same settings in ``--output`` (None: a fresh start); a ValueError
    (one line, before the model loads) where the folder holds another compare."""
    journal = read_json_or_none(args.output / JOURNAL)
    if journal is None:
        return None
    if journal.get("settings") != json.loads(json.dumps(args.record())):
        changed = sorted(k for k, v in args.record().items() if json.loads(json.dumps(v)) != journal["settings"].get(k))
        raise ValueError(f"--output {args.output} holds a compare of other settings ({', '.join(changed)} differ): "
                         f"run the same command to resume it, or choose another --output")
    return journal


@dataclass
class Compare:
    args: CompareArgs
    lm: object  # the loaded lpes_hf, scaling both
    journal: dict = field(default_factory=dict)

    def __post_init__(self):
        self.loader = BaselineLoader(self.args.pretrained, self.args.dtype)
        self.num_layers = len(self.lm.scales) // 2
        self._caches: dict = {}
        self._scorers: dict = {}
        if not self.journal:
            self.journal = {"settings": json.loads(json.dumps(self.args.record())), "started": time.time()}

    # ------------------------------------------------------------------ plumbing

    def save(self) -> None:
        self.args.output.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.args.output / JOURNAL, self.journal, indent=1)

    def cache(self, split: str, condition: Condition) -> ScoreCache:
        key = (split, condition.name)
        if key not in self._caches:
            identity = {**cache_identity(condition.task, condition.metadata, condition.chat_template,
                                         self.args.pretrained, self.args.dtype, "both"), "split": split}
            folder = self.args.output / ("tuning" if split == "search" else "heldout") / slug(condition.name)
            folder.mkdir(parents=True, exist_ok=True)
            self._caches[key] = ScoreCache(folder / "scores.cache.json", identity)
        return self._caches[key]

    def scorer(self, split: str, condition: Condition):
        """One scorer per split and condition, its task loaded once for the most samples the run scores there
        (building one loads the task: seconds, which a race would pay at every candidate and rung)."""
        from lpes_harness.lmeval.position_scorer import PositionScorer
        from lpes_harness.tasks.position import resolve_task

        most = self.most_samples(split)
        key = (split, condition.name, most)
        if key not in self._scorers:
            chat = apply_chat_template(condition.chat_template)
            self._scorers[key] = PositionScorer(self.lm, condition.task, list(resolve_task(condition.task).positions),
                                                metadata=condition.metadata, split=split, num_samples=most,
                                                chat_template=chat)
        return self._scorers[key]

    def most_samples(self, split: str) -> int:
        plan = self.journal.get("plan")
        if plan is None:  # the timing, before the plan: the first sample only
            return 1
        if split == "search":
            return max(race["rungs"][-1][1] for race in plan["races"].values())
        return plan["heldout_samples"]

    def score(self, setups: dict, split: str, n: int, progress=None, cached: bool = True) -> dict:
        """``{row: {condition: {percent: [n scores]}}}`` on the first ``n`` samples of each block."""
        out: dict = {name: {} for name in setups}
        for condition in self.args.conditions:
            scored = score_rows(self.scorer(split, condition), setups, n, progress=progress, load_baseline=self.loader,
                                cache=self.cache(split, condition) if cached else None)
            for name in setups:
                out[name][condition.name] = {int(p): list(v[:n]) for p, v in scored[name].items()}
        return out

    def vanilla(self) -> MethodSetup:
        return MethodSetup.of_scales([1.0] * (2 * self.num_layers))

    def settings(self, method: str) -> list[Setting]:
        """The method's candidates: the plan's, once there is one (a resume races what the run planned, whatever
        the table's grids have become since), else the table's."""
        planned = self.journal.get("plan", {}).get("candidates", {}).get(method)
        if planned is not None:
            return [Setting.from_dict(saved) for saved in planned]
        return settings_of(method, self.num_layers, draws=self.args.draws, seed=self.args.seed,
                           moice_gates=self.args.moice_gates, poshidden_setting=self.args.poshidden_setting,
                           lines=line_family(self.args.pretrained, self.lm.device, self.args.dtype),
                           layer_types=config_layer_types(self.lm.model.config))

    def blocks(self) -> int:
        from lpes_harness.tasks.position import resolve_task

        return sum(len(resolve_task(c.task).positions) for c in self.args.conditions)

    # ------------------------------------------------------------------ 1. plan

    def seconds_per_forward(self, setup: MethodSetup) -> float:
        """One search sample at every gold position of every condition, timed (no cache: nothing is kept)."""
        started = time.perf_counter()
        self.score({"timed": setup}, "search", 1, cached=False)
        return (time.perf_counter() - started) / self.blocks()

    def plan(self, launched: float) -> dict:
        """The journal's plan, made once: a resumed run keeps it (so its races are the same)."""
        from lpes_harness.tasks.position import resolve_task, search_split_size

        if "plan" in self.journal:
            return self.journal["plan"]
        self.seconds_per_forward(self.vanilla())  # the first forward of a process pays one-off set-up
        costs, skipped = {"vanilla": self.seconds_per_forward(self.vanilla())}, {}
        candidates = {}
        for method in self.args.methods:
            try:
                candidates[method] = self.settings(method)
            except NotRun as why:
                skipped[method] = str(why)
                continue
            first = candidates[method][0].setup
            if first.is_scaled:  # the loaded lpes_hf: the plain model's time
                costs[method] = costs["vanilla"]
                continue
            started = time.perf_counter()  # a load is no forward: timed apart, and planned twice (tune, held-out)
            self.loader(first)
            costs[f"{method} load"] = time.perf_counter() - started
            costs[method] = self.seconds_per_forward(first)  # the loader installs the same setting again: no load
        blocks, methods = self.blocks(), list(candidates)
        loads = 2 * sum(v for k, v in costs.items() if k.endswith(" load"))
        left = MARGIN * (self.args.budget - (time.time() - launched)) - loads
        # A stack's forward costs its method's (the curve under it changes no shape), and is no tuning.
        stacks = [m for m in self.args.stacked_methods() if m in methods]
        # A row at the authors' defaults is timed as the method's first setting: close enough to plan with.
        defaults = [m for m in self.args.defaulted_methods() if m in methods]
        per_row = costs["vanilla"] + sum(costs[m] for m in methods + stacks + defaults)  # one sample of every row in one block
        latency = (LATENCY_REPEATS + 1) * per_row  # a prefill is about one sample's forward
        heldout = self.args.heldout_samples
        if heldout is None:
            heldout = max(1, min(MAX_HELDOUT, math.floor(HELDOUT_SHARE * left / (per_row * blocks))))
        tuning = self.args.tuning_forwards or math.floor(
            (left - latency - heldout * blocks * per_row) / max(sum(costs[m] for m in methods), 1e-9))
        need = 2 * blocks  # two settings of a method on one sample of each block: the least race
        if tuning < need:
            raise ValueError(f"--budget {self.args.budget:.0f} s holds {max(tuning, 0)} tuning forwards a method after "
                             f"{heldout} held-out samples per position; a race needs at least {need}: give a larger "
                             f"--budget, fewer --heldout-samples or fewer --methods")
        most = min(search_split_size(resolve_task(c.task), c.metadata) for c in self.args.conditions)
        races = equal_races({m: len(candidates[m]) for m in methods}, tuning, blocks, self.args.seed, most)
        spent = sum(race["forwards"] * costs[m] for m, race in races.items())
        tuning = max(race["forwards"] for race in races.values())
        if self.args.heldout_samples is None and self.args.tuning_forwards is None:
            # What equal races could not spend goes to the held-out table: more samples for every row.
            unspent = left - latency - heldout * blocks * per_row - spent
            heldout = min(MAX_HELDOUT, heldout + max(0, math.floor(unspent / (per_row * blocks))))
        self.journal["plan"] = {
            "seconds_per_forward": costs, "heldout_samples": heldout, "tuning_forwards": tuning, "blocks": blocks,
            "races": races, "skipped": skipped, "estimate_seconds": round(
                time.time() - launched + loads + latency + heldout * blocks * per_row + spent, 1),
            "candidates": {m: [s.to_dict() for s in candidates[m]] for m in methods},
            "stacks": stacks, **({"authors_defaults": defaults} if defaults else {}),
        }  # fmt: skip
        return self.journal["plan"]

    # ------------------------------------------------------------------ 2. tune

    def tune(self, method: str) -> dict:
        """``method``'s race on the search split; the winner and every entry, kept in the journal."""
        tuned = self.journal.setdefault("tuned", {})
        settings = self.settings(method)
        saved = RacePlan.from_dict(self.journal["plan"]["races"][method])

        def score(index: int, n: int) -> dict:
            scored = self.score({settings[index].text: settings[index].setup}, "search", n, progress)
            return {f"{c}@{p}": v for c, by in scored[settings[index].text].items() for p, v in by.items()}

        # The bar counts what each rung reports, a survivor's earlier samples (cached) again.
        with sample_bar(sum(alive * seen for alive, seen in saved.rungs) * saved.blocks) as bar:
            def progress(name, percent, count):
                bar(method, percent, count)

            winner, entries = run_race(saved, score)
        setting = settings[winner.index]
        tuned[method] = {"winner": winner.index, "setting": setting.to_dict(), "forwards": saved.forwards,
                         "candidates": len(settings), "raced": len(saved.kept),
                         "accuracy": winner.accuracy(saved.rungs[-1][1]), "entries": [e.to_dict() for e in entries]}
        self.save()
        return tuned[method]

    # ------------------------------------------------------------------ 3. held-out, 4. latency

    def rows(self) -> dict[str, tuple[tuple[str, ...], str, Setting]]:
        """Row name -> (the compare's methods it took its setting from, the table's entry it is, the setting):
        vanilla (none), then each tuned method's winner, named for what it holds (a PI winner of either scaling
        is PI), then each stack (``--stacks``: both halves' winners, ``lpes`` and the method), then each tuned method
        at its authors' defaults (``--authors-defaults``: no tuning, so no method it took a setting from)."""
        rows = {"vanilla": ((), "vanilla", Setting(self.vanilla(), "the plain model"))}
        for method, tuned in self.journal.get("tuned", {}).items():
            setting = self.settings(method)[tuned["winner"]]
            if setting.setup.is_scaled:
                entry = rope_entry(setting.setup.scales, "both")
                key = entry.name if entry is not None else "vanilla"
            else:
                key = method
            rows["LPES lines" if method == "lpes" else f"{METHODS[method].label} tuned"] = ((method,), key, setting)
        for method in self.args.stacked_methods():
            if method in self.journal.get("tuned", {}) and "lpes" in self.journal["tuned"]:
                rows[f"LPES lines + {METHODS[method].label} tuned"] = (("lpes", method), stack_key(method),
                                                                      self.stack_setting(method))
        for method in self.args.defaulted_methods():
            if method in self.journal.get("tuned", {}):
                setting = authors_setting(method, moice_gates=self.args.moice_gates,
                                          poshidden_setting=self.args.poshidden_setting)
                rows[f"{METHODS[method].label} authors' defaults"] = ((), method, setting)
        return rows

    def stack_setting(self, method: str) -> Setting:
        """The LPES winner's curve under ``method``'s winner, both as tuned alone: no forward of tuning of its
        own (the row is what the two tuned halves give together, not a stack tuned as one)."""
        tuned = self.journal["tuned"]
        curve = self.settings("lpes")[tuned["lpes"]["winner"]]
        alone = self.settings(method)[tuned[method]["winner"]]
        scales = ";".join(repr(float(v)) for v in curve.setup.scales)
        args = ",".join(part for part in (alone.setup.args, f"lpes_scales={scales}", "lpes_scaling=both") if part)
        return Setting(MethodSetup(alone.setup.model, args), f"{alone.text} on the LPES lines ({curve.text})")

    def heldout(self) -> dict:
        rows, n = self.rows(), self.journal["plan"]["heldout_samples"]
        total = n * self.journal["plan"]["blocks"] * len(rows)
        with sample_bar(total) as progress:
            return self.score({name: s.setup for name, (_, _, s) in rows.items()}, "heldout", n, progress)

    def latency(self) -> dict:
        """Median seconds of one prefill forward of the first held-out prompt (the first condition's middle
        gold position) through each row's lm-eval model."""
        import torch

        if "latency" in self.journal:
            return self.journal["latency"]
        condition = self.args.conditions[0]
        scorer = self.scorer("heldout", condition)
        percents = list(scorer.docs)
        percent = percents[len(percents) // 2]
        prompt = scorer.prompt(scorer.tasks[percent], scorer.docs[percent][0])
        ids = torch.tensor([self.lm.tok_encode(prompt)], device=self.lm.device)
        timings = {}
        for name, (_, _, setting) in self.rows().items():
            lm = self.lm
            if setting.setup.is_scaled:
                self.lm.set_scales(list(setting.setup.scales))
            else:
                lm = self.loader(setting.setup)
            times = []
            with torch.inference_mode():
                for _ in range(LATENCY_REPEATS + 1):  # the first is a warm-up
                    started = time.perf_counter()
                    lm._model_call(ids)
                    times.append(time.perf_counter() - started)
            timings[name] = statistics.median(times[1:])
        self.lm.set_scales(list(self.vanilla().scales))
        self.journal["latency"] = {"seconds": timings, "tokens": int(ids.shape[1]), "condition": condition.name,
                                   "percent": percent}
        self.save()
        return self.journal["latency"]


def equal_races(counts: dict, budget: int, blocks: int, seed: int, most: int) -> dict:
    """Each method's race (``counts``: its candidates) on the same forwards, to within 10 %: a race spends up to
    one sample a block per finalist less than its budget (a capped one less still), so the budget comes down to
    the least any race spends until every race is within 10 % of the others."""
    for _ in range(20):
        races = {m: plan_race(count, budget, blocks, seed, most) for m, count in counts.items()}
        spent = [race.forwards for race in races.values()]
        if max(spent) <= 1.1 * min(spent) or min(spent) == budget:
            break
        budget = min(spent)
    return {m: race.to_dict() for m, race in races.items()}


def board_rows(compare: Compare, heldout: dict, latency: dict) -> list[dict]:
    """The board's input rows (:func:`lpes_harness.evaluation.compare_board.build_board`)."""
    tuned, out = compare.journal.get("tuned", {}), []
    for name, (halves, key, setting) in compare.rows().items():  # a stack counts both halves' races
        out.append({"name": name, "method": key, "setting": setting.text, "scores": heldout[name],
                    "tuning_forwards": sum(tuned[half]["forwards"] for half in halves),
                    "candidates": sum(tuned[half]["raced"] for half in halves),
                    "latency": latency["seconds"].get(name)})
    return out


def resolution(paired: int) -> str:
    """What a row's ``paired`` held-out samples can show against vanilla (exact McNemar, p < 0.05)."""
    from lpes_harness.evaluation.stats import smallest_significant_gain

    least = smallest_significant_gain(paired)
    if least is None:
        return f"{paired} paired samples a row: no difference from vanilla can reach p < 0.05; give a larger --budget"
    return (f"{paired} paired samples a row: no difference from vanilla under {100 * least:.0f} points can reach "
            f"p < 0.05" + ("; a larger --budget, or fewer --methods, resolves more" if least > 0.1 else ""))


def describe_plan(plan: dict, methods: Sequence[str]) -> list[str]:
    """The plan in a few lines, for the start of a run and ``--estimate``."""
    from lpes_harness.search.timing import duration

    costs = plan["seconds_per_forward"]
    lines = [f"a forward: {costs['vanilla']:.2f} s for the plain model; "
             + ", ".join(f"{m} {costs[m]:.2f} s" for m in methods if m in costs and m != "vanilla"),
             f"tuning: {plan['tuning_forwards']} forwards for each of {len(plan['races'])} methods, raced over "
             f"{plan['blocks']} blocks (conditions x gold positions)"]
    for method, race in plan["races"].items():
        rungs = " -> ".join(f"{a} on {s}" for a, s in race["rungs"])
        lines.append(f"  {method}: {len(race['kept'])} settings ({rungs} samples a block), {race['forwards']} forwards")
    stacks = plan.get("stacks", [])
    if stacks:
        lines.append(f"stacks: the LPES winner under the winner of {', '.join(stacks)} (held-out forwards only)")
    defaults = plan.get("authors_defaults", [])
    if defaults:
        lines.append(f"authors' defaults: {', '.join(defaults)} untuned beside their winners (held-out forwards only)")
    lines.append(f"held-out: {plan['heldout_samples']} samples per position per condition, "
                 f"{len(plan['races']) + 1 + len(stacks) + len(defaults)} rows; about "
                 f"{duration(plan['estimate_seconds'])} in all")
    lines.append(f"  {resolution(plan['heldout_samples'] * plan['blocks'])}")
    lines += [f"not run: {m}: {why}" for m, why in plan["skipped"].items()]
    return lines
