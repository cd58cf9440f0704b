"""``lpes_hf``'s greedy generation: HFLM's path against ``prefix_cache=true``, side by side, on L-Eval.

    python benchmarks/prefix_generation.py --task leval_tpo --documents 2 --questions 4 --dtype float32 --threads 2

One model load (``lpes_hf`` at batch size 1, ``--scales`` if given). The requests are lm-eval's
own: the task's ``build_all_requests``, kept for the first ``--questions`` questions of each of
its first ``--documents`` texts (L-Eval asks 5 to 50 questions of each text, and every question's
prompt repeats it; the task orders them round-robin over the texts, so ``--limit`` would ask one
question of each; from ``LPES_DATA``). Each repeat generates them all by

- ``each whole``: HFLM's ``generate_until``, ``lpes_hf``'s default (every prompt through the
  whole decoder);
- ``shared prefixes``: ``prefix_cache=true`` (the prompts in lexicographic order on one KV cache,
  cut back to what the next one shares; :mod:`lpes_harness.lmeval.prefix_generation`).

The two alternate, the order reversed on every other repeat, so load on a shared machine hits
them alike. The table gives the median seconds per repeat, the ratio, and the tokens the decoder
ran (prompt tokens and one per generated token); the last line says whether the continuations
agree (identical text), as the card's L-Eval rows need them to.

``--count-only`` generates nothing: for every question of every text of each task in ``--task``
(a comma-separated list; ``--documents`` and ``--questions`` do not apply), the prompt tokens run
each whole and with shared prefixes, counted by the sharing path's own order and cut-back rule
(:func:`lpes_harness.lmeval.prefix_generation.prompt_tokens_run`), in seconds instead of hours:

    python benchmarks/prefix_generation.py --count-only --task leval_coursera,leval_quality,leval_tpo,leval_sci_fi
"""

from __future__ import annotations

import statistics
import sys

import torch

# this folder: on sys.path when run as a script
from side_by_side import RUN_FLAGS, DecoderTokens, interleaved, model_flags, parse_flags

METHODS = ("each whole", "shared prefixes")

FLAGS = (  # flag, type, default, help
    *model_flags("float32"),
    ("--scales", str, None, "lpes_hf scales (a file or a number); default none (vanilla)"),
    ("--task", str, "leval_tpo", "a generate_until task (L-Eval: leval_coursera, leval_quality, leval_tpo, leval_sci_fi)"),
    ("--documents", int, 2, "the task's first texts"),
    ("--questions", int, 4, "the first questions of each text (SFiction asks each twice: with the text and without)"),
    ("--repeats", int, 1, "interleaved repeats of the two paths"),
    ("--count-only", bool, False, "generate nothing: count the prompt tokens each path runs, over every question of "
                                  "every text of each task in --task (comma-separated)"),
    *RUN_FLAGS,
)


def parse_args(argv):
    return parse_flags(__doc__.split("\n\n")[0], FLAGS, argv, positive=("--documents", "--questions", "--repeats"))


def task_requests(name: str, documents: int | None, questions: int | None) -> list:
    """lm-eval's generate_until instances for the first ``questions`` questions of the first ``documents``
    texts (None: all of them)."""
    from lpes_harness.lmeval.tasks import load_task

    task = load_task(name)
    if task.OUTPUT_TYPE != "generate_until":
        raise ValueError(f"--task {name}: its requests are {task.OUTPUT_TYPE}, not generate_until")
    task.build_all_requests(rank=0, world_size=1)
    if not all({"doc_index", "question_index"} <= set(instance.doc) for instance in task.instances):
        raise ValueError(f"--task {name}: its docs do not say which text they ask about (doc_index, question_index: "
                         "the L-Eval tasks do)")
    return [instance for instance in task.instances
            if (documents is None or instance.doc["doc_index"] < documents)
            and (questions is None or instance.doc["question_index"] < questions)]


def requests_or_exit(name: str, documents: int | None, questions: int | None) -> list:
    """:func:`task_requests`, or the reason it has none as the command's one-line error."""
    try:
        return task_requests(name, documents, questions)
    except KeyError:
        sys.exit(f"--task {name!r}: no such task (lm_eval ls tasks lists them)")
    except ValueError as error:
        sys.exit(str(error))


