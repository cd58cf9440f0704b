"""What the side-by-side benchmarks share: their flag tables and a timer that waits for the GPU.

Imported by the scripts beside it (``python benchmarks/X.py`` puts this folder on ``sys.path``).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from lpes_harness.core.models import positive_int


def model_flags(dtype: str, pretrained: str = "model (default: the bundled SmolLM2 GGUF)") -> tuple:
    """The rows that start every side-by-side script's flag table: which model, where, in which dtype
    (each script's default dtype is the one its committed figures were measured in)."""
    return (
        ("--pretrained", str, None, pretrained),
        ("--device", str, None, "cpu or cuda (default: cuda when present)"),
        ("--dtype", str, dtype, "model dtype"),
    )


# The rows that end every side-by-side script's flag table.
RUN_FLAGS = (
    ("--threads", positive_int, None, "torch threads (default: torch's choice)"),
    ("--json", str, None, "also write the measurements here"),
)


def parse_flags(description: str, flags, argv, positive: tuple[str, ...] = ()) -> argparse.Namespace:
    """``flags``: (flag, type, default, help) rows; each flag named in ``positive`` must be >= 1."""
    parser = argparse.ArgumentParser(description=description)
    for flag, kind, default, text in flags:
        if kind is bool:  # a switch
            parser.add_argument(flag, action="store_true", help=text)
        else:
            parser.add_argument(flag, type=kind, default=default, help=text)
    args = parser.parse_args(argv)
    if positive and min(getattr(args, flag.lstrip("-").replace("-", "_")) for flag in positive) < 1:
        parser.error(f"{' and '.join(positive)} must be at least 1")
    return args


def timed(function, device) -> tuple[float, object]:
    """(seconds, result) of ``function()``; on a GPU, its queued work is waited for on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = function()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def interleaved(methods: tuple[str, ...], run, repeats: int, device, samples=(None,)) -> tuple[dict, dict]:
    """Time ``run(method, sample)`` for every method on every sample, ``repeats`` times, with the methods
    in reverse order every other repeat (so that neither always runs first, on a warmer or cooler chip).
    Returns ``seconds[method][sample]``, one time a repeat, and ``results[method][sample]``, the last
    result; a single workload is ``samples=(None,)``, index 0."""
    seconds = {method: [[] for _ in samples] for method in methods}
    results = {method: [None] * len(samples) for method in methods}
    for repeat in range(repeats):
        for index, sample in enumerate(samples):
            for method in methods if repeat % 2 == 0 else methods[::-1]:
                elapsed, results[method][index] = timed(lambda: run(method, sample), device)
                seconds[method][index].append(elapsed)
        print(f"repeat {repeat + 1}/{repeats} done", file=sys.stderr)
    return seconds, results


def scaled_lm(args, default_scales: str):
    """``args.threads`` applied, then ``lpes_hf`` from ``args`` (model, device, dtype), scaled by ``args.scales``, else
    by ``default_scales`` (a committed curve, read from the repository's root) for the bundled model, else 1.
    Returns ``(lm, scales)``."""
    from pathlib import Path

    from lpes_harness.lmeval.lpes_lm import LPESLM

    if args.threads:
        torch.set_num_threads(args.threads)
    scales = args.scales or (default_scales if args.pretrained is None and Path(default_scales).is_file() else None)
    return LPESLM(pretrained=args.pretrained, device=args.device, dtype=args.dtype, scales=scales), scales


def per_sample_medians(seconds: dict, base: str) -> tuple[dict, dict]:
    """From :func:`interleaved`'s ``seconds``: each method's median seconds per sample (over repeats), and a row a
    method: ``median_s`` (over samples) and ``ratio_to_<base>``, the median of its per-sample ratios to ``base``'s."""
    import statistics

    per_sample = {method: [statistics.median(times) for times in by_sample] for method, by_sample in seconds.items()}
    key = f"ratio_to_{base.replace(' ', '_')}"
    rows = {method: {"median_s": statistics.median(times),
                     key: statistics.median(t / b for t, b in zip(times, per_sample[base]))}
            for method, times in per_sample.items()}
    return per_sample, rows


class DecoderTokens:
    """The tokens a model's decoder runs while installed: every prompt token it is given, and one per generated token."""

    def __init__(self, model):
        self.count = 0
        self._handle = model.get_decoder().register_forward_pre_hook(self._add, with_kwargs=True)

    def _add(self, module, args, kwargs):
        self.count += (args[0] if args else kwargs["input_ids"]).numel()

    def remove(self) -> None:
        self._handle.remove()
