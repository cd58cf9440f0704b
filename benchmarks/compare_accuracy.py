"""Accuracy by gold position for every method, side by side (the paper's Table 1 layout).

    python benchmarks/compare_accuracy.py --tasks kv_retrieval,mdqa --num-samples 50 \
        --lpes-scales results/smollm2/scales.json --moice-gates results/moice/smollm2.gates.pt \
        --json scratch/accuracy.json

Each method is an lm-eval model run through ``lm_eval.simple_evaluate`` on the held-out
split of the position tasks (``split=heldout``, never the samples a search saw), so the
numbers are what ``lm_eval --model <name> --tasks kv_retrieval`` reports:

    vanilla  hf        pretrained=<bundled>,gguf_file=...
    LPES     lpes_hf   scales=<file>
    PI       lpes_hf   scales=<file>,pi=true      (the mean of the LPES scales, uniform)
    Ms-PoE   mspoe_hf  (min_ratio=1.2,max_ratio=1.8)
    Buckets  buckets_hf
    MoICE    moice_hf  gates=<file>

Without ``--lpes-scales`` the LPES and PI rows are skipped (there is nothing to compare).

Every method sees the same held-out samples, so each is compared with vanilla sample by
sample: the table gives 95 % Wilson intervals and exact McNemar p-values per position and for
the average, and marks a difference only when it is significant (``lpes_harness.evaluation.paired``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lpes_harness.core.files import atomic_write_json, atomic_write_text
from lpes_harness.core.models import positive_int


def method_specs(lpes_scales: str | None, moice_gates: str | None) -> dict[str, tuple[str, dict]]:
    from lpes_harness.core.models import BUNDLED_GGUF, bundled_model_dir

    specs = {"vanilla": ("hf", {"pretrained": bundled_model_dir(), "gguf_file": BUNDLED_GGUF})}
    if lpes_scales:
        specs["LPES"] = ("lpes_hf", {"scales": lpes_scales})
        specs["PI"] = ("lpes_hf", {"scales": lpes_scales, "pi": True})
    specs["Ms-PoE"] = ("mspoe_hf", {})
    specs["Buckets"] = ("buckets_hf", {})
    specs["MoICE"] = ("moice_hf", {"gates": moice_gates} if moice_gates else {})
    return specs


def run_method(
    model: str, model_args: dict, tasks: list[str], metadata: dict, batch_size: int, device: str, chat_template: bool
) -> dict:
    import lm_eval

    args = dict(model_args, device=device, dtype="float32")
    return lm_eval.simple_evaluate(
        model=model,
        model_args=args,
        tasks=tasks,
        batch_size=batch_size,
        metadata=metadata,
        log_samples=True,  # per-sample scores: each method is paired with vanilla on the same samples
        apply_chat_template=chat_template,
    )


def save_results(results: dict, path: str) -> None:
    """lm-eval's results as its own CLI writes them (non-JSON values made printable)."""
    from lm_eval.utils import handle_non_serializable

    payload = {k: v for k, v in results.items() if k != "samples"}
    text = json.dumps(payload, indent=2, default=handle_non_serializable, ensure_ascii=False)
    atomic_write_text(path, text)


def paired_task_table(task: str, per_sample: dict[str, dict[int, list[float]]], num_samples) -> dict:
    """Intervals and paired tests against the first method (vanilla) on the same samples."""
    from lpes_harness.evaluation.paired_table import paired_table

    return paired_table({"task": task, "split": "heldout", "num_samples": num_samples, "scores": per_sample})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="kv_retrieval,mdqa", help="comma-separated position tasks")
    parser.add_argument("--num-samples", type=int, default=None, help="held-out samples per position (default: the task's)")
    parser.add_argument("--methods", default=None, help="comma-separated subset (default: all that apply)")
    parser.add_argument("--lpes-scales", default=None, help="an LPES scales file (enables the LPES and PI rows)")
    parser.add_argument("--moice-gates", default=None, help="a MoICE gates file (default: untrained routers)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--chat-template", action="store_true",
                        help="wrap prompts in the model's chat template (lm_eval --apply_chat_template); "
                             "the bundled instruct model needs it for mdqa")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="also write the scores here")
    parser.add_argument("--results-dir", default=None,
                        help="also write each method's lm-eval results to DIR/<method>/results.json "
                             "(what lpes-report reads: lpes-report vanilla=DIR/vanilla LPES=DIR/LPES ...)")
    args = parser.parse_args(argv)

    from lpes_harness.lmeval.tasks import position_scores

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    specs = method_specs(args.lpes_scales, args.moice_gates)
    if args.methods:
        wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in wanted if m not in specs]
        if unknown:
            parser.error(f"--methods: {', '.join(unknown)} not available; choose from {', '.join(specs)}")
        specs = {m: specs[m] for m in wanted}
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    metadata = {"split": "heldout"}
    if args.num_samples:
        metadata["num_samples"] = args.num_samples

    from lpes_harness.evaluation.paired import scores_from_lm_eval
    from lpes_harness.evaluation.paired_table import format_table, plot_table

    scores: dict[str, dict[str, dict[int, float]]] = {task: {} for task in tasks}
    per_sample: dict[str, dict[str, dict[int, list[float]]]] = {task: {} for task in tasks}
    seconds = {}
    for name, (model, model_args) in specs.items():
        started = time.time()
        results = run_method(model, model_args, tasks, metadata, args.batch_size, args.device, args.chat_template)
        seconds[name] = round(time.time() - started, 1)
        if args.results_dir:
            save_results(results, os.path.join(args.results_dir, name, "results.json"))
        for task in tasks:
            scores[task][name] = position_scores(results, task)
            per_sample[task][name] = scores_from_lm_eval(results, task)
        print(f"{name}: done in {seconds[name]} s", file=sys.stderr)

    tables = {}
    for task in tasks:
        tables[task] = paired_task_table(task, per_sample[task], args.num_samples)
        print(f"**{task}** (held-out, accuracy by gold position)\n")
        print(format_table(tables[task]))
        print()
        if args.json:
            plot_table(tables[task], os.path.splitext(args.json)[0] + f"_{task}.png")
    if args.json:
        payload = {
            "metadata": metadata,
            "chat_template": args.chat_template,
            "methods": {n: {"model": m, "model_args": a} for n, (m, a) in specs.items()},
            "seconds": seconds,
            "scores": {t: {n: {str(p): v for p, v in s.items()} for n, s in rows.items()} for t, rows in scores.items()},
            "per_sample": {t: {n: {str(p): v for p, v in s.items()} for n, s in rows.items()} for t, rows in per_sample.items()},
            "tables": tables,
        }
        atomic_write_json(args.json, payload, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
