"""Does LPES add latency? Vanilla vs LPES on the same loaded model, side by side in one run.

Two workloads, each repeated (at least 10 times), with vanilla and LPES runs interleaved
(A B A B ..., alternating which of the pair goes first) so that machine drift hits both alike;
CUDA is synchronised around every timed call:

- prefill: one forward over a ~2k-token prompt;
- generation: 32 new tokens with the KV cache (greedy, after a short prompt).

For each workload it reports the median time of each mode with its 10-90 % spread over the
repeats, and the median of the paired ratios (LPES / vanilla of the same repeat) with their
10-90 % spread: the paired ratio is what a busy machine blurs least.

LPES uses a Bézier curve whose every layer has a distinct scale, the worst case for
the hooks (one extra (cos, sin) per layer). The paper's claim is a ratio of 1.00x.

    python benchmarks/overhead.py                       # bundled SmolLM2, CPU
    python benchmarks/overhead.py --pretrained <id-or-dir> --device cuda
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from lpes_harness.core import curves, rope
from lpes_harness.core.models import load_causal_lm, positive_int


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrained", default=None, help="HF id, local dir or .gguf path (default: bundled SmolLM2)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--attn", default=None, help="attention implementation: sdpa, eager, flash_attention_2")
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--gen-prompt-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10, help="timed pairs per workload (at least 10)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--control-points", default="0:1.5;10:1.2;20:1.8;29:1.4",
                        help="LPES curve (x rescaled to the model's depth)")
    parser.add_argument("--json", default=None, help="also write the measurements to this JSON file")
    args = parser.parse_args()
    if args.repeats < 10:
        parser.error(f"--repeats {args.repeats}: give at least 10, so that the 10-90 % spread means something")
    return args


def spread(values: list[float]) -> dict:
    """Median and the 10-90 % spread (shared with the other benchmarks)."""
    from lpes_harness.evaluation.stats import median_spread

    return median_spread(values)


def curve_for_depth(text: str, num_layers: int) -> list[float]:
    points = curves.parse_control_points(text)
    last_x = points[-1][0]
    rescaled = [(round(x * (num_layers - 1) / last_x), y) for x, y in points]
    return curves.curve_scales(rescaled, num_layers, curve="bezier")


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_call(fn, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_causal_lm(args.pretrained, device=args.device, dtype=args.dtype, attn_implementation=args.attn)
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prefill_ids = torch.randint(100, vocab - 1, (1, args.prefill_tokens), generator=generator).to(device)
    gen_ids = torch.randint(100, vocab - 1, (1, args.gen_prompt_tokens), generator=generator).to(device)
    n_layers = rope.num_layers(model)
    scales = curve_for_depth(args.control_points, n_layers)

    def prefill():
        with torch.no_grad():
            model(prefill_ids, use_cache=False)

    def generate():
        with torch.no_grad():
            model.generate(gen_ids, max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens,
                           do_sample=False, pad_token_id=0)

    def set_mode(mode):
        if mode == "lpes":
            rope.install(model, scales)
        else:
            rope.remove(model)

    timings = {(work, mode): [] for work in ("prefill", "generate") for mode in ("vanilla", "lpes")}
    for mode in ("vanilla", "lpes"):  # warm-up, not timed
        set_mode(mode)
        prefill()
        generate()
    for repeat in range(args.repeats):
        # Alternate which mode goes first, so that neither always inherits the other's
        # cache state (or a burst of load from elsewhere on the machine).
        order = ("vanilla", "lpes") if repeat % 2 == 0 else ("lpes", "vanilla")
        for work, fn in (("prefill", prefill), ("generate", generate)):
            for mode in order:
                set_mode(mode)
                fn()  # untimed: the first call after a switch pays for the allocator's re-shuffle
                timings[(work, mode)].append(time_call(fn, device))
    rope.remove(model)

    print(f"model: {model.config.model_type}, {n_layers} layers, device {device}, dtype {args.dtype}, "
          f"threads {torch.get_num_threads()}")
    print(f"LPES scales: min {min(scales):.3f} max {max(scales):.3f} ({len(set(scales))} distinct)")
    print(f"{args.repeats} interleaved pairs per workload; medians with their 10-90 % spread")
    print(f"{'workload':<34}{'vanilla s (10-90 %)':>26}{'LPES s (10-90 %)':>26}{'paired ratio (10-90 %)':>28}")
    report = {"device": str(device), "dtype": args.dtype, "threads": torch.get_num_threads(), "repeats": args.repeats,
              "num_layers": n_layers, "distinct_scales": len(set(scales))}
    for work, label in (("prefill", f"prefill {args.prefill_tokens} tokens"),
                        ("generate", f"generate {args.gen_tokens} tokens (KV cache)")):
        vanilla, lpes = timings[(work, "vanilla")], timings[(work, "lpes")]
        ratios = [b / a for a, b in zip(vanilla, lpes)]
        v, l, r = spread(vanilla), spread(lpes), spread(ratios)
        report[work] = {"vanilla_s": v, "lpes_s": l, "paired_ratio": r, "ratio_of_medians": l["median"] / v["median"],
                        "vanilla_all": vanilla, "lpes_all": lpes}
        print(f"{label:<34}{v['median']:>10.4f} ({v['p10']:.4f}-{v['p90']:.4f})"
              f"{l['median']:>10.4f} ({l['p10']:.4f}-{l['p90']:.4f})"
              f"{r['median']:>13.3f}x ({r['p10']:.3f}-{r['p90']:.3f})")
    print(f"overhead ratio: prefill {report['prefill']['paired_ratio']['median']:.3f}x "
          f"generate {report['generate']['paired_ratio']['median']:.3f}x "
          f"(median paired ratio of {args.repeats}; target <= 1.02x)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
