"""Per-sample vs batched answer scoring (the one-pass fitness) on the same prompts, side by side.

    python benchmarks/batched_fitness.py --samples 20 --batch-size auto --json scratch/batched.json

One model load (the bundled SmolLM2 unless ``--pretrained``), LPES installed with a stand-in
curve whose every layer has its own scale. The prompts are the search's: ``multi_needle``
(the search split) at 0, 50 and 100 %, built exactly as the fitness builds them
(``PositionScorer.prompt``), with every gold answer of each (``gold_answers``). The same
pairs are scored by ``score_answers`` with ``batch_size=1`` (one prompt per forward) and with
``--batch-size`` (many prompts per forward), interleaved over ``--repeats``, alternating
which goes first. It reports samples/s of each (median over repeats) and whether the two give
the same answers: ``is_greedy`` on every pair (what the greedy fitness reads) and the largest
difference in log-probability (what the logprob fitness reads). The last line is

    batched/per-sample speed: 1.23x (batch_size 4); agreement: 60/60 is_greedy, max |dlogprob| 2.1e-06
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from lpes_harness.core.models import positive_int

PERCENTS = (0, 50, 100)
# A stand-in curve: every layer its own scale (the worst case for the hooks); speed does not
# depend on the values, and the agreement check needs scales != 1.
CONTROL_POINTS = "0:1.4;10:1.1;20:1.6;29:1.2"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", default=None, help="model (default: the bundled SmolLM2 GGUF)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--samples", type=int, default=20, help="samples per position (3 positions)")
    parser.add_argument("--batch-size", default="auto", help="prompts per forward of the batched scorer: an integer or 'auto'")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the measurements here")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.repeats < 1:
        parser.error("--samples and --repeats must be at least 1")
    if args.batch_size != "auto" and not (args.batch_size.isdigit() and int(args.batch_size) >= 1):
        parser.error(f"--batch-size {args.batch_size!r}: give an integer >= 1 or 'auto'")
    return args


def search_pairs(lm, samples: int) -> tuple[list[tuple[str, str]], int]:
    """(context, delimiter + answer) for every gold answer of the search split's samples; and the sample count."""
    from lpes_harness.lmeval.position_scorer import PositionScorer, gold_answers

    scorer = PositionScorer(lm, "multi_needle", list(PERCENTS), split="search", num_samples=samples)
    pairs, count = [], 0
    for percent in PERCENTS:
        task = scorer.tasks[percent]
        for doc in scorer.docs[percent][:samples]:
            context = scorer.prompt(task, doc)
            pairs += [(context, task.config.target_delimiter + answer) for answer in gold_answers(task, doc)]
            count += 1
    return pairs, count


def timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.lmeval.answer_logits import resolve_batch_size, score_answers

    lm = LPESLM(pretrained=args.pretrained, device=args.device, dtype=args.dtype, control_points=CONTROL_POINTS)
    pairs, count = search_pairs(lm, args.samples)
    lengths = sorted(len(lm.tok_encode(context)) for context in {c for c, _ in pairs})
    batch_size = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    print(f"{count} samples ({len(pairs)} answers), prompts of {lengths[0]}-{lengths[-1]} tokens, device {lm.device}, "
          f"{args.dtype}, {torch.get_num_threads()} threads, batch_size {batch_size} "
          f"(= {resolve_batch_size(lm, batch_size)} here)", file=sys.stderr)

    score_answers(lm, pairs[:2])  # warm-up (first-call allocations), not timed
    seconds = {"per_sample": [], "batched": []}
    results = {}
    for repeat in range(args.repeats):
        order = ("per_sample", "batched") if repeat % 2 == 0 else ("batched", "per_sample")
        for name in order:
            size = 1 if name == "per_sample" else batch_size
            results[name], elapsed = timed(lambda: score_answers(lm, pairs, batch_size=size))
            seconds[name].append(elapsed)
            print(f"repeat {repeat + 1} {name}: {elapsed:.2f} s ({count / elapsed:.2f} samples/s)", file=sys.stderr)

    one, many = results["per_sample"], results["batched"]
    same_greedy = sum(a.is_greedy == b.is_greedy for a, b in zip(one, many))
    max_diff = max(abs(a.logprob - b.logprob) for a, b in zip(one, many))
    rate = {name: count / statistics.median(values) for name, values in seconds.items()}
    ratio = rate["batched"] / rate["per_sample"]
    report = {
        "model": args.pretrained or "bundled SmolLM2-135M-Instruct",
        "device": str(lm.device),
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "task": "multi_needle (search split)",
        "percents": list(PERCENTS),
        "samples": count,
        "answers": len(pairs),
        "prompt_tokens": [lengths[0], lengths[-1]],
        "batch_size": batch_size,
        "batch_size_used": resolve_batch_size(lm, batch_size),
        "repeats": args.repeats,
        "seconds": seconds,
        "samples_per_s": rate,
        "speed_ratio": ratio,
        "is_greedy_agreement": [same_greedy, len(pairs)],
        "max_abs_logprob_difference": max_diff,
    }
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    print(f"per-sample {rate['per_sample']:.2f} samples/s, batched {rate['batched']:.2f} samples/s")
    print(f"batched/per-sample speed: {ratio:.2f}x (batch_size {batch_size}); agreement: {same_greedy}/{len(pairs)} "
          f"is_greedy, max |dlogprob| {max_diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
