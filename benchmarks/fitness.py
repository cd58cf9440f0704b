"""Fitness cost: the paper's generate-based fitness against one-pass scoring, side by side.

    python benchmarks/fitness.py --genomes 10 --num-samples 6 --json results/fitness_benchmark/smollm2_cpu.json

One load of the bundled SmolLM2 (``lpes_hf``), the ``search`` split of ``kv_retrieval`` at the
search's three gold positions, and ``--genomes`` genomes (the search's starting individual and
uniformly random valid genomes on its grid). For each genome, in turn:

- ``generate``      the paper's path: lm-eval ``generate_until`` + the task metric, no racing;
- ``one-pass``      lm-eval ``loglikelihood``: correct iff every gold token is the argmax;
- ``answer-logits`` the same test with the output layer only at the answer tokens (the default).

Then a short real search (``GeneticSearch``, default fitness: answer-logits + racing + the
fitness cache) on the same samples. Reported: seconds per individual and speed-ups over
``generate``; per-sample agreement of greedy-match with the generation metric; the Spearman
correlation across genomes of each one-pass fitness (greedy and mean gold log-prob) with the
generate fitness; how a one-pass sample's cost grows with context length and sample count;
and the projected wall time of a search at the paper's settings on this machine. The final
line is ``speedup: <x>x agreement: <a> spearman: <r>`` (speed-up of the short search over
``generate`` per individual; Spearman of greedy one-pass fitness with generate fitness).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import numpy as np

from lpes_harness.core.files import atomic_write_json
from lpes_harness.core.models import positive_int


def draw_genomes(spec, count: int, seed: int) -> list:
    """The search's starting individual, then uniformly random valid genomes on the search grid.

    Random rather than mutants of the start: mutants barely differ in fitness, and a rank
    correlation over near-ties measures noise, not whether two fitness paths order genomes alike.
    """
    from lpes_harness.search import initial_genome, make_individual, random_genome

    rng = random.Random(seed)
    genomes = [make_individual(initial_genome(spec))]
    while len(genomes) < count:
        genomes.append(make_individual(random_genome(spec, rng)))
    for individual in genomes:
        individual.scales = spec.scales(individual)
    return genomes


def scored_fitness(fitness, scales) -> tuple[float, dict]:
    """``fitness(scales)`` without racing, also returning each sample's score ((role, index) -> score).

    The same chunks in the same order as the fitness's own call, through its public pieces:
    ``score_samples`` for the scores and ``raced_fitness`` for the λ-weighted value.
    """
    from lpes_harness.lmeval.position_scorer import max_sample_score
    from lpes_harness.search.fitness import raced_fitness

    fitness.lm.set_scales(list(scales))
    seen: dict = {}

    def score_chunk(role, indices):
        scores = fitness.score_samples(role, indices)
        seen.update({(role, i): s for i, s in zip(indices, scores)})
        return scores

    config = fitness.config
    value, _ = raced_fitness(score_chunk, fitness.sizes, config.weights, chunk_size=config.chunk_size,
                             max_score=max_sample_score(config.fitness), objective=config.objective)
    return value, seen


def spearman(a, b) -> float:
    """Spearman's rho with average ranks for ties; NaN when either side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(values) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def compare_paths(lm, base_config, genomes, progress) -> dict:
    """Each genome through generate, one-pass and answer-logits; per-sample scores kept."""
    from dataclasses import replace

    from lpes_harness.search.fitness import LMEvalFitness

    paths = {
        "generate": replace(base_config, fitness="generate", racing=False),
        "one-pass": replace(base_config, fitness="greedy", scorer="lm-eval", racing=False),
        "answer-logits": replace(base_config, fitness="greedy", scorer="answer-logits", racing=False),
    }
    fitnesses = {name: LMEvalFitness(lm, config) for name, config in paths.items()}
    # The mean gold log-probability of the answer-logits pass, scored by the product's own code
    # (an extra answer-logits pass per genome, untimed).
    logprob = LMEvalFitness(lm, replace(base_config, fitness="logprob", racing=False),
                            task_manager=fitnesses["answer-logits"].scorer.task_manager)
    rows = []
    for index, genome in enumerate(genomes):
        row = {"genome": [list(p) for p in genome], "seconds": {}, "fitness": {}, "samples": {}}
        for name, fitness in fitnesses.items():
            started = time.perf_counter()
            value, samples = scored_fitness(fitness, genome.scales)
            row["seconds"][name] = time.perf_counter() - started
            row["fitness"][name] = value
            row["samples"][name] = {f"{role}:{i}": s for (role, i), s in sorted(samples.items())}
        row["fitness"]["logprob"], _ = logprob(genome.scales)
        rows.append(row)
        progress(f"genome {index + 1}/{len(genomes)}: " + ", ".join(
            f"{n} {row['fitness'][n]:.3f} in {s:.1f} s" for n, s in row["seconds"].items()))
    return {"rows": rows, "sizes": fitnesses["generate"].sizes}


