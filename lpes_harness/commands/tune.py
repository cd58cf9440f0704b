"""Tune a baseline's settings on the *search* split, with LPES's own fitness (issue #29, item 3).

    python -m lpes_harness.commands.tune --baseline Ms-PoE=mspoe_hf \\
        --grid '{"min_ratio": [1.0, 1.1, 1.2], "max_ratio": [1.2, 1.4, 1.8]}' --output results/tune_mspoe
    python -m lpes_harness.commands.tune --uniform 0.6,0.7,0.8,0.9,1.1 --output results/tune_pi

LPES chooses its curve on the search split and is judged on the held-out one; a baseline run
only at its authors' settings is not given the same chance. This command scores every setting
of a grid (the Cartesian product of ``--grid``, plus ``--fixed``) on the search samples through
:func:`lpes_harness.evaluation.paired.score_methods`, ranks them by the search's weighted fitness
(0.2·begin + 0.3·middle + 0.5·end over the task's roles) and writes the winner as a row spec for
the held-out table: ``--baseline "$(cat DIR/best.txt)"`` next to the authors' ``--baseline``.
``--uniform`` tunes PI, a uniform scale on the already loaded ``lpes_hf``, the same way.
Without ``--grid`` (or without values for ``--uniform``), the candidates are the method's grid in
the table of methods (:data:`lpes_harness.methods.METHODS`), which also names the row.

Scores are kept in DIR/scores.cache.json every few samples, so a killed run resumes and a
second run scores nothing. The budget (forwards: one per sample scored) is recorded, so that it
can be set against the forwards of an LPES search.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.evaluation.baseline_rows import Baseline, load_baseline_lm, parse_baseline
from lpes_harness.evaluation.paired import (
    CACHE_FILE, cache_identity, held_layers_of, lpes_methods, run_dtype, sample_bar, score_methods,
)
from lpes_harness.evaluation.score_cache import ScoreCache
from lpes_harness.methods import METHODS, grid_of, label_of, tuned_by_grid
from lpes_harness.core.models import positive_int
from lpes_harness.search.fitness import DEFAULT_WEIGHTS, ROLES, combine, task_roles

PROG = "python -m lpes_harness.commands.tune"
SPLIT = "search"
DESCRIPTION = (
    "Choose a baseline's settings (or PI's uniform scale) on the search split of a position task, by the "
    "search's weighted fitness 0.2*begin + 0.3*middle + 0.5*end; writes OUTPUT/tuning.{json,md} and "
    "OUTPUT/best.txt, the winner as a row for python -m lpes_harness.commands.paired. Scores are kept in "
    "OUTPUT/scores.cache.json: run the same command again to resume."
)


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
    scored = score(lm, {"vanilla": [1.0] * n, **rows}, progress=progress)
    candidates = [{"index": i, "args": f"{v:g}", "scores": scored["scores"][label]}
                  for i, (label, v) in enumerate(labels.items())]
    return scored["scores"]["vanilla"], candidates


def score_baseline(lm, model: str, arg_strings: Sequence[str], score, progress, load, per_candidate: int):
    """Vanilla (the reference row), then each candidate as a baseline model, one loaded at a time.

    One ``score_methods`` call per candidate, so that a candidate its own checks refuse (they
    run when it loads, before the weights are read) is skipped without losing the others.
    """
    n = len(lm.scales)
    vanilla = score(lm, {"vanilla": [1.0] * n}, progress=progress)["scores"]["vanilla"]
    candidates = []
    for i, args in enumerate(arg_strings):
        record = {"index": i, "args": args, "spec": Baseline(model, args).spec}
        try:
            scored = score(lm, {}, baselines={args: Baseline(model, args)}, load_baseline=load, progress=progress)
            record["scores"] = scored["scores"][args]
        except Refused as err:
            record["refused"] = str(err)
            progress(f"{args} (refused)", 0, per_candidate)  # the bar counted its samples
        candidates.append(record)
    return vanilla, candidates


def guarded_loader(pretrained, dtype):
    """``load_baseline`` for :func:`score_methods`: a refusal by the baseline's checks becomes :class:`Refused`."""
    from lpes_harness.core.rope_anatomy import LPESError  # a method's refusal, or core RoPE's (a base on llama3 RoPE)

    def load(baseline: Baseline):
        try:
            return load_baseline_lm(baseline, pretrained, dtype)
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


