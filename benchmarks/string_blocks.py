"""STRING's attention in blocks of queries against one block, beside the plain model, in one run.

    python benchmarks/string_blocks.py --pretrained gemma3-270m --dtype bfloat16 --num-docs 20

``string_hf`` computes its attention by hand (each key scored with the query rotation its distance
calls for). In one block of every query, both rotations are scored against nearly every key: two
score matrices of the whole square. In blocks of ``string_shift.QUERY_BLOCK`` queries, each block
scores only the keys it may see (the causal triangle) and each key once, but in a band as wide as
the block. This times the prefill (one forward over an MDQA-shaped prompt, logits at its last
position) of the plain model, STRING in one block and STRING in blocks, interleaved (the order
reversed every other repeat), and gives the median paired ratios to the plain model; it also checks
that both ways give the same last logits, to float rounding.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys

import torch
from latency import mdqa_prompts, spread, time_prefill
from transformers import DynamicCache

from lpes_harness.methods import string_shift
from lpes_harness.core.models import cache_keyword, load_causal_lm, machine_description, positive_int

WAYS = ("plain model", "STRING, one block", "STRING, blocks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", default=None, help="model (default: the bundled SmolLM2 GGUF)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--num-docs", type=int, default=20, help="passages in the MDQA-shaped prompt")
    parser.add_argument("--shifted-offset", type=int, default=512)
    parser.add_argument("--local-window", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10, help="timed repeats of each way (at least 10)")
    parser.add_argument("--threads", type=positive_int, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 10:
        parser.error(f"--repeats {args.repeats}: give at least 10, so that the 10-90 % spread means something")
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_causal_lm(args.pretrained, dtype=args.dtype, attn_implementation="sdpa")
    input_ids = tokenizer(mdqa_prompts(1, args.num_docs)[0], return_tensors="pt")["input_ids"].to(model.device)
    length = int(input_ids.shape[1])

    def next_logits(ids, mask, positions, cache):
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                     **{cache_keyword(model): cache}).logits[:, -1]

    blocks = {"plain model": None, "STRING, one block": length, "STRING, blocks": string_shift.QUERY_BLOCK}

    @contextlib.contextmanager
    def installed(way: str):
        """STRING installed at the way's block size (the plain model: nothing installed)."""
        if blocks[way] is None:
            yield
            return
        string_shift.QUERY_BLOCK = blocks[way]
        string_shift.install(model, shifted_offset=args.shifted_offset, local_window=args.local_window)
        try:
            yield
        finally:
            string_shift.remove(model)
            string_shift.QUERY_BLOCK = blocks["STRING, blocks"]

    def last_logits(way: str) -> torch.Tensor:
        with installed(way), torch.no_grad():
            return next_logits(input_ids, torch.ones_like(input_ids), torch.arange(length)[None],
                               DynamicCache(config=model.config)).float()

    def run(way: str) -> float:
        with installed(way):
            return time_prefill(model, next_logits, input_ids)

    difference = (last_logits("STRING, one block") - last_logits("STRING, blocks")).abs().max().item()
    print(f"one prompt of {length} tokens, S = {args.shifted_offset}, W = {args.local_window}, blocks of "
          f"{blocks['STRING, blocks']} queries, {args.dtype}, {torch.get_num_threads()} threads, on "
          f"{machine_description(str(model.device))}; largest difference of the last logits, one block against "
          f"blocks: {difference:.2e}", file=sys.stderr)
    for way in WAYS:
        run(way)  # warm-up, not timed
    times = {way: [] for way in WAYS}
    for repeat in range(args.repeats):
        for way in WAYS if repeat % 2 == 0 else WAYS[::-1]:
            times[way].append(run(way))
    print("| way | median prefill s (10-90 %) | paired ratio to the plain model (10-90 %) |\n|---|---:|---:|")
    for way in WAYS:
        t = spread(times[way])
        r = spread([a / b for a, b in zip(times[way], times["plain model"])])
        print(f"| {way} | {statistics.median(times[way]):.3f} ({t['p10']:.3f}-{t['p90']:.3f}) "
              f"| {r['median']:.2f}x ({r['p10']:.2f}-{r['p90']:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
