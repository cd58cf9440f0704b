"""A held-out table's prompts scored each from scratch, and sharing the text they begin with, side by side.

    python benchmarks/prefix_sharing.py --samples 10 --repeats 2 --dtype float32 --threads 2

One model load (``lpes_hf`` on the bundled SmolLM2 unless ``--pretrained``, scaled by ``--scales``:
by default the committed reference curve, so the scaled rotary path runs on the cached tokens too).
A sample here is what one chunk of a held-out table (``commands.paired``) gives the scorer: the
same ``multi_needle`` held-out sample at the five gold positions, five prompts that are one text
but where the gold needle sits. Each sample is scored by

- ``each alone``: ``score_answers(..., share_prefixes=False)``, every prompt through the whole
  decoder (the held-out table's path before);
- ``shared``: ``score_answers`` now: the prompts in lexicographic order on one KV cache, cut
  back to what the next one shares.

The two are interleaved per sample and repeat (the order reversed on every other repeat), so load
on a shared machine hits them alike. The table gives the median seconds per sample (median over
repeats, then over samples), the median per-sample ratio to ``each alone``, and the tokens the
decoder ran; the last line says whether they agree (``is_greedy`` on every prompt, the largest
difference in log-probability).
"""

from __future__ import annotations

import sys

import torch

# this folder: on sys.path when run as a script
from side_by_side import RUN_FLAGS, DecoderTokens, interleaved, model_flags, parse_flags, per_sample_medians, scaled_lm

PERCENTS = (0, 25, 50, 75, 100)
METHODS = ("each alone", "shared")
REFERENCE = "results/smollm2_multi_needle_reference/scales.json"  # from the repository's root

FLAGS = (  # flag, type, default, help
    *model_flags("float32"),
    ("--scales", str, None, "lpes_hf scales (default: the committed reference curve, for the bundled model run from "
                            "the repository root; else 1)"),
    ("--samples", int, 10, "held-out samples, each at the five gold positions"),
    ("--repeats", int, 2, "interleaved repeats of the two paths"),
    *RUN_FLAGS,
)


def parse_args(argv):
    return parse_flags(__doc__.split("\n\n")[0], FLAGS, argv, positive=("--samples", "--repeats"))


def sample_prompts(lm, samples: int) -> list[list[tuple[str, str]]]:
    """Each held-out sample's (context, continuation) pairs at the five gold positions, as the table builds them."""
    from lpes_harness.lmeval.position_scorer import PositionScorer

    scorer = PositionScorer(lm, "multi_needle", list(PERCENTS), split="heldout", num_samples=samples)
    return [[pair for percent in PERCENTS
             for pair in scorer.answer_pairs(scorer.tasks[percent], [scorer.docs[percent][index]])[0]]
            for index in range(samples)]


def main(argv=None) -> int:
    args = parse_args(argv)
    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.lmeval.answer_logits import score_answers

    lm, scales = scaled_lm(args, REFERENCE)
    samples = sample_prompts(lm, args.samples)
    device = torch.device(lm.device)
    tokens = DecoderTokens(lm.model)

    def run(method, pairs):
        tokens.count = 0
        scores = score_answers(lm, pairs, share_prefixes=method == "shared")
        return [(s.logprob, s.is_greedy) for s in scores], tokens.count

    for method in METHODS:  # warm-up of both paths on the first sample
        run(method, samples[0])
    seconds, results = interleaved(METHODS, run, args.repeats, device, samples)
    tokens.remove()

    per_sample, rows = per_sample_medians(seconds, "each alone")
    for method in METHODS:
        rows[method]["tokens"] = sum(result[1] for result in results[method])
    alone = [score for sample in results["each alone"] for score in sample[0]]
    shared = [score for sample in results["shared"] for score in sample[0]]
    same_greedy = sum(a[1] == b[1] for a, b in zip(alone, shared))
    max_dlogprob = max(abs(a[0] - b[0]) for a, b in zip(alone, shared))

    print(f"multi_needle held-out, {len(samples)} samples x {len(PERCENTS)} gold positions, scales "
          f"{scales or 1}, {args.dtype}, {torch.get_num_threads()} thread(s), {args.repeats} repeats")
    print(f"{'method':<11} {'s / sample':>10} {'vs each alone':>14} {'tokens run':>11}")
    for method in METHODS:
        row = rows[method]
        print(f"{method:<11} {row['median_s']:>10.3f} {row['ratio_to_each_alone']:>13.3f}x {row['tokens']:>11}")
    print(f"shared / each alone: {rows['shared']['ratio_to_each_alone']:.3f}x the time, "
          f"{rows['shared']['tokens'] / rows['each alone']['tokens']:.3f}x the tokens; agreement: "
          f"{same_greedy}/{len(alone)} is_greedy, max |dlogprob| {max_dlogprob:.2g}")
    if args.json:
        atomic_write_json(args.json, {
            "dtype": args.dtype, "threads": torch.get_num_threads(), "samples": len(samples), "repeats": args.repeats,
            "scales": scales, "methods": rows, "per_sample_s": per_sample,
            "agreement": {"is_greedy_same": same_greedy, "prompts": len(alone), "max_abs_dlogprob": max_dlogprob}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
