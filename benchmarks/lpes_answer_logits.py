"""``lpes_hf``'s loglikelihood: HFLM's full-logits path against ``answer_logits=true``, side by side.

    OMP_NUM_THREADS=2 python benchmarks/lpes_answer_logits.py --pretrained gemma3-270m --questions 40 --repeats 2

One model load (``lpes_hf``, with ``--scales`` if given, ``batch_size`` as ``lm_eval`` would get
it). The requests are lm-eval's own: the task's ``build_all_requests`` for the first
``--questions`` questions of an MMLU subject (``mmlu_continuation_local_<subject>``, one request
per answer choice, from ``LPES_DATA``). Each repeat scores them all by

- ``full logits``: HFLM's ``loglikelihood``, ``lpes_hf``'s default (the output layer at every prompt
  position, over the whole vocabulary);
- ``answer logits``: ``answer_logits=true`` (the decoder over the prompt, the output layer only at
  the answer tokens).

The two alternate, the order reversed on every other repeat, so load on a shared machine hits
them alike. The table gives the median seconds per repeat and the ratio; the last line says
whether the two agree (the chosen answer of every question, ``is_greedy`` of every request, the
largest difference in log-probability).
"""

from __future__ import annotations

import statistics
import sys

import torch

from side_by_side import RUN_FLAGS, interleaved, model_flags, parse_flags  # this folder: on sys.path when run as a script

METHODS = ("full logits", "answer logits")

FLAGS = (  # flag, type, default, help
    *model_flags("bfloat16", "model (default: the bundled SmolLM2 GGUF; gemma3-270m for the 262k vocabulary)"),
    ("--scales", str, None, "lpes_hf scales (a file or a number); default none (vanilla)"),
    ("--subject", str, "high_school_physics", "MMLU subject (continuation form)"),
    ("--questions", int, 40, "questions of that subject (4 requests each)"),
    ("--batch-size", str, "16", "lpes_hf batch_size"),
    ("--repeats", int, 2, "interleaved repeats of the two paths"),
    *RUN_FLAGS,
)


def parse_args(argv):
    return parse_flags(__doc__.split("\n\n")[0], FLAGS, argv, positive=("--questions", "--repeats"))


def mmlu_requests(subject: str, questions: int) -> list:
    """lm-eval's loglikelihood instances for the first ``questions`` questions of the subject."""
    from lpes_harness.lmeval.tasks import load_task

    name = f"mmlu_continuation_local_{subject}"
    task = load_task(name)
    task.build_all_requests(limit=questions, rank=0, world_size=1)
    return list(task.instances)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from lm_eval.models.huggingface import HFLM

    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.lmeval.hflm import AnswerLogitsLoglikelihoodMixin

    try:  # before the model load: a wrong subject should not cost a minute
        requests = mmlu_requests(args.subject, args.questions)
    except KeyError:
        sys.exit(f"--subject {args.subject!r}: no task mmlu_continuation_local_{args.subject} "
                 "(the subjects are the task files in tasks/suites/mmlu_continuation_local/)")
    extra = {"scales": args.scales} if args.scales else {}
    lm = LPESLM(pretrained=args.pretrained, device=args.device, dtype=args.dtype, batch_size=args.batch_size, **extra)
    device = torch.device(lm.device)

    # The two implementations LPESLM.loglikelihood chooses between by `answer_logits`.
    run = {"full logits": lambda: HFLM.loglikelihood(lm, requests, disable_tqdm=True),
           "answer logits": lambda: AnswerLogitsLoglikelihoodMixin.loglikelihood(lm, requests, disable_tqdm=True)}
    timings, results = interleaved(METHODS, lambda method, _: run[method](), args.repeats, device)
    seconds = {method: timings[method][0] for method in METHODS}  # one workload: one list a method

    rows = {method: statistics.median(seconds[method]) for method in METHODS}
    old, new = results["full logits"][0], results["answer logits"][0]
    same_greedy = sum(a[1] == b[1] for a, b in zip(old, new))
    max_dlogprob = max(abs(a[0] - b[0]) for a, b in zip(old, new))
    by_doc = {}
    for request, a, b in zip(requests, old, new):
        by_doc.setdefault(request.doc_id, []).append((a[0], b[0]))
    same_choice = sum(max(range(len(v)), key=lambda i: v[i][0]) == max(range(len(v)), key=lambda i: v[i][1])
                      for v in by_doc.values())
    vocab = lm.model.get_output_embeddings().weight.shape[0]

    print(f"lpes_hf loglikelihood on {len(requests)} requests ({len(by_doc)} MMLU questions, {args.subject}), "
          f"{args.dtype}, batch {args.batch_size}, vocabulary {vocab}, {torch.get_num_threads()} thread(s), "
          f"{args.repeats} repeats")
    print(f"{'method':<15} {'s / repeat':>10} {'vs full logits':>15}")
    for method in METHODS:
        print(f"{method:<15} {rows[method]:>10.2f} {rows[method] / rows['full logits']:>14.3f}x")
    print(f"answer logits / full logits: {rows['full logits'] / rows['answer logits']:.2f}x faster; agreement: "
          f"{same_choice}/{len(by_doc)} chosen answers, {same_greedy}/{len(old)} is_greedy, max |dlogprob| {max_dlogprob:.2g}")
    if args.json:
        atomic_write_json(args.json, {
            "pretrained": args.pretrained, "scales": args.scales, "dtype": args.dtype, "batch_size": args.batch_size,
            "threads": torch.get_num_threads(), "subject": args.subject, "questions": len(by_doc),
            "requests": len(requests), "repeats": args.repeats, "vocabulary": vocab, "seconds": seconds,
            "median_s": rows, "agreement": {"same_choice": same_choice, "is_greedy_same": same_greedy,
                                            "max_abs_dlogprob": max_dlogprob}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