# ----------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    p.add_argument("--baseline", default=None, metavar="[NAME=]MODEL[:ARGS]",
                   help="the baseline to tune, e.g. Ms-PoE=mspoe_hf (ARGS, if any, are held fixed like --fixed)")
    p.add_argument("--grid", default=None,
                   help='JSON: argument -> list of values, e.g. \'{"min_ratio": [1.0, 1.2], "max_ratio": [1.4, 1.8]}\'; '
                        "every combination is a candidate (lists inside a value become ';'-joined, e.g. bases); "
                        f"default: the method's grid in the table of methods ({', '.join(tuned_by_grid())})")
    p.add_argument("--fixed", default="", help="arguments every candidate shares, 'k=v,k=v' (e.g. head_mapping=rank)")
    p.add_argument("--uniform", default=None, nargs="?", const="",
                   help="tune PI instead: uniform scales on the loaded lpes_hf, e.g. 0.6,0.7,0.8,0.9,1.1 "
                        f"(alone: PI's grid, {','.join(f'{v:g}' for v in METHODS['pi'].grid['scales'])})")
    p.add_argument("--layer-type", default=None,
                   help="with --uniform: scale only the layers of this attention type (e.g. full_attention, "
                        "Gemma-3's global layers), the others at 1, as the search's --layer-type does")
    p.add_argument("--name", default=None,
                   help="the row name (default: NAME of --baseline, else the method's label; PI for --uniform)")
    p.add_argument("--task", default="multi_needle", help="a registered position task (default multi_needle)")
    p.add_argument("--metadata", default="{}", help="task options as JSON (as in the search)")
    p.add_argument("--num-samples", type=int, default=20,
                   help="search samples per position (default 20, the cpu-bf16 search's)")
    p.add_argument("--pretrained", default=None, help="HF id, local dir or .gguf (default: bundled SmolLM2)")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (default)")
    p.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--output", required=True, help="directory for tuning.{json,md}, best.txt and scores.cache.json")
    return p


