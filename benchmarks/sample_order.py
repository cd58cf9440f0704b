"""Forwards racing spends in the ``roles`` and the ``hardest`` sample order, on the same evaluations.

    python benchmarks/sample_order.py --evaluations 30 --json scratch/sample_order.json

Issue #46, "cheaper decisions inside the search". The order racing scores samples in does not
change which individuals a search selects (the bound is exact in any order:
:mod:`lpes_harness.search.sample_order`), so a search's path is the same under both orders, and
the forwards each order spends on that path can be compared evaluation by evaluation. This replays
the first ``--evaluations`` evaluations of a search journal (``benchmarks/search_efficiency.py``'s
``evaluations.jsonl``: every evaluation's scales and racing threshold, in the order the search made
them, with the forwards it spent in the ``roles`` order, the order it ran in), scores each again
in the ``hardest`` order with the journal's own fitness settings (its ``efficiency.json``) on one
loaded model, and puts the two side by side:

- forwards per evaluation, and in total, in each order (``roles``: the journal's record);
- the check that the order changed nothing it must not: every complete fitness equal to the
  journal's (to float32 rounding), and racing stopping exactly the evaluations it stopped before
  (the exit status is 1 otherwise).

The ``hardest`` order learns from the evaluations before it, as it does in a search, so the replay
runs them in the journal's order and cannot resume (a rerun starts over). The journal of
``search_efficiency.py`` holds every method and seed in the order they ran; the first run's
evaluations come first (its ``efficiency.json`` gives how many each run made).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from lpes_harness.core.models import positive_int


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--journal", default="results/search_efficiency/evaluations.jsonl",
                        help="an evaluations.jsonl of benchmarks/search_efficiency.py, its efficiency.json beside it")
    parser.add_argument("--evaluations", type=int, default=None, help="replay the first N evaluations (default: all)")
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda when present)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="write every evaluation's two counts and the summary here")
    args = parser.parse_args(argv)
    if args.evaluations is not None and args.evaluations < 1:
        parser.error("--evaluations must be >= 1")
    return args


def load_journal(path: Path, limit: int | None) -> tuple[dict, list[dict]]:
    """The journal's fitness settings and its first ``limit`` evaluations; one line on a bad input."""
    from lpes_harness.core.files import read_jsonl

    settings_path = path.parent / "efficiency.json"
    if not path.is_file() or not settings_path.is_file():
        raise SystemExit(f"sample_order: {path} and {settings_path} must both exist (a search_efficiency.py output)")
    settings = json.loads(settings_path.read_text())["settings"]
    entries = read_jsonl(path)[:limit]
    if not entries:
        raise SystemExit(f"sample_order: {path} holds no evaluations")
    return settings, entries


def summarise(rows: list[dict]) -> dict:
    roles = sum(r["roles_forwards"] for r in rows)
    hardest = sum(r["hardest_forwards"] for r in rows)
    raced = [r for r in rows if r["raced"]]
    return {
        "evaluations": len(rows), "raced": len(raced),
        "roles_forwards": roles, "hardest_forwards": hardest, "ratio": hardest / roles if roles else None,
        "raced_roles_forwards": sum(r["roles_forwards"] for r in raced),
        "raced_hardest_forwards": sum(r["hardest_forwards"] for r in raced),
        "changed": [r["index"] for r in rows if not r["same"]],
    }  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    settings, entries = load_journal(Path(args.journal), args.evaluations)

    import torch
    from tqdm.auto import tqdm

    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.search.fitness import FitnessConfig, LMEvalFitness

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = LPESLM(pretrained=settings["pretrained"], device=args.device, batch_size=1, dtype=settings["dtype"])
    batch_size = int(settings["batch_size"]) if str(settings["batch_size"]).isdigit() else settings["batch_size"]
    fitness = LMEvalFitness(lm, FitnessConfig(task=settings["task"], fitness=settings["fitness"],
                                              metadata=settings["metadata"], num_samples=settings["num_samples"],
                                              chunk_size=settings["chunk_size"], racing=True, batch_size=batch_size,
                                              sample_order="hardest"))
    rows = []
    started = time.perf_counter()
    bar = tqdm(entries, desc="replay (hardest order)", unit="evaluation")
    for index, entry in enumerate(bar):
        before = fitness.samples_scored
        value, info = fitness(entry["scales"], entry["threshold"])
        raced, was_raced = bool(info.get("raced")), bool(entry["info"].get("raced"))
        # Complete: the same fitness, to float32 rounding (logprob scores of the same prompts differ by
        # ~1e-7 between a chunk and another; greedy's 0 / 1 do not). Raced: still raced (the bound
        # itself depends on which samples were scored).
        same = raced == was_raced and (raced or math.isclose(value, entry["fitness"], rel_tol=1e-6, abs_tol=1e-9))
        rows.append({"index": index, "threshold": entry["threshold"], "raced": was_raced, "same": same,
                     "fitness": entry["fitness"], "hardest_value": value,
                     "roles_forwards": entry["forwards"], "hardest_forwards": fitness.samples_scored - before})
        bar.set_postfix(roles=sum(r["roles_forwards"] for r in rows), hardest=sum(r["hardest_forwards"] for r in rows))
    summary = {**summarise(rows), "seconds": round(time.perf_counter() - started, 1), "journal": args.journal,
               "settings": settings, "device": str(lm.device), "threads": torch.get_num_threads()}
    print(f"{summary['evaluations']} evaluations of {args.journal} ({summary['raced']} raced), {settings['dtype']}: "
          f"roles order {summary['roles_forwards']} forwards, hardest order {summary['hardest_forwards']} "
          f"({summary['ratio']:.3f}x); on the raced evaluations {summary['raced_roles_forwards']} -> "
          f"{summary['raced_hardest_forwards']}; changed results: {len(summary['changed'])} "
          f"{summary['changed'] or ''}; {summary['seconds']:.0f} s")
    if args.json:
        atomic_write_json(Path(args.json), {"summary": summary, "rows": rows}, indent=1)
    return 1 if summary["changed"] else 0


if __name__ == "__main__":
    sys.exit(main())
