"""Which layers a curve moves, by attention type, and the curve kept on one type only (issue #29).

Gemma-3 alternates five sliding-window layers (a 512-token window, RoPE base 1e4) with one
global layer (base 1e6). A position bias over a 2k-token haystack can only be fixed where a
layer sees the whole haystack, so the question is whether the searched curve moves the global
layers, the sliding ones, or both, and whether scaling the global layers alone keeps the gain.

    python -m lpes_harness.commands.layer_types --scales results/<run>/scales.json \\
        --pretrained gemma3-270m --output results/<run>/layer_types

writes ``layer_types.{md,json,png}`` (each type's scales and how far they move from 1) and one
scales file per ablation, ``only_<type>.json`` (the other types' layers at 1), for
``python -m lpes_harness.commands.paired --scales lpes=... --scales only_full_attention=...``.
A curve of scaling both is reported half by half (position factors, base factors), and its
ablations keep both halves on the type. Reads the model's config only (no weights).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from lpes_harness.commands import flags
from lpes_harness.core.files import atomic_write_json, atomic_write_text
from lpes_harness.core.scales_file import ScalesError, read_scales_and_scaling, write_scales_file
from lpes_harness.core.scaling import DEFAULT, SCALINGS
from lpes_harness.evaluation.layer_types import by_type, kept_on, model_layer_types, plot_layer_types, report_markdown


def build_parser() -> argparse.ArgumentParser:
    p = flags.CommandParser(
        prog="python -m lpes_harness.commands.layer_types",
        description="Report a scales curve by attention layer type (sliding vs global) and write "
                    "one ablation scales file per type (the other layers at 1).",
    )
    p.add_argument("--scales", required=True, help="a scales file (lpes-scales/1 or a JSON list)")
    flags.add_pretrained(p)
    p.add_argument("--output", type=flags.output_folder, required=True, help="folder for layer_types.{md,json,png} and only_<type>.json")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        scales, scaling = read_scales_and_scaling(args.scales)
        scaling = scaling or DEFAULT  # the ablation files scale the same thing
    except ScalesError as err:
        raise SystemExit(f"layer_types: error: {err}") from None
    from lpes_harness.core.models import BundledModelMissing

    try:
        layer_types = model_layer_types(args.pretrained)
    except (BundledModelMissing, OSError) as err:
        raise SystemExit(f"layer_types: error: --pretrained {args.pretrained}: {err}") from None
    entry = SCALINGS[scaling]
    curves = entry.halves(scales)  # scaling both: the position factors, then the base factors
    try:
        summaries = [by_type(curve, layer_types) for curve in curves]
    except ValueError as err:
        raise SystemExit(f"layer_types: error: {args.scales}: {err}") from None
    summary = summaries[0]
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    model = args.pretrained or "bundled SmolLM2"
    for kind in summary:
        kept = [kept_on(curve, layer_types, kind) for curve in curves]
        write_scales_file(output / f"only_{kind}.json", entry.join(*kept),
                          scaling=scaling, model=model, note=f"{args.scales} on the {kind} layers only, every other layer at 1")
    record = {"scales_file": args.scales, "model": model, "layer_types": layer_types, "by_type": summary}
    if entry.paired:
        record.update(scaling=scaling, by_type_base=summaries[1])  # by_type: the position factors
    atomic_write_json(output / "layer_types.json", record, indent=1)
    text = report_markdown(summary, args.scales, model, summaries[1] if entry.paired else None)
    atomic_write_text(output / "layer_types.md", text)
    plot_layer_types(curves[0], layer_types, output / "layer_types.png", curves[1] if entry.paired else None)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
