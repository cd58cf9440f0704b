"""A race prompt asked about each of its needles: one forward a question, and one forward of the shared text, side by side.

    python benchmarks/race_every_item.py --samples 6 --repeats 2 --dtype bfloat16 --threads 2

One model load (``lpes_hf`` on the bundled SmolLM2 unless ``--pretrained``, scaled by ``--scales``: by default
the committed seed 4 default curve, so the scaled rotary path runs on the cached tokens too). A sample is what
``lpes-search --every-item`` races on: a ``multi_needle`` prompt of the search split, its length drawn from 60
to 300 sentences by ``--seed`` (as the race draws them), with the same prompt asked about each of its other
needles (:func:`lpes_harness.search.gradient_samples.position_question_groups`). Each is scored by

- ``each alone``: :func:`~lpes_harness.search.gradient.answer_log_probs` of every question, one full forward each
  (what asking every item would cost without sharing);
- ``shared``: :func:`~lpes_harness.search.shared_prefix.group_log_probs`, what the race runs: the shared text once
  into a KV cache, each question's own tokens on top;

and, to show what the shared text's forward spends on the output layer, that forward alone twice:

- ``prefix, every logit``: the shared tokens with the vocabulary projection at every position (the race's
  forward before it asked for one);
- ``prefix, last logit``: the same forward with ``logits_to_keep=1`` (the race's forward now).

Interleaved per sample and repeat, the order reversed on every other repeat. The table gives the median
seconds per sample and the median per-sample ratio to ``each alone``; the last lines say whether ``shared``
agrees with ``each alone`` (the largest difference of an answer log-probability) and the prefix's two
forwards' ratio.
"""

from __future__ import annotations

import statistics
import sys

import torch

# this folder: on sys.path when run as a script
from side_by_side import RUN_FLAGS, interleaved, model_flags, parse_flags, per_sample_medians, scaled_lm

METHODS = ("each alone", "shared", "prefix, every logit", "prefix, last logit")
DEFAULT_CURVE = "results/every_item_smollm2_seed4/scales.json"  # from the repository's root

FLAGS = (  # flag, type, default, help
    *model_flags("bfloat16"),
    ("--scales", str, None, "lpes_hf scales (default: the committed seed 4 default curve, for the bundled model run "
                            "from the repository root; else 1)"),
    ("--samples", int, 6, "race prompts, each asked about every needle"),
    ("--repeats", int, 2, "interleaved repeats of the paths"),
    ("--seed", int, 4, "the seed the prompts' lengths and gold positions are drawn from"),
    *RUN_FLAGS,
)


def parse_args(argv):
    return parse_flags(__doc__.split("\n\n")[0], FLAGS, argv, positive=("--samples", "--repeats"))


def race_groups(lm, samples: int, seed: int) -> list:
    """The race's first ``samples`` question groups for ``seed``, built as ``lpes-search --every-item`` builds them."""
    from lpes_harness.search.drawn_conditions import ConditionRange, draw_conditions
    from lpes_harness.search.gradient_samples import position_question_groups

    conditions = draw_conditions(seed, samples, ConditionRange((60, 300)))
    return position_question_groups(lm, "multi_needle", "search", conditions, [0, 25, 50, 75, 100], seed)


def main(argv=None) -> int:
    args = parse_args(argv)
    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.search.gradient import _device, answer_log_probs
    from lpes_harness.search.shared_prefix import group_log_probs, shared_length

    lm, scales = scaled_lm(args, DEFAULT_CURVE)
    groups = race_groups(lm, args.samples, args.seed)
    device = torch.device(lm.device)

    def prefix(group, keep: int):
        ids = torch.tensor([group[0].prompt[:shared_length(group)]], device=_device(lm.model))
        return lm.model(ids, use_cache=True, logits_to_keep=keep).logits.shape[1]

    paths = {
        "each alone": lambda group: [answer_log_probs(lm.model, sample) for sample in group],
        "shared": lambda group: group_log_probs(lm.model, group),
        "prefix, every logit": lambda group: prefix(group, 0),
        "prefix, last logit": lambda group: prefix(group, 1),
    }
    with torch.no_grad():
        for method in METHODS:  # warm-up of every path on the first sample
            paths[method](groups[0])
        seconds, results = interleaved(METHODS, lambda method, group: paths[method](group), args.repeats, device,
                                       groups)

    per_sample, rows = per_sample_medians(seconds, "each alone")
    gold = lambda logprobs, sample: sum(float(logprobs[i, t]) for i, t in enumerate(sample.answer))
    differences = [abs(gold(a, s) - gold(b, s)) for group, alone, shared in
                   zip(groups, results["each alone"], results["shared"]) for s, a, b in zip(group, alone, shared)]
    prefix_ratio = statistics.median(a / b for a, b in zip(per_sample["prefix, every logit"],
                                                           per_sample["prefix, last logit"]))
    tokens = [len(group[0].prompt) for group in groups]
    questions = sum(map(len, groups))

    print(f"multi_needle search split, {len(groups)} race prompts ({questions} questions; prompts of "
          f"{min(tokens)}-{max(tokens)} tokens), scales {scales or 1}, {args.dtype}, {torch.get_num_threads()} "
          f"thread(s), {args.repeats} repeats")
    print(f"{'path':<20} {'s / prompt':>10} {'vs each alone':>14}")
    for method in METHODS:
        row = rows[method]
        print(f"{method:<20} {row['median_s']:>10.3f} {row['ratio_to_each_alone']:>13.3f}x")
    print(f"shared / each alone: {rows['shared']['ratio_to_each_alone']:.3f}x the time; agreement: max |d gold "
          f"log-probability| {max(differences):.2g} over {len(differences)} questions")
    print(f"the shared text's forward with every logit / with the last: {prefix_ratio:.3f}x")
    if args.json:
        atomic_write_json(args.json, {
            "dtype": args.dtype, "threads": torch.get_num_threads(), "samples": len(groups), "questions": questions,
            "repeats": args.repeats, "seed": args.seed, "scales": scales, "prompt_tokens": tokens, "methods": rows,
            "per_sample_s": per_sample, "max_abs_gold_logprob_difference": max(differences),
            "prefix_every_over_last": prefix_ratio})
    return 0


if __name__ == "__main__":
    sys.exit(main())
