"""Attention to the middle: the last token's attention mass on the middle third of the context.

For each uniform scale (1 = vanilla) and each prompt, and for every decoder layer, the share of
the last query's attention (averaged over heads) that falls on tokens ``[n // 3, 2n // 3)`` of
an ``n``-token prompt: ``attention.json`` and ``attention.png`` in ``--out``. How it is computed
(one query row per layer, by hooks; full causal attention assumed) is
:mod:`lpes_harness.evaluation.middle_attention`.

    python -m lpes_harness.commands.attention --uniform-scales 1,1.2,1.5,2 --out results/analysis
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lpes_harness.commands import flags
from lpes_harness.evaluation.inputs import encode, load_model, prompts_from_args, write_results
from lpes_harness.evaluation.middle_attention import plot, run


def parse_scale_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.replace(";", ",").split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--uniform-scales {text!r}: give numbers separated by commas, e.g. 1,1.2,1.5,2") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"--uniform-scales {text!r}: give one or more positive numbers, e.g. 1,1.2,1.5,2")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = flags.CommandParser(prog="python -m lpes_harness.commands.attention", description=__doc__.splitlines()[0])
    flags.add_prompt_inputs(parser)
    parser.add_argument("--uniform-scales", default="1,1.2,1.5,2", help="comma-separated uniform scales (default 1,1.2,1.5,2)")
    args = parser.parse_args(argv)
    try:
        scales = parse_scale_list(args.uniform_scales)
    except ValueError as err:
        parser.error(str(err))
    model, tokenizer = load_model(args)
    inputs = encode(tokenizer, prompts_from_args(args), args.max_tokens)
    results = run(model, inputs, scales)
    json_path, png_path = write_results(Path(args.out), "attention", results, plot)
    for scale, entry in results["scales"].items():
        print(f"scale {float(scale):g}: middle-third mass {entry['mean_over_layers']:.4f} (mean over layers)")
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
