"""Tuning a baseline on the *search* split with LPES's own fitness: the grid, the scoring, the ranking, the outputs.

A baseline run only at its authors' settings is not given the chance LPES gets (its curve is
chosen on the search split, judged on the held-out one). Here every candidate setting of a grid
(:func:`expand_grid`: the Cartesian product of the grid, plus the fixed arguments) is scored on
the search samples through :func:`lpes_harness.evaluation.paired.score_methods`, ranked by the
search's weighted fitness (0.2·begin + 0.3·middle + 0.5·end over the task's roles,
:func:`evaluate`), and the winner written as a row spec for the held-out table
(:func:`write_outputs`: ``tuning.json``, ``tuning.md``, ``best.txt``). PI is tuned the same way,
as uniform scales on the loaded ``lpes_hf`` (:func:`score_uniform`).

The command is ``python -m lpes_harness.commands.tune``.
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.evaluation.baseline_rows import BaselineLoader
from lpes_harness.evaluation.conditions import apply_chat_template
from lpes_harness.evaluation.paired import lpes_methods, sample_bar, score_methods
from lpes_harness.methods.setup import MethodSetup
from lpes_harness.search.fitness import DEFAULT_WEIGHTS, ROLES, combine

SPLIT = "search"  # every candidate is scored where LPES chooses its curve; the held-out split judges both


class Refused(Exception):
    """A candidate the baseline's own argument checks refused: skipped with a note, not a crash."""


# ----------------------------------------------------------------------------- the grid


