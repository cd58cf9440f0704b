"""Search fitness in float32 vs bfloat16, side by side in one run: speed and the ranking kept.

    python benchmarks/dtype_agreement.py --genomes 20 --json dtype.json

On the default task and a CPU profile (multi_needle, greedy, the profile's samples per
position; ``--profile``, default cpu-bf16), for random genomes of its range it measures

- seconds per sample in each dtype (both models loaded, the genomes interleaved A/B);
- the Spearman correlation of the two fitnesses over the genomes;
- parent selection: in random populations drawn from the genomes, how often both dtypes
  pick the same set of parents (the only thing the GA uses fitness for);
- the held-out accuracy, in float32, of the best genome found each way.

The last line prints the figures ``--dtype auto`` is decided on. bfloat16 pays only on
hardware that runs it natively (CUDA, or a CPU with avx512_bf16 / AMX), and not on every such
CPU (0.62x float32's rate on an Intel Xeon with avx512_bf16 whose AMX is hidden, so ``auto``
times it: ``lpes_harness.core.models.cpu_bf16_speedup``); elsewhere PyTorch emulates it and it is
slower than float32 (3x on an AVX2 CPU).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import numpy as np

from lpes_harness.core.models import positive_int


def spearman(a, b) -> float:
    """Spearman's rho with average ranks for ties (no scipy needed)."""

    def ranks(values):
        values = np.asarray(values, dtype=float)
        order = values.argsort(kind="stable")
        ranked = np.empty(len(values))
        ranked[order] = np.arange(len(values))
        for value in np.unique(values):  # ties share their mean rank
            tied = values == value
            ranked[tied] = ranked[tied].mean()
        return ranked

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def same_parents_rate(fit_a, fit_b, population: int, parents: int, trials: int, seed: int = 0) -> float:
    """Share of random populations in which both fitnesses select the same parent set (ties by index)."""
    rng = random.Random(seed)
    indices = list(range(len(fit_a)))
    same = 0
    for _ in range(trials):
        members = rng.sample(indices, population)
        top_a = set(sorted(members, key=lambda i: (-fit_a[i], i))[:parents])
        top_b = set(sorted(members, key=lambda i: (-fit_b[i], i))[:parents])
        same += top_a == top_b
    return same / trials


def random_genomes(spec, count: int, seed: int) -> list:
    """The initial genome's x positions, each y uniform on the grid: curves across the whole range."""
    from lpes_harness.search.genome import initial_genome

    rng = random.Random(seed)
    xs = [x for x, _ in initial_genome(spec)]
    return [spec.from_cells([(round(x / spec.x_step), rng.randint(0, spec.y_cells)) for x in xs]) for _ in range(count)]


def main(argv=None) -> int:
    from lpes_harness.commands.search_cli import PROFILES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cpu-bf16", choices=["cpu", "cpu-bf16"],
                        help="whose task, samples per position, range, population and parents to use "
                             "(default cpu-bf16: the search that runs in bfloat16 on a CPU)")
    parser.add_argument("--genomes", type=int, default=20)
    parser.add_argument("--num-samples", type=int, default=None, help="search samples per position (default: the profile's)")
    parser.add_argument("--heldout-samples", type=int, default=40, help="held-out samples per position for the two best")
    parser.add_argument("--task", default=None, help="default: the profile's")
    parser.add_argument("--threads", type=positive_int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cpu = PROFILES[args.profile]
    args.num_samples = args.num_samples or cpu["num_samples"]
    args.task = args.task or cpu["task"]
    if args.genomes < cpu["population"]:
        parser.error(f"--genomes must be at least the population ({cpu['population']})")

    import torch

    from lpes_harness.core import rope
    from lpes_harness.evaluation.paired import score_methods
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.methods.setup import MethodSetup
    from lpes_harness.search.fitness import FitnessConfig, LMEvalFitness
    from lpes_harness.search.genome import GenomeSpec

    if args.threads:
        torch.set_num_threads(args.threads)
    config = FitnessConfig(task=args.task, fitness=cpu["fitness"], num_samples=args.num_samples, racing=False)
    models = {dtype: LPESLM(dtype=dtype) for dtype in ("float32", "bfloat16")}
    fitness = {dtype: LMEvalFitness(lm, config) for dtype, lm in models.items()}
    layers = rope.num_layers(models["float32"].model)
    spec = GenomeSpec(num_layers=layers, y_min=cpu["y_min"], y_max=cpu["y_max"], y_step=cpu["y_step"])
    genomes = random_genomes(spec, args.genomes, args.seed)
    values = {dtype: [] for dtype in fitness}
    seconds = {dtype: 0.0 for dtype in fitness}
    samples = sum(fitness["float32"].sizes.values())
    for number, genome in enumerate(genomes):
        scales = spec.scales(genome)
        for dtype in (("float32", "bfloat16") if number % 2 == 0 else ("bfloat16", "float32")):  # interleaved
            started = time.perf_counter()
            value, _ = fitness[dtype](scales)
            seconds[dtype] += time.perf_counter() - started
            values[dtype].append(value)
        print(f"genome {number}: float32 {values['float32'][-1]:.3f} bfloat16 {values['bfloat16'][-1]:.3f}",
              file=sys.stderr, flush=True)
    per_sample = {dtype: seconds[dtype] / (samples * len(genomes)) for dtype in seconds}
    rho = spearman(values["float32"], values["bfloat16"])
    parents = same_parents_rate(values["float32"], values["bfloat16"], cpu["population"], cpu["parents"], 1000, args.seed)
    best = {dtype: spec.scales(genomes[int(np.argmax(values[dtype]))]) for dtype in values}
    heldout = score_methods(models["float32"], args.task, {f"best by {d}": MethodSetup.of_scales(s) for d, s in best.items()},
                            num_samples=args.heldout_samples)
    accuracy = {name: float(np.mean([v for p in by_pos.values() for v in p])) for name, by_pos in heldout["scores"].items()}
    speedup = per_sample["float32"] / per_sample["bfloat16"]
    result = {"genomes": len(genomes), "samples_per_genome": samples, "seconds_per_sample": per_sample,
              "fitness": values, "spearman": rho, "same_parents": parents, "heldout_accuracy_float32": accuracy,
              "samples_per_hour_ratio_bf16_over_fp32": speedup}  # fmt: skip
    if args.json:
        from lpes_harness.core.files import atomic_write_json

        atomic_write_json(args.json, result, indent=2)
    print(f"float32 {per_sample['float32']:.2f} s/sample, bfloat16 {per_sample['bfloat16']:.2f} s/sample")
    print(f"samples/hour bf16/fp32: {speedup:.2f}x spearman: {rho:.3f} same parents: {parents:.3f} "
          f"held-out best-by-fp32 {accuracy['best by float32']:.3f} best-by-bf16 {accuracy['best by bfloat16']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