def short_search(lm, base_config, spec, args, progress) -> dict:
    from lpes_harness.search import GeneticSearch, SearchConfig
    from lpes_harness.search.callbacks import ProgressCallback
    from lpes_harness.search.fitness import LMEvalFitness

    fitness = LMEvalFitness(lm, base_config)  # the default: greedy, answer-logits, racing
    config = SearchConfig(
        population=args.search_population, parents=args.search_parents,
        mutants=args.search_population - args.search_parents - 1, crossovers=1,
        generations=args.search_generations, seed=args.seed,
    )  # fmt: skip
    search = GeneticSearch(spec, fitness, config, [ProgressCallback(disable=args.no_progress or None)])
    started = time.perf_counter()
    search.run()
    seconds = time.perf_counter() - started
    infos = [info for _, info in search.cache.values()]
    scored = sum(sum(info["samples"].values()) for info in infos)
    progress(f"short search: {search.processed} individuals, {search.evaluations} evaluated, {seconds:.1f} s")
    return {
        "individuals": search.processed,
        "evaluated": search.evaluations,
        "cache_hits": search.processed - search.evaluations,
        "raced": sum(1 for info in infos if info.get("raced")),
        "samples_scored": scored,
        "samples_without_racing": search.evaluations * sum(fitness.sizes.values()),
        "seconds": seconds,
        "seconds_per_individual": seconds / search.processed,
        "config": config.to_dict(),
    }


def context_scaling(lm, base_config, lengths, samples: int, progress) -> list[dict]:
    """Seconds per one-pass sample (answer-logits) at several prompt lengths (more KV pairs)."""
    from dataclasses import replace

    from lpes_harness.search.fitness import LMEvalFitness

    per_pair = _tokens_per_pair(lm, base_config)
    rows = []
    for target in lengths:
        num_pairs = max(2, round(target / per_pair))
        config = replace(base_config, num_samples=samples, metadata={**base_config.metadata, "num_pairs": num_pairs})
        fitness = LMEvalFitness(lm, config)
        role = "end"
        task, docs = role_docs(fitness, role)
        tokens = statistics.fmean(len(lm.tok_encode(task.doc_to_text(doc))) for doc in docs)
        started = time.perf_counter()
        fitness.score_samples(role, list(range(len(docs))))
        seconds = (time.perf_counter() - started) / len(docs)
        rows.append({"target_tokens": target, "num_pairs": num_pairs, "tokens": round(tokens), "seconds_per_sample": seconds})
        progress(f"context {round(tokens)} tokens ({num_pairs} pairs): {seconds:.2f} s / sample")
    return rows


def role_docs(fitness, role: str):
    """The lm-eval task and docs of ``role``'s first gold position (the role's first samples)."""
    percent = fitness.config.positions[role][0]
    return fitness.scorer.tasks[percent], fitness.scorer.docs[percent]


def _tokens_per_pair(lm, base_config) -> float:
    from dataclasses import replace

    from lpes_harness.search.fitness import LMEvalFitness

    lengths = {}
    for pairs in (10, 40):
        config = replace(base_config, num_samples=1, metadata={**base_config.metadata, "num_pairs": pairs})
        fitness = LMEvalFitness(lm, config)
        task, docs = role_docs(fitness, "end")
        lengths[pairs] = len(lm.tok_encode(task.doc_to_text(docs[0])))
    return (lengths[40] - lengths[10]) / 30