def count_only(args) -> int:
    """``--count-only``: each task's prompt tokens, each whole and shared; no generation."""
    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.lmeval.prefix_generation import prompt_tokens_run, why_not_shared

    names = [name.strip() for name in args.task.split(",") if name.strip()]
    if not names:
        sys.exit("--task names no task (give one or more, comma-separated)")
    requests = {name: requests_or_exit(name, None, None) for name in names}  # all checked before the model load
    lm = LPESLM(pretrained=args.pretrained, device=args.device, dtype=args.dtype, batch_size=1)
    rows = {}
    for name, asked in requests.items():
        reason = why_not_shared(lm, asked)
        whole, run = prompt_tokens_run(lm, asked)
        rows[name] = {"requests": len(asked), "prompt_tokens": whole, "shared_run": whole if reason else run,
                      "not_shared": reason}
    total = {"requests": sum(r["requests"] for r in rows.values()),
             "prompt_tokens": sum(r["prompt_tokens"] for r in rows.values()),
             "shared_run": sum(r["shared_run"] for r in rows.values())}
    print("prompt tokens the decoder runs, each prompt whole and with prefix_cache=true (counted, nothing generated)")
    print(f"{'task':<24} {'requests':>8} {'each whole':>11} {'shared':>10} {'share':>7}")
    for name, row in [*rows.items(), ("all", total)]:
        note = f"  (not shared: {row['not_shared']})" if row.get("not_shared") else ""
        print(f"{name:<24} {row['requests']:>8} {row['prompt_tokens']:>11} {row['shared_run']:>10} "
              f"{row['shared_run'] / max(1, row['prompt_tokens']):>6.1%}{note}")
    if args.json:
        atomic_write_json(args.json, {"pretrained": args.pretrained, "count_only": True, "tasks": rows, "all": total})
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.count_only:
        return count_only(args)
    from lm_eval.models.huggingface import HFLM

    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.lmeval.prefix_generation import generate_sharing_prefixes, prompt_tokens_run, why_not_shared

    # before the model load: a wrong task should not cost a minute
    requests = requests_or_exit(args.task, args.documents, args.questions)
    extra = {"scales": args.scales} if args.scales else {}
    lm = LPESLM(pretrained=args.pretrained, device=args.device, dtype=args.dtype, batch_size=1, **extra)
    reason = why_not_shared(lm, requests)
    if reason is not None:
        sys.exit(f"prefix_cache cannot share these prompts on this model: {reason}")
    device = torch.device(lm.device)
    tokens = DecoderTokens(lm.model)

    # The two implementations LPESLM.generate_until chooses between by `prefix_cache`, each with its
    # progress bar on stderr (a path of Gemma-3 on L-Eval runs for minutes: silence would look like a hang).
    paths = {"each whole": lambda: HFLM.generate_until(lm, requests, disable_tqdm=False),
             "shared prefixes": lambda: generate_sharing_prefixes(lm, requests, disable_tqdm=False)}

    def run(method, _):
        tokens.count = 0
        return paths[method](), tokens.count

    timings, results = interleaved(METHODS, run, args.repeats, device)
    seconds = {method: timings[method][0] for method in METHODS}  # one workload: one list a method
    tokens.remove()

    rows = {method: {"median_s": statistics.median(seconds[method]), "tokens": results[method][0][1]}
            for method in METHODS}
    whole, shared = results["each whole"][0][0], results["shared prefixes"][0][0]
    same = sum(a == b for a, b in zip(whole, shared))
    prompt_tokens = sum(len(lm.tok_encode(request.args[0])) for request in requests)
    counted_whole, counted_shared = prompt_tokens_run(lm, requests)  # --count-only's count, beside the measured

    print(f"lpes_hf generate_until on {len(requests)} requests of {args.task} ({prompt_tokens} prompt tokens before "
          f"truncation), scales {args.scales or 1}, {args.dtype}, batch 1, {torch.get_num_threads()} thread(s), "
          f"{args.repeats} repeat(s)")
    print(f"{'method':<15} {'s / repeat':>10} {'vs each whole':>14} {'tokens run':>11}")
    for method in METHODS:
        row = rows[method]
        print(f"{method:<15} {row['median_s']:>10.2f} {row['median_s'] / rows['each whole']['median_s']:>13.3f}x "
              f"{row['tokens']:>11}")
    print(f"shared prefixes / each whole: {rows['shared prefixes']['median_s'] / rows['each whole']['median_s']:.3f}x "
          f"the time, {rows['shared prefixes']['tokens'] / rows['each whole']['tokens']:.3f}x the tokens; "
          f"agreement: {same}/{len(whole)} identical continuations")
    if args.json:
        atomic_write_json(args.json, {
            "pretrained": args.pretrained, "scales": args.scales, "dtype": args.dtype, "task": args.task,
            "documents": args.documents, "questions": args.questions, "threads": torch.get_num_threads(),
            "requests": len(requests), "prompt_tokens": prompt_tokens,
            "counted": {"each whole": counted_whole, "shared prefixes": counted_shared},
            "repeats": args.repeats, "seconds": seconds, "methods": rows,
            "agreement": {"identical": same, "continuations": len(whole)}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
