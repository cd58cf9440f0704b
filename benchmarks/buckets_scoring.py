"""Attention Buckets' loglikelihood: lm-eval's full-logits path against the answer-logits path, side by side.

    OMP_NUM_THREADS=1 python benchmarks/buckets_scoring.py --samples 10 --repeats 2 --dtype bfloat16 --threads 1

One model load (``buckets_hf`` on the bundled SmolLM2 unless ``--pretrained``, the seven default
bases, ``batch_size=1`` as the paired held-out table loads it). The samples are the held-out
table's: ``multi_needle``, held-out split, spread over the five gold positions, each with every
gold answer, built as the table builds them (``PositionScorer.answer_pairs``). Each sample is
scored by

- ``full logits``: lm-eval's own ``HFLM.loglikelihood`` (the merged logits of all K copies over
  the whole vocabulary at every prompt position, then the answer's kept): the path before;
- ``answer logits``: ``buckets_hf``'s ``loglikelihood`` now (one forward of the K copies through
  the decoder, the output layer only at the answer positions);
- ``vanilla``, for scale: the same model with Buckets removed, through LPES's answer-logits scorer
  (``score_answers``), the path of the vanilla / LPES rows of the same table.

The three are interleaved per sample and repeat (the order reversed on every other repeat), so
load on a shared machine hits them alike. The table gives the median seconds per sample (median
over repeats, then over samples) and the median of the per-sample ratios to ``full logits``;
the last line says whether the two Buckets paths agree (``is_greedy`` on every pair, the largest
difference in log-probability).
"""

from __future__ import annotations

import statistics
import sys

import torch

from side_by_side import RUN_FLAGS, interleaved, model_flags, parse_flags  # this folder: on sys.path when run as a script

PERCENTS = (0, 25, 50, 75, 100)
METHODS = ("full logits", "answer logits", "vanilla")


FLAGS = (  # flag, type, default, help
    *model_flags("bfloat16"),
    ("--samples", int, 10, "samples in all, spread over the five gold positions"),
    ("--repeats", int, 2, "interleaved repeats of the three paths"),
    *RUN_FLAGS,
)


def parse_args(argv):
    return parse_flags(__doc__.split("\n\n")[0], FLAGS, argv, positive=("--samples", "--repeats"))


def heldout_samples(lm, samples: int) -> list[list[tuple[str, str]]]:
    """Each sample's (context, continuation) pairs, round-robin over the gold positions."""
    from lpes_harness.lmeval.position_scorer import PositionScorer

    per_position = -(-samples // len(PERCENTS))
    scorer = PositionScorer(lm, "multi_needle", list(PERCENTS), split="heldout", num_samples=per_position)
    found = []
    for index in range(per_position):
        for percent in PERCENTS:
            found.append(scorer.answer_pairs(scorer.tasks[percent], [scorer.docs[percent][index]])[0])
    return found[:samples]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from lm_eval.models.huggingface import HFLM

    from lpes_harness.methods import buckets
    from lpes_harness.lmeval.method_models import BucketsLM
    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.lmeval.answer_logits import score_answers
    from lpes_harness.lmeval.requests import loglikelihood_requests

    lm = BucketsLM(pretrained=args.pretrained, device=args.device, dtype=args.dtype, batch_size=1)
    bases = list(buckets.get_state(lm.model).relative_bases)  # relative to theta (each layer type's on Gemma-3)
    samples = heldout_samples(lm, args.samples)
    device = torch.device(lm.device)

    def vanilla(pairs):
        buckets.remove(lm.model)
        try:
            return [(s.logprob, s.is_greedy) for s in score_answers(lm, pairs)]
        finally:
            buckets.install(lm.model, bases)

    run = {
        "full logits": lambda pairs: HFLM.loglikelihood(lm, loglikelihood_requests(pairs), disable_tqdm=True),
        "answer logits": lambda pairs: lm.loglikelihood(loglikelihood_requests(pairs), disable_tqdm=True),
        "vanilla": vanilla,
    }
    vanilla(samples[0])  # warm-up of every path on the first sample
    for method in METHODS:
        run[method](samples[0])
    seconds, results = interleaved(METHODS, lambda method, pairs: run[method](pairs), args.repeats, device, samples)

    per_sample = {method: [statistics.median(times) for times in seconds[method]] for method in METHODS}
    base = per_sample["full logits"]
    rows = {method: {"median_s": statistics.median(per_sample[method]),
                     "ratio_to_full_logits": statistics.median(t / b for t, b in zip(per_sample[method], base))}
            for method in METHODS}
    old = [r for sample in results["full logits"] for r in sample]
    new = [r for sample in results["answer logits"] for r in sample]
    same_greedy = sum(a[1] == b[1] for a, b in zip(old, new))
    max_dlogprob = max(abs(a[0] - b[0]) for a, b in zip(old, new))
    tokens = [len(lm.tok_encode(pairs[0][0])) for pairs in samples]

    print(f"Attention Buckets ({len(bases)} bases) on {len(samples)} multi_needle held-out samples, "
          f"{args.dtype}, {torch.get_num_threads()} thread(s), prompts {min(tokens)}-{max(tokens)} tokens, "
          f"{args.repeats} repeats")
    print(f"{'method':<15} {'s / sample':>10} {'vs full logits':>15}")
    for method in METHODS:
        print(f"{method:<15} {rows[method]['median_s']:>10.3f} {rows[method]['ratio_to_full_logits']:>14.3f}x")
    speedup = 1 / rows["answer logits"]["ratio_to_full_logits"]
    print(f"answer logits / full logits: {speedup:.2f}x faster; agreement: {same_greedy}/{len(old)} is_greedy, "
          f"max |dlogprob| {max_dlogprob:.2g}")
    if args.json:
        atomic_write_json(args.json, {
            "dtype": args.dtype, "threads": torch.get_num_threads(), "samples": len(samples), "repeats": args.repeats,
            "bases": bases, "prompt_tokens": tokens, "methods": rows, "per_sample_s": per_sample,
            "agreement": {"is_greedy_same": same_greedy, "pairs": len(old), "max_abs_dlogprob": max_dlogprob}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