def sample_scaling(lm, base_config, counts, progress) -> list[dict]:
    """Seconds per evaluation (no racing) as the samples per position grow."""
    from dataclasses import replace

    from lpes_harness.core import rope
    from lpes_harness.search.fitness import LMEvalFitness

    rows = []
    for count in counts:
        fitness = LMEvalFitness(lm, replace(base_config, num_samples=count, racing=False))
        started = time.perf_counter()
        fitness([1.0] * rope.num_layers(lm.model))
        seconds = time.perf_counter() - started
        rows.append({"samples_per_position": count, "seconds": seconds})
        progress(f"{count} samples per position: {seconds:.1f} s per evaluation")
    return rows


SEARCH = "search (answer-logits + racing + cache)"


def summarise(compared: dict, search: dict) -> dict:
    rows = compared["rows"]
    mean_seconds = {name: statistics.fmean(r["seconds"][name] for r in rows) for name in rows[0]["seconds"]}
    pairs = [
        (row["samples"]["one-pass"][key], row["samples"]["generate"][key])
        for row in rows for key in row["samples"]["generate"]
    ]  # fmt: skip
    agreement = sum(1 for greedy, generated in pairs if greedy == generated) / len(pairs)
    fit = {name: [r["fitness"][name] for r in rows] for name in ("generate", "one-pass", "answer-logits", "logprob")}
    return {
        "seconds_per_individual": {**mean_seconds, SEARCH: search["seconds_per_individual"]},
        "speedup_over_generate": {
            "one-pass": mean_seconds["generate"] / mean_seconds["one-pass"],
            "answer-logits": mean_seconds["generate"] / mean_seconds["answer-logits"],
            "search": mean_seconds["generate"] / search["seconds_per_individual"],
        },
        "agreement": agreement,
        "agreement_counts": {
            "both_correct": sum(1 for g, t in pairs if g and t),
            "both_wrong": sum(1 for g, t in pairs if not g and not t),
            "greedy_only": sum(1 for g, t in pairs if g and not t),
            "generate_only": sum(1 for g, t in pairs if t and not g),
        },
        "answer_logits_equals_one_pass": all(
            r["samples"]["answer-logits"] == r["samples"]["one-pass"] for r in rows
        ),
        "spearman": {
            "greedy": spearman(fit["one-pass"], fit["generate"]),
            "logprob": spearman(fit["logprob"], fit["generate"]),
        },
    }


