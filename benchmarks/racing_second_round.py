"""A second race around a finished race's finalists (iterated racing), reusing the first race's scores.

Issue #100: seed 4's race (``lpes-search --profile racing-smollm2``) drew 23 line pairs over a 4-number box and
none came near the GPU search's curve; its winner gained +10.0 on fresh samples against that curve's +23.3. This
probe asks whether a second, local round finds more with few extra forwards: it draws ``--draws`` new line pairs
around the run's ``--finalists`` best candidates (in turns; each end multiplied by exp(N(0, ``--sigma``)), clipped
to the run's bounds), and races them with those finalists by the same successive halving on the run's own 48
search samples. The finalists' scores are read from the run's ``racing.jsonl``, not scored again; only the new
candidates' forwards are spent and counted.

    python benchmarks/racing_second_round.py --run results/racing_smollm2_seed4 --output /tmp/round2

Writes ``round2.jsonl`` (a line a new score), ``round2.json`` (the candidates, their scores, the winner, the new
forwards and seconds) and ``scales.json`` (the winner's lines, for ``commands.transfer``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a finished lpes-search --search-method racing folder")
    p.add_argument("--finalists", type=int, default=3)
    p.add_argument("--draws", type=int, default=13)
    p.add_argument("--sigma", type=float, default=0.15, help="the spread of each end's logarithm")
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)

    import torch

    from lpes_harness.core import rope
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.search.drawn_conditions import ConditionRange, draw_conditions
    from lpes_harness.search.factor_families import Bounds, Lines
    from lpes_harness.search.gradient import answer_log_probs, loss_from
    from lpes_harness.search.gradient_samples import position_token_samples
    from lpes_harness.search.line_racing import RacingConfig, race

    run, output = Path(args.run), Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    first, bounds, finalists, candidates, reached = second_round(run, args.finalists, args.draws, args.sigma)
    settings = first["settings"]
    seed = settings["seed"]
    known = {(i, r["sample"]): (r["right"], r["loss"]) for i, c in enumerate(finalists) for r in reached[c]}
    race_config = RacingConfig(draws=len(candidates) - 1, samples=settings["racing_samples"],
                               first=settings["racing_first"], seed=seed)
    lm = LPESLM(device="cpu", dtype="float32")
    conditions = draw_conditions(seed, settings["racing_samples"], ConditionRange(tuple(settings["draw_range"])))
    samples = position_token_samples(lm, settings["task"], "search", conditions, (0, 25, 50, 75, 100), seed)
    layers = rope.num_layers(lm.model)
    family = Lines(settings["scaling"], layers, [Bounds(*b) for b in bounds])
    rope.remove(lm.model)
    started, journal, spent = time.perf_counter(), (output / "round2.jsonl").open("w"), [0]

    def score(entry, sample):
        rope.install(lm.model, family.factors(family.initial(entry.ends)).tolist(), settings["scaling"])
        with torch.no_grad():
            log_probs = answer_log_probs(lm.model, samples[sample])
        rope.remove(lm.model)
        right = log_probs.argmax(-1).tolist() == list(samples[sample].answer)
        loss = float(loss_from(log_probs, samples[sample], settings["loss"]))
        spent[0] += 1
        journal.write(json.dumps({"candidate": entry.index, "sample": sample, "right": right, "loss": loss}) + "\n")
        journal.flush()
        return right, loss

    found = race(score, candidates, race_config, known=known)
    seconds = round(time.perf_counter() - started, 1)
    winner = found.winner
    print(f"winner {winner.index} {winner.ends}: {sum(winner.right)} of {len(winner.right)} right; "
          f"{spent[0]} new forwards in {seconds} s", flush=True)
    (output / "round2.json").write_text(json.dumps({
        "run": str(run), "finalists": finalists, "sigma": args.sigma, "new_forwards": spent[0], "seconds": seconds,
        "entries": [e.to_dict() for e in found.entries], "winner": winner.to_dict()}, indent=1))
    factors = family.factors(family.initial(winner.ends)).tolist()
    (output / "scales.json").write_text(json.dumps({
        "format": "lpes-scales/1", "scales": factors[:layers], "base_scales": factors[layers:], "num_layers": layers,
        "scaling": settings["scaling"], "curve": "line", "label": f"round 2 candidate {winner.index}"}))


def second_round(run: Path, finalists: int, draws: int, sigma: float):
    """The first race (its racing.json), the run's bounds, its ``finalists`` best candidates, the second round's
    candidates (those finalists first, then ``draws`` local ones) and the first race's scores by candidate."""
    import numpy as np

    first = json.loads((run / "racing.json").read_text())
    config = json.loads((run / "config.json").read_text())
    scores = [json.loads(line) for line in (run / "racing.jsonl").read_text().splitlines()]
    reached = {}
    for row in scores:
        reached.setdefault(row["candidate"], []).append(row)
    # The first race's order: the most samples, then more right, then the lower mean loss.
    order = sorted(reached, key=lambda c: (-len(reached[c]), -sum(r["right"] for r in reached[c]),
                                           sum(r["loss"] for r in reached[c]) / len(reached[c]), c))
    best = order[:finalists]
    settings = config.get("settings", config)
    bounds = [(settings["y_min"], settings["y_max"]), (settings["base_y_min"], settings["base_y_max"])]
    rng = np.random.default_rng(1000 + first["settings"]["seed"])
    local = []
    for k in range(draws):
        parent = first["candidates"][best[k % len(best)]]
        ends = []
        for (a, b), (low, high) in zip(parent, bounds):
            moved = (float(np.clip(math.exp(math.log(v) + rng.normal(0, sigma)), low, high)) for v in (a, b))
            ends.append(tuple(round(v, 4) for v in moved))
        local.append(ends)
    candidates = [[tuple(e) for e in first["candidates"][c]] for c in best] + local
    return first, bounds, best, candidates, reached


if __name__ == "__main__":
    main()