def check_args(args) -> dict:
    """Every setting checked before anything loads or is written; returns what the run needs."""
    if (args.baseline is None) == (args.uniform is None):
        raise ValueError(f"give either --baseline NAME=MODEL (a grid of its own with --grid, or the table's for "
                         f"{', '.join(tuned_by_grid())}), or --uniform for PI")
    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be >= 1, got {args.num_samples}")
    try:
        metadata = json.loads(args.metadata)
    except json.JSONDecodeError as err:
        raise ValueError(f"--metadata is not valid JSON ({err.msg})") from None
    if not isinstance(metadata, dict) or {"split", "num_samples"} & set(metadata):
        raise ValueError("--metadata must be a JSON object without 'split' or 'num_samples' (set by this command)")
    roles = task_roles(args.task)  # an unknown task: TaskDataError, a ValueError naming it
    settings = {"task": args.task, "split": SPLIT, "num_samples": args.num_samples, "metadata": metadata}
    if args.uniform is not None:
        if args.grid or args.fixed:
            raise ValueError("--uniform tunes PI alone: leave out --grid and --fixed")
        held = held_layers_of(args.pretrained, args.layer_type)  # a type the model lacks: named before it loads
        try:
            text = args.uniform or ",".join(map(str, METHODS["pi"].grid["scales"]))
            values = list(dict.fromkeys(float(v) for v in text.split(",") if v.strip()))
        except ValueError:
            raise ValueError(f"--uniform {args.uniform!r}: give numbers separated by ','") from None
        if not values or any(not math.isfinite(v) or v <= 0 for v in values):
            raise ValueError(f"--uniform {args.uniform!r}: give one or more finite scales > 0")
        layers = {"layer_type": args.layer_type, "held_layers": list(held)} if args.layer_type else {}
        return {**settings, "mode": "uniform", "name": args.name or METHODS["pi"].label, "model": "lpes_hf",
                "values": values, **layers, "roles_map": roles}
    if args.layer_type:
        raise ValueError("--layer-type goes with --uniform (PI); a baseline model's layers are its own arguments")
    name, baseline = parse_baseline(args.baseline)
    if args.grid is None and grid_of(baseline.model) is None:
        raise ValueError(f"--baseline {baseline.model} needs --grid (JSON: argument -> list of values): the table of "
                         f"methods has a grid for {', '.join(tuned_by_grid())} only")
    grid = parse_grid(args.grid if args.grid is not None else json.dumps(grid_of(baseline.model)))
    fixed = {**parse_fixed(baseline.args), **parse_fixed(args.fixed)}
    check_argument_names(baseline.model, [*fixed, *grid])
    name = args.name or (name if name != baseline.spec else label_of(baseline.model))
    return {**settings, "mode": "baseline", "name": name, "model": baseline.model, "grid": grid, "fixed": fixed,
            "arg_strings": expand_grid(grid, fixed), "roles_map": roles}


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)

    def fail(message) -> None:  # one line, exit 2, nothing written
        parser.exit(2, f"{PROG}: error: {' '.join(str(message).split())}\n")

    try:
        plan = check_args(args)
        dtype = run_dtype(args.dtype, {})
        identity = {**cache_identity(args.task, plan["metadata"], args.chat_template, args.pretrained, dtype),
                    "split": SPLIT}
        cache = ScoreCache(Path(args.output) / CACHE_FILE, identity)  # refuses another run's samples, writes nothing
    except ValueError as err:
        fail(err)
    roles = plan.pop("roles_map")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.tasks.position import resolve_task

    try:
        lm = LPESLM(pretrained=args.pretrained, dtype=dtype)
    except OSError as err:  # a model that is not there (or its package missing): one line, nothing written
        fail(f"--pretrained {args.pretrained}: {err}")
    per_candidate = len(resolve_task(args.task).positions) * args.num_samples
    count = len(plan.get("values") or plan.get("arg_strings"))
    chat = {"auto": None, "on": True, "off": False}[args.chat_template]
    before = sum(len(block) for block in cache.blocks.values())

    def score(lm, methods, **kwargs):
        return score_methods(lm, args.task, methods, num_samples=args.num_samples, split=SPLIT,
                             metadata=plan["metadata"], chat_template=chat, cache=cache, **kwargs)

    try:
        with sample_bar((count + 1) * per_candidate) as progress:
            if plan["mode"] == "uniform":
                vanilla, candidates = score_uniform(lm, plan["values"], score, progress, plan.get("held_layers", ()))
            else:
                vanilla, candidates = score_baseline(lm, plan["model"], plan["arg_strings"], score, progress,
                                                     guarded_loader(args.pretrained, dtype), per_candidate)
        settings = {**{k: v for k, v in plan.items() if k not in ("arg_strings", "values")},
                    "chat_template": args.chat_template, "pretrained": args.pretrained, "dtype": dtype}
        if plan["mode"] == "uniform":
            settings["uniform"] = plan["values"]
        scored_now = sum(len(block) for block in cache.blocks.values()) - before
        result = summarise(candidates, vanilla, roles, settings, scored_now)
    except ValueError as err:  # e.g. a cached block made for other samples, or every candidate refused
        fail(err)
    paths = write_outputs(Path(args.output), result)
    for c in candidates:
        if "refused" in c:
            print(f"skipped {c['args']}: {c['refused']}")
    winner, budget = result["winner"], result["budget"]
    print(f"best: {result['best']} (fitness {winner['fitness']:.4f}; vanilla {result['reference']['fitness']:.4f}); "
          f"{budget['candidates_scored']} of {budget['candidates']} candidates scored, {budget['forwards']} forwards "
          f"(+{budget['reference_forwards']} vanilla), {budget['scored_now']} scored now; "
          f"written {paths['json']}, {paths['md']}, {paths['best']}")


if __name__ == "__main__":
    main()
