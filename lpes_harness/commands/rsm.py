"""Representational-structure deviation: how far a set of layer scales moves the model's geometry.

For each prompt, the last token's hidden state after every decoder layer gives a layer x layer
cosine-similarity matrix; matrices are averaged over prompts. The deviation of a set of scales
is the mean absolute difference between its matrix and vanilla's (all scales 1).

The paper's claim: the searched, smooth Bezier scales keep the structure close to vanilla,
while perturbed versions of them move it further. Compared here:

- ``bezier``: the searched scales (``--scales FILE`` or ``--control-points``);
- ``uniform``: their mean on every layer;
- ``noisy``: each layer's scale plus U(-noise, +noise) (default 0.1);
- ``shuffled``: the same values in a random layer order;
- ``random``: every layer U(y_min, y_max), the search's range;

the last three over ``--seeds`` seeds (mean and standard deviation reported). The measure and the
variants are :mod:`lpes_harness.evaluation.representation_structure`'s.

    python -m lpes_harness.commands.rsm --control-points "0:1.5;10:1.2;20:1.8;29:1.4" --out results/analysis
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lpes_harness.commands import flags
from lpes_harness.evaluation.inputs import encode, load_model, prompts_from_args, write_results
from lpes_harness.evaluation.representation_structure import plot, run, scale_variants


def base_scales(args, n_layers: int) -> list[float]:
    from lpes_harness.core import curves, rope_factors
    from lpes_harness.core.scales_args import parse_scales

    if args.scales:
        return rope_factors.validate_scales(parse_scales(args.scales), n_layers)
    points = curves.parse_control_points(args.control_points)
    return curves.curve_scales(points, n_layers, curve=args.curve)


def main(argv: Sequence[str] | None = None) -> int:
    from lpes_harness.core import curves

    parser = flags.CommandParser(prog="python -m lpes_harness.commands.rsm", description=__doc__.splitlines()[0])
    flags.add_prompt_inputs(parser)
    parser.add_argument("--scales", default=None, help="the searched scales: a scales file, a number or a ';' list")
    parser.add_argument("--control-points", default=curves.EXAMPLE_CONTROL_POINTS, help="used when --scales is not given")
    parser.add_argument("--curve", default="bezier", help="curve through the control points (default bezier)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds for noisy/shuffled/random (default 3)")
    parser.add_argument("--noise", type=float, default=0.1, help="noisy: per-layer U(-noise, noise) (default 0.1)")
    parser.add_argument("--y-min", type=float, default=1.0, help="random: lower bound (default 1.0, the search's)")
    parser.add_argument("--y-max", type=float, default=2.0, help="random: upper bound (default 2.0, the search's)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or not 0 < args.y_min <= args.y_max:
        parser.error(f"need --seeds >= 1 and 0 < --y-min <= --y-max; got {args.seeds}, {args.y_min}, {args.y_max}")

    from lpes_harness.core import rope

    model, tokenizer = load_model(args)
    scales = base_scales(args, rope.num_layers(model))
    inputs = encode(tokenizer, prompts_from_args(args), args.max_tokens)
    results = run(model, inputs, scale_variants(scales, range(args.seeds), args.y_min, args.y_max, args.noise))
    json_path, png_path = write_results(Path(args.out), "rsm", results, plot)
    for name, entry in results["variants"].items():
        print(f"{name:>9}: deviation {entry['mean']:.4f} ± {entry['std']:.4f} over {len(entry['deviations'])} run(s)")
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