def format_value(value) -> str:
    """A grid value as it goes into ``k=v,k=v`` (lm-eval's ``--model_args`` form)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):  # e.g. bases: lists are ';'-joined, as the methods read them
        return ";".join(format_value(v) for v in value)
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same number (1.05, not 1.0500000000000000444)
    if isinstance(value, (int, str)):
        text = str(value)
        if "," in text or not text.strip():
            raise ValueError(f"value {value!r}: a value cannot be empty or hold ',' (lists take ';' between items)")
        return text
    raise ValueError(f"value {value!r} is not a number, string, boolean or list")


def parse_grid(text: str) -> dict[str, list[str]]:
    """``--grid`` JSON -> {argument: [value text, ...]}; duplicates within a list dropped."""
    try:
        grid = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--grid is not valid JSON ({err.msg} at character {err.pos})") from None
    if not isinstance(grid, dict) or not grid:
        raise ValueError("--grid must be a non-empty JSON object of argument -> list of values")
    parsed = {}
    for name, values in grid.items():
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ValueError(f"--grid {name!r} has no values")
        try:
            parsed[name] = list(dict.fromkeys(format_value(v) for v in values))
        except ValueError as err:
            raise ValueError(f"--grid {name!r}: {err}") from None
    return parsed


def parse_fixed(text: str) -> dict[str, str]:
    """``k=v,k=v`` -> {k: v}: the arguments every candidate shares."""
    fixed = {}
    for part in (p.strip() for p in str(text or "").split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"--fixed {text!r}: give k=v pairs separated by ','")
        fixed[name.strip()] = value.strip()
    return fixed


def expand_grid(grid: Mapping[str, Sequence[str]], fixed: Mapping[str, str] | None = None) -> list[str]:
    """Every candidate's argument string: the fixed arguments, then one value per grid argument
    (the Cartesian product, in grid order, so ties go to the earlier candidate)."""
    fixed = dict(fixed or {})
    both = sorted(set(fixed) & set(grid))
    if both:
        raise ValueError(f"{both} given both in --fixed (or the --baseline spec) and in --grid")
    head = [f"{k}={v}" for k, v in fixed.items()]
    return [",".join(head + [f"{k}={v}" for k, v in zip(grid, combo)]) for combo in itertools.product(*grid.values())]


def accepted_arguments(model: str) -> set[str]:
    """The argument names ``model``'s class and its parents declare, down the ``**kwargs`` chain.

    HFLM's own catch-all ``**kwargs`` (handed on to transformers' ``from_pretrained``) is not
    counted: a grid is over a method's settings, and a misspelt one would otherwise run the
    defaults at every candidate, silently, for hours.
    """
    from lm_eval.api.registry import get_model

    names: set[str] = set()
    for klass in inspect.getmro(get_model(model)):
        init = vars(klass).get("__init__")
        if init is None or klass is object:
            continue
        params = inspect.signature(init).parameters.values()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break  # nothing further up receives unnamed arguments
    return names


def check_argument_names(model: str, names) -> None:
    known = accepted_arguments(model)
    unknown = sorted(set(names) - known)
    if unknown:
        own = sorted(known - accepted_arguments("hf")) or sorted(known)
        raise ValueError(f"{model} takes no argument {', '.join(map(repr, unknown))}; its own are {', '.join(own)} "
                         f"(and lm-eval's HFLM arguments)")


# ----------------------------------------------------------------------------- fitness


def position_accuracy(scores: Mapping) -> dict[str, float]:
    """Mean score at each gold position."""
    return {str(p): sum(v) / len(v) for p, v in scores.items() if v}


def role_scores(scores: Mapping, roles: Mapping[str, Sequence[int]]) -> dict[str, float]:
    """Each role's mean over its positions' samples pooled, as the search's fitness pools them
    (multi_needle's middle is 25, 50 and 75 %)."""
    by_percent = {int(p): v for p, v in scores.items()}
    means = {}
    for role in ROLES:
        pooled = [s for p in roles[role] for s in by_percent[int(p)]]
        means[role] = sum(pooled) / len(pooled)
    return means


def evaluate(scores: Mapping, roles: Mapping[str, Sequence[int]], weights=DEFAULT_WEIGHTS) -> dict:
    """A candidate's accuracy by position, role means and fitness (the search's ``weighted`` objective)."""
    means = role_scores(scores, roles)
    return {"accuracy": position_accuracy(scores), "roles": means, "fitness": combine(means, weights, "weighted"),
            "forwards": sum(len(v) for v in scores.values())}


def ranked(candidates: Sequence[Mapping]) -> list[Mapping]:
    """Scored candidates, best first: fitness, then mean accuracy over all positions, then grid order."""
    scored = [c for c in candidates if "fitness" in c]

    def mean(c):
        return sum(c["accuracy"].values()) / len(c["accuracy"])

    # Rounded: the same counts reached by different sums (0.2 + 0.3 * 0.4 + 0.5 against 0.2 * 0.95 +
    # 0.3 * 0.5167 + 0.5 * 0.95) differ in the last bits, and a tie must go to the next rule, not to rounding.
    return sorted(scored, key=lambda c: (-round(c["fitness"], 9), -round(mean(c), 9), c["index"]))


# ----------------------------------------------------------------------------- scoring


def score_uniform(lm, values: Sequence[float], score, progress, held_layers: Sequence[int] = ()) -> tuple[dict, list[dict]]:
    """Vanilla and each uniform scale, all through the loaded lpes_hf, in one pass over the samples.
    ``held_layers`` (``--layer-type``'s other layers) stay at 1, as in the search's sweep."""
    n = len(lm.scales)
    labels = {f"uniform {v:g}": v for v in values}
    rows = {name: row for name, row in lpes_methods([1.0] * n, values, held_layers).items() if name.startswith("uniform ")}
    scored = score(lm, {"vanilla": MethodSetup.of_scales([1.0] * n), **rows}, progress=progress)
    candidates = [{"index": i, "args": f"{v:g}", "scores": scored["scores"][label]}
                  for i, (label, v) in enumerate(labels.items())]
    return scored["scores"]["vanilla"], candidates


def score_baseline(lm, model: str, arg_strings: Sequence[str], score, progress, load, per_candidate: int):
    """Vanilla (the reference row), then each candidate as a baseline model, one loaded at a time.

    One ``score_methods`` call per candidate, so that a candidate its own checks refuse (they
    run when it loads, before the weights are read) is skipped without losing the others.
    """
    n = len(lm.scales)
    vanilla = score(lm, {"vanilla": MethodSetup.of_scales([1.0] * n)}, progress=progress)["scores"]["vanilla"]
    candidates = []
    for i, args in enumerate(arg_strings):
        setup = MethodSetup(model, args)
        record = {"index": i, "args": args, "spec": setup.spec}
        try:
            scored = score(lm, {args: setup}, load_baseline=load, progress=progress)
            record["scores"] = scored["scores"][args]
        except Refused as err:
            record["refused"] = str(err)
            progress(f"{args} (refused)", 0, per_candidate)  # the bar counted its samples
        candidates.append(record)
    return vanilla, candidates


def run_tuning(lm, plan: Mapping, roles: Mapping[str, Sequence[int]], cache, *, chat_template: str, pretrained,
               dtype: str) -> dict:
    """Vanilla and every candidate of ``plan`` (the command's checked flags: its task, samples, metadata and
    ``values`` for PI or ``arg_strings`` for a baseline) scored on the search samples, kept in ``cache``;
    returns :func:`summarise`'s result. A ValueError: a cached block made for other samples, or every
    candidate refused."""
    from lpes_harness.tasks.position import resolve_task

    task, num_samples = plan["task"], plan["num_samples"]
    per_candidate = len(resolve_task(task).positions) * num_samples
    count = len(plan.get("values") or plan.get("arg_strings"))
    chat = apply_chat_template(chat_template)
    before = sum(len(block) for block in cache.blocks.values())

    def score(lm, methods, **kwargs):
        return score_methods(lm, task, methods, num_samples=num_samples, split=SPLIT, metadata=plan["metadata"],
                             chat_template=chat, cache=cache, **kwargs)

    with sample_bar((count + 1) * per_candidate) as progress:
        if plan["mode"] == "uniform":
            vanilla, candidates = score_uniform(lm, plan["values"], score, progress, plan.get("held_layers", ()))
        else:
            vanilla, candidates = score_baseline(lm, plan["model"], plan["arg_strings"], score, progress,
                                                 guarded_loader(pretrained, dtype), per_candidate)
    settings = {**{k: v for k, v in plan.items() if k not in ("arg_strings", "values")},
                "chat_template": chat_template, "pretrained": pretrained, "dtype": dtype}
    if plan["mode"] == "uniform":
        settings["uniform"] = plan["values"]
    scored_now = sum(len(block) for block in cache.blocks.values()) - before
    return summarise(candidates, vanilla, roles, settings, scored_now)


def guarded_loader(pretrained, dtype):
    """``load_baseline`` for :func:`score_methods`: a refusal by the baseline's checks becomes :class:`Refused`.
    The candidates of one baseline share one loaded model, each installed on it in turn."""
    from lpes_harness.core.rope_anatomy import LPESError  # a method's refusal, or core RoPE's (a base on llama3 RoPE)

    loader = BaselineLoader(pretrained, dtype)

    def load(baseline: MethodSetup):
        try:
            return loader(baseline)
        except LPESError as err:
            raise Refused(" ".join(str(err).split())) from None

    return load


# ----------------------------------------------------------------------------- output


def best_spec(result: Mapping) -> str:
    """What DIR/best.txt holds: a ``--baseline`` spec, or (for PI) a ``--uniform`` value."""
    winner = result["winner"]
    if result["mode"] == "uniform":
        return winner["args"]
    return f"{result['name']} tuned={result['model']}:{winner['args']}"


def format_markdown(result: Mapping) -> str:
    """The candidates as a table sorted by fitness, vanilla below as the reference."""
    percents = list(result["reference"]["accuracy"])
    head = "| rank | " + ("scale" if result["mode"] == "uniform" else "arguments") + " | "
    head += " | ".join(f"{p} %" for p in percents) + " | " + " | ".join(ROLES) + " | fitness |"
    lines = [f"# {result['name']} tuned on {result['task']} ({SPLIT} split, {result['num_samples']} samples per position)",
             "", head, "|---:|---|" + "---:|" * (len(percents) + len(ROLES) + 1)]

    def row(rank, label, c):
        cells = [f"{c['accuracy'][p]:.3f}" for p in percents] + [f"{c['roles'][r]:.3f}" for r in ROLES]
        return f"| {rank} | {label} | " + " | ".join(cells) + f" | {c['fitness']:.4f} |"

    for rank, c in enumerate(ranked(result["candidates"]), 1):
        lines.append(row(rank, f"`{c['args']}`" + (" **(winner)**" if rank == 1 else ""), c))
    lines.append(row("", "vanilla (reference)", result["reference"]))
    weights = " + ".join(f"{w:g}·{r}" for r, w in result["weights"].items())
    roles = "; ".join(f"{r} {'+'.join(map(str, p))} %" for r, p in result["roles"].items())
    lines += ["", f"fitness = {weights}, each role's samples pooled ({roles}): the search's weighted objective. "
                  f"Every position of the task is scored; only the roles' count."]
    if result.get("layer_type"):
        lines += ["", f"Each scale is on the {result['layer_type']} layers only; layers "
                      f"{', '.join(map(str, result['held_layers']))} stay at 1."]
    for c in result["candidates"]:
        if "refused" in c:
            lines.append(f"\nskipped `{c['args']}`: {c['refused']}")
    budget = result["budget"]
    lines += ["", f"Budget: {budget['forwards']} forwards over {budget['candidates_scored']} candidates "
                  f"(+{budget['reference_forwards']} for vanilla).", "", f"Held-out: `{result['use']}`"]
    return "\n".join(lines) + "\n"


def write_outputs(directory: Path, result: Mapping) -> dict[str, Path]:
    from lpes_harness.core.files import atomic_write_json, atomic_write_text

    paths = {"json": directory / "tuning.json", "md": directory / "tuning.md", "best": directory / "best.txt"}
    atomic_write_json(paths["json"], result, indent=1)
    atomic_write_text(paths["md"], format_markdown(result))
    atomic_write_text(paths["best"], result["best"] + "\n")
    return paths


def summarise(candidates: list[dict], vanilla: Mapping, roles, settings: Mapping, scored_now: int) -> dict:
    """tuning.json's content: every candidate, the winner, the reference and the budget."""
    for c in candidates:
        if "scores" in c:
            c.update(evaluate(c.pop("scores"), roles))
    best = ranked(candidates)
    if not best:
        raise ValueError("every candidate was refused by the baseline's own checks: "
                         + "; ".join(c["refused"] for c in candidates[:3]))
    result = {**settings, "roles": {r: list(p) for r, p in roles.items()}, "weights": dict(DEFAULT_WEIGHTS),
              "objective": "weighted", "reference": evaluate(vanilla, roles), "candidates": candidates,
              "winner": best[0]}
    result["reference"]["name"] = "vanilla"
    result["best"] = best_spec(result)
    flag = "--uniform" if settings["mode"] == "uniform" else "--baseline"
    layers = f" --layer-type {settings['layer_type']}" if settings.get("layer_type") else ""
    result["use"] = f'python -m lpes_harness.commands.paired --scales SCALES {flag} "{result["best"]}"{layers} --output DIR'
    result["budget"] = {"candidates": len(candidates), "candidates_scored": len(best),
                        "forwards": sum(c["forwards"] for c in best),
                        "reference_forwards": result["reference"]["forwards"], "scored_now": scored_now,
                        "note": "one forward per sample scored (Attention Buckets runs K bases in one forward's batch)"}
    return result