def project_paper_search(seconds_per_sample: float, samples_per_position: int = 200) -> dict:
    from lpes_harness.search import SearchConfig

    individuals = SearchConfig().planned_individuals()
    samples = 3 * samples_per_position
    seconds = individuals * samples * seconds_per_sample
    return {"individuals": individuals, "samples": samples, "seconds_per_sample": seconds_per_sample, "hours": seconds / 3600}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--genomes", type=int, default=10, help="genomes compared across the three paths (default 10)")
    parser.add_argument("--num-samples", type=int, default=6, help="search samples per position (default 6)")
    parser.add_argument("--search-population", type=int, default=8)
    parser.add_argument("--search-parents", type=int, default=3)
    parser.add_argument("--search-generations", type=int, default=2)
    parser.add_argument("--context-lengths", default="500,1000,2000,4000", help="prompt lengths in tokens to time")
    parser.add_argument("--context-samples", type=int, default=2, help="samples per context length")
    parser.add_argument("--sample-counts", default="2,4,8", help="samples per position for the sample-count scaling")
    parser.add_argument("--y-min", type=float, default=0.6)
    parser.add_argument("--y-max", type=float, default=1.6)
    parser.add_argument("--initial-y", type=float, default=1.0)
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda when present)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write every measurement here")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.genomes < 3:
        parser.error("--genomes must be >= 3 for a rank correlation")
    if args.search_population < args.search_parents + 2:
        parser.error("--search-population must leave room for 1 crossover and at least 1 mutant")

    import torch

    from lpes_harness.core import rope
    from lpes_harness.lmeval.lpes_lm import LPESLM
    from lpes_harness.core.models import default_device
    from lpes_harness.search import GenomeSpec
    from lpes_harness.search.fitness import FitnessConfig

    if args.threads:
        torch.set_num_threads(args.threads)

    def progress(message):
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    device = args.device or default_device()
    lm = LPESLM(device=device)
    spec = GenomeSpec(num_layers=rope.num_layers(lm.model), y_min=args.y_min, y_max=args.y_max, initial_y=args.initial_y)
    base = FitnessConfig(task="kv_retrieval", num_samples=args.num_samples, chunk_size=max(1, args.num_samples // 2))
    genomes = draw_genomes(spec, args.genomes, args.seed)
    compared = compare_paths(lm, base, genomes, progress)
    search = short_search(lm, base, spec, args, progress)
    contexts = context_scaling(lm, base, [int(x) for x in args.context_lengths.split(",")], args.context_samples, progress)
    counts = sample_scaling(lm, base, [int(x) for x in args.sample_counts.split(",")], progress)
    summary = summarise(compared, search)

    samples = sum(compared["sizes"].values())
    per_sample = {name: s / samples for name, s in summary["seconds_per_individual"].items() if name != SEARCH}
    projection = {name: project_paper_search(per_sample[name]) for name in ("generate", "answer-logits")}

    print(f"bundled SmolLM2-135M on {device}, kv_retrieval search split, {args.num_samples} samples x 3 positions, "
          f"{args.genomes} genomes, torch threads {torch.get_num_threads()}")
    print()
    print("| fitness path | s / individual | speed-up over generate |")
    print("|---|---:|---:|")
    for name, seconds in summary["seconds_per_individual"].items():
        ratio = summary["seconds_per_individual"]["generate"] / seconds
        print(f"| {name} | {seconds:.1f} | {ratio:.2f}x |")
    print()
    print(f"short search: {search['individuals']} individuals, {search['cache_hits']} from the cache, "
          f"{search['raced']} raced; {search['samples_scored']} samples scored of {search['samples_without_racing']} "
          f"without racing")
    counts_text = ", ".join(f"{k} {v}" for k, v in summary["agreement_counts"].items())
    print(f"per-sample agreement, greedy-match vs generation metric: {summary['agreement']:.3f} ({counts_text})")
    print(f"answer-logits gives the same per-sample results as lm-eval's loglikelihood: {summary['answer_logits_equals_one_pass']}")
    print(f"Spearman with generate fitness across genomes: greedy {summary['spearman']['greedy']:.3f}, "
          f"logprob {summary['spearman']['logprob']:.3f}")
    print()
    print("| prompt tokens | s / sample (answer-logits) |")
    print("|---:|---:|")
    for row in contexts:
        print(f"| {row['tokens']} | {row['seconds_per_sample']:.2f} |")
    print()
    print("| samples / position | s / evaluation |")
    print("|---:|---:|")
    for row in counts:
        print(f"| {row['samples_per_position']} | {row['seconds']:.1f} |")
    print()
    for name, p in projection.items():
        print(f"paper-config search ({p['individuals']} individuals x {p['samples']} samples) with {name} on this "
              f"machine: {p['hours']:.1f} h at {p['seconds_per_sample']:.2f} s / sample (before cache and racing)")
    if device == "cpu":
        print("GPU projection: not measured here (no GPU in this run); run this script on a GPU for its figures")
    if args.json:
        atomic_write_json(args.json, {
            "settings": vars(args), "torch_threads": torch.get_num_threads(), "summary": summary,
            "compared": compared["rows"], "search": search, "context_scaling": contexts, "sample_scaling": counts,
            "projection": projection, "wall_seconds": time.perf_counter() - started,
        }, indent=2)  # fmt: skip
    print(f"speedup: {summary['speedup_over_generate']['search']:.2f}x agreement: {summary['agreement']:.3f} "
          f"spearman: {summary['spearman']['greedy']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
