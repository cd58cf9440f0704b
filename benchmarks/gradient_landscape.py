"""The gradient search's loss along the straight path from the plain model to a target pair of lines.

Issue #100: from the plain model the gradient search (``--search-method gradient``) descends to a nearly uniform
point (position x1.05), while the GPU robust search's curve is nearly two lines far from it (position 0.6 -> 1.6,
base 0.5 -> 1.0). This scores the margin and gold log-probability losses, and greedy accuracy, on the gradient
stage's own samples (``--seed``, 60-300 sentences drawn) at t = 0, 1/4, ..., 1 of the way from the plain model
(t = 0) to the target lines (t = 1), in log-factor space as the search moves. A loss that rises between the two
ends is a barrier a local method started at 1 does not cross.

    python benchmarks/gradient_landscape.py --seed 4 --samples 16 --points 5
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=4)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--points", type=int, default=5)
    p.add_argument("--target", default="0.6:1.6,0.5:1.0", help="position FIRST:LAST,base FIRST:LAST")
    p.add_argument("--output", default=None, help="a JSON file for the rows")
    args = p.parse_args(argv)
    from lpes_harness.core import rope
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.search.drawn_conditions import ConditionRange, draw_conditions
    from lpes_harness.search.factor_families import Bounds, Lines
    from lpes_harness.search.gradient import answer_log_probs, loss_from
    from lpes_harness.search.gradient_samples import position_token_samples

    lm = LPESLM(device="cpu", dtype="float32")
    conditions = draw_conditions(args.seed, args.samples, ConditionRange((60, 300)))
    samples = position_token_samples(lm, "multi_needle", "search", conditions, (0, 25, 50, 75, 100), args.seed)
    num_layers = rope.num_layers(lm.model)
    family = Lines("both", num_layers, [Bounds(0.25, 2.5), Bounds(0.5, 4.0)])
    target = family.initial([tuple(map(float, axis.split(":"))) for axis in args.target.split(",")])
    rope.remove(lm.model)
    rows = []
    for k in range(args.points):
        t = k / (args.points - 1)
        factors = family.factors(t * target).tolist()  # log-space path: the plain model's logarithms are 0
        rope.install(lm.model, factors, "both")
        started, totals, right = time.perf_counter(), {"margin": 0.0, "gold_logprob": 0.0}, 0
        with torch.no_grad():
            for sample in samples:  # one forward a sample: both losses and the greedy answer from its log-probs
                log_probs = answer_log_probs(lm.model, sample)
                for loss in totals:
                    totals[loss] += float(loss_from(log_probs, sample, loss)) / len(samples)
                right += int(log_probs.argmax(-1).tolist() == list(sample.answer))
        rope.remove(lm.model)
        row = {"t": t, "position": [factors[0], factors[num_layers - 1]], "base": [factors[num_layers], factors[-1]],
               **{k: round(v, 4) for k, v in totals.items()}, "greedy_right": right, "samples": len(samples),
               "seconds": round(time.perf_counter() - started, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.output:
        with open(args.output, "w") as handle:
            json.dump({"seed": args.seed, "target": args.target, "rows": rows}, handle, indent=2)
    assert all(math.isfinite(r["margin"]) for r in rows)


if __name__ == "__main__":
    main()
