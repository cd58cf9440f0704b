"""Find a model's positional hidden channels and write ``poshidden_hf``'s setting file.

    python -m lpes_harness.commands.poshidden_channel --out results/poshidden/smollm2.json
    python -m lpes_harness.commands.poshidden_channel --out FILE --select-task multi_needle --select-samples 2
    lm_eval --model poshidden_hf --model_args setting=FILE ...

The authors' search (PositionalHidden/PositionalHidden, ``experiments/search_dimension/``), step by step:

1. **Average hidden states over meaningless text**: ``--samples`` sequences of ``--length`` tokens
   drawn uniformly from the vocabulary (special tokens left out; the reference reads a file of
   random characters, 250 x 1000 tokens), every layer's output averaged per position: ``(L, T, H)``.
2. **Monotone layers** of each channel: in layers 2 .. L-2, the channel's mean over positions
   ``skip_fit`` .. T (30 %, the reference's 300 of 1000), min-max normalised, fitted by a cubic;
   monotone where the fit only rises (or only falls). A channel's count is the larger of its
   rising and falling layers; channels monotone in more than ``L // 4`` layers are kept.
3. **Smoothness**: the minimum over those layers of the summed squared second difference of the
   normalised, Savitzky-Golay-smoothed (window 10, order 3) curve from ``skip_smooth`` (20 %) on;
   the ``--top-k`` smoothest channels are the candidates, the smoothest first.
4. **Selection** (``--select-task``; the paper's "small retrieval set"): each of the ``--select-top``
   first candidates with each factor of ``--factors`` (the paper's 0.5, 0, -0.5, -1) scored by the
   mean log-probability of the gold answer (the reference's validation loss) on ``--select-samples``
   samples per gold position of the task's search split; the best pair is written (with the plain
   model's score beside it, and whether the pair beats it). Without it the file holds the
   smoothest channel and factor 0 (the reference's default).

The file (JSON, ``format: lpes-poshidden/1``): ``channels``, ``layers`` (the middle band,
:func:`~lpes_harness.methods.poshidden.default_layers`), ``factor``, ``factor_candidates``, the
ranked ``candidates`` with their statistics, the model's ``hidden_size`` / ``num_layers`` (a file
for another model is refused) and the settings that made it.

The statistic and the selection are :mod:`lpes_harness.evaluation.poshidden_channels`'s; this module
parses the flags, loads the model and writes the file.
"""

from __future__ import annotations

import argparse
import sys

from lpes_harness.evaluation.poshidden_channels import (
    SKIP_FIT, SKIP_SMOOTH, build_setting, mean_hidden_states, random_token_ids, rank_channels, select,
)
from lpes_harness.commands import flags
from lpes_harness.methods import poshidden
from lpes_harness.methods.arguments import MethodError


def parse_args(argv=None) -> argparse.Namespace:
    parser = flags.CommandParser(prog="python -m lpes_harness.commands.poshidden_channel",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the setting file to write (JSON)")
    flags.add_pretrained(parser, gguf_file=True)
    flags.add_dtype(parser, "float32")  # the channels' statistics, measured as the reference did
    flags.add_device(parser)
    parser.add_argument("--samples", type=int, default=32, help="random sequences averaged (reference: 250)")
    parser.add_argument("--length", type=int, default=1000, help="tokens per sequence (reference: 1000)")
    parser.add_argument("--batch-size", type=int, default=1)
    flags.add_seed(parser)
    parser.add_argument("--top-k", type=int, default=10, help="candidates kept, the smoothest first (reference: 10)")
    parser.add_argument("--select-task", default=None, help="position task to choose channel and factor on (e.g. multi_needle)")
    parser.add_argument("--select-samples", type=int, default=2, help="search-split samples per gold position")
    parser.add_argument("--select-top", type=int, default=3, help="candidates tried (reference: top 3 by loss)")
    parser.add_argument("--factors", default=";".join(f"{f:g}" for f in poshidden.FACTOR_CANDIDATES))
    flags.add_metadata(parser)  # of --select-task
    args = parser.parse_args(argv)
    for name in ("samples", "length", "batch_size", "top_k", "select_samples", "select_top"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        args.factors = [poshidden.FACTOR.check(f, "--factors") for f in args.factors.replace(",", ";").split(";") if f.strip()]
    except MethodError as err:
        parser.error(str(err))
    return args


def main(argv=None) -> int:
    import json

    from lpes_harness.core.files import atomic_write_json
    from lpes_harness.lmeval.method_models import PosHiddenLM
    from lpes_harness.core.models import load_causal_lm

    args = parse_args(argv)
    metadata = json.loads(args.metadata) if args.metadata else None
    model, tokenizer = load_causal_lm(args.pretrained, args.gguf_file, dtype=args.dtype, device=args.device,
                                      attn_implementation="sdpa")
    config = model.config.get_text_config()
    ids = random_token_ids(len(tokenizer), args.samples, args.length, args.seed, tokenizer.all_special_ids)
    print(f"{args.samples} random sequences of {args.length} tokens through {config.num_hidden_layers} layers")
    mean = mean_hidden_states(model, ids, args.batch_size)
    ranked = rank_channels(mean, args.top_k)
    print("candidates (smoothest first): " + ", ".join(f"{c['channel']} ({c['direction']}, {len(c['monotone_layers'])} layers)"
                                                        for c in ranked))
    selection = None
    if args.select_task and ranked:
        lm = PosHiddenLM(pretrained=model, tokenizer=tokenizer, channels=ranked[0]["channel"], factor=0,
                         device=str(model.device), batch_size=1)
        selection = select(lm, [c["channel"] for c in ranked[: args.select_top]], args.factors, args.select_task,
                           args.select_samples, metadata)
    settings = {"pretrained": args.pretrained or "smollm2", "samples": args.samples, "length": args.length,
                "seed": args.seed, "dtype": args.dtype, "device": str(model.device), "skip_fit": SKIP_FIT,
                "skip_smooth": SKIP_SMOOTH,
                "top_k": args.top_k, "random_text": "uniform token ids, special tokens excluded"}
    setting = build_setting(ranked, config.num_hidden_layers, config.hidden_size, settings, selection)
    atomic_write_json(args.out, setting, indent=1)
    print(f"wrote {args.out}: channels {setting['channels']}, factor {setting['factor']:g}, layers "
          f"{setting['layers'][0]}..{setting['layers'][-1]}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MethodError as err:
        sys.exit(f"poshidden_channel: error: {err}")
