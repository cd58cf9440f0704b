"""The search command (``python searches/ga.py``): wires model, fitness, loop and callbacks.

Everything a run makes goes to ``--output`` (default ``results/<run-name>/``):

- ``scales.json``       the best layer scales so far (``lpes_hf scales=<path>`` reads it);
- ``config.json``       every setting of the run, and the command line;
- ``history.jsonl``     every individual: genome, scales, per-position scores, fitness, time;
- ``generations.jsonl`` best / mean fitness and smoothness per generation;
- ``curve.png``, ``fitness.png``;
- ``checkpoint.json``   the full search state after every individual (``--resume``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from lpes_harness.search.callbacks import (
    CheckpointCallback,
    HistoryCallback,
    PlotCallback,
    ProgressCallback,
    atomic_write_json,
    load_checkpoint,
)
from lpes_harness.search.fitness import MODES, ROLES, SCORERS, FitnessConfig
from lpes_harness.models import DTYPES, choose_dtype, default_device
from lpes_harness.search.fingerprint import fingerprint, mismatches
from lpes_harness.search.loop import Callback, GeneticSearch, SearchConfig, cache_key
from lpes_harness.search.sweep import parse_sweep, plot_sweep, run_sweep, snap_initial_y

DESCRIPTION = """\
Search per-layer RoPE scales (LPES) with the paper's Bézier-constrained genetic algorithm.

Each individual is a set of control points; its curve gives one scale per decoder layer;
its fitness is λ_B·score(begin) + λ_M·score(middle) + λ_E·score(end) on the `search`
split of a position task, computed through lm-eval on one loaded lpes_hf model whose
scales are changed in place.
"""

# Settings a profile changes; everything else keeps its flag's default. The argparse
# defaults are the paper's (kv_retrieval, population 32 / 20 generations / 200 samples per
# position, y in [1, 2] from 1.5): for 7B models, days on a 2-core CPU.
#
# The `cpu` profile is the bundled SmolLM2-135M on a 2-core CPU within about an hour, on the
# task it can do (multi_needle; kv_retrieval measures copying on it). The arithmetic: a
# ~750-token multi_needle prompt is one float32 forward of ~2.1 s on 2 threads, measured in
# the search itself (this CPU has no native bfloat16, which runs 3x slower here; `--dtype
# auto` picks it only where native). 12 samples at each of the 5 positions is 60 forwards,
# ~2 min per individual; a 3-point sweep (raced) plus 8 + 3 x 5 individuals (and at most one
# more crossover child per generation) is at most 29 individuals, about an hour worst case,
# less with racing. The range is wide, [0.25, 2.5]: curves that help rise to 1.5-1.85 in
# late layers although uniform 1.2 wrecks the model, so the sweep picks the start and the
# range stays open; the y step of a mutation grows with the range (0.4).
PROFILES = {
    "paper": {},
    "cpu": {
        "task": "multi_needle", "mode": "greedy", "num_samples": 12, "chunk_size": 6,
        "population": 8, "parents": 3, "mutants": 4, "crossovers": 1, "generations": 3,
        "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0, "my": 0.4, "mx": 3.0,
        "sweep": "1,0.8,1.2", "heldout_samples": 40,
    },
    # The same calibrated multi_needle search scaled up for one GPU: the paper's population and
    # generations (432 individuals at most), 100 samples per position in batches of up to 100
    # prompts (racing per batch), bfloat16 (auto). The target on one H100 is 15 minutes for
    # SmolLM2: ~216k samples at the ~240 samples/s a batched bfloat16 scorer reached there.
    # Not yet measured on a GPU by this project.
    "gpu": {
        "task": "multi_needle", "mode": "greedy", "num_samples": 100, "chunk_size": 100,
        "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0, "my": 0.4, "mx": 3.0,
        "sweep": "1,0.9,0.8,1.1,1.2", "heldout_samples": 200,
    },
}  # fmt: skip

EPILOG = """\
profiles (--profile; the command line and --config override a profile's values):
  paper  the paper's settings, for 7B models on kv_retrieval / mdqa: population 32,
         12 parents, 16 mutants + 4 crossovers, 20 generations, 200 samples per position,
         greedy fitness, y in [1, 2] from 1.5, Mx 2, My 0.2
  cpu    the bundled SmolLM2-135M on multi_needle on a 2-core CPU (under an hour):
         population 8, 3 parents, 4 mutants + 1 crossover, 3 generations, 12 samples at
         each of the 5 positions (middle = 25/50/75 %), greedy fitness, a uniform sweep
         1,0.8,1.2 picks the start, y in [0.25, 2.5] (step 0.05), Mx 3, My 0.4; then 40
         held-out samples per position, paired with vanilla and PI
  gpu    the cpu profile's multi_needle search scaled up for one GPU: the paper's
         population 32 / 12 parents / 16 mutants + 4 crossovers / 20 generations,
         100 samples per position (chunks of 100 = the batch), sweep 1,0.9,0.8,1.1,1.2,
         200 held-out samples per position; bfloat16 by --dtype auto (not yet measured
         on a GPU by this project)
  auto   (default) gpu when the model runs on a GPU, cpu otherwise

why the cpu range is wide: on SmolLM2 the curves that remove position bias go to 1.5-1.85
in late layers, while *uniform* 1.2 already wrecks the model. The sweep therefore only
picks the starting individual (the best uniform scale); it never narrows the range.

examples:
  python searches/ga.py                                   # bundled SmolLM2, profile auto
  python searches/ga.py --profile paper --device cuda     # the paper's settings
  python searches/ga.py --generations 5 --num-samples 50 --y-min 0.6 --y-max 1.6
  python searches/ga.py --resume --output results/my_run  # continue a stopped run
  python searches/ga.py --config my_search.json           # settings from a file (keys = long flag names)
  accelerate launch --multi_gpu --num_processes 2 searches/ga.py ...  # split each evaluation's samples (gloo on CPU)
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="searches/ga.py", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help="JSON (or YAML) file of settings; its keys are the long flag names")
    p.add_argument("--profile", default="auto", choices=["auto", *PROFILES],
                   help="default settings: paper, cpu, gpu, or auto (gpu on a GPU, else cpu); see below")
    model = p.add_argument_group("model")
    model.add_argument("--pretrained", default=None, help="HF id, local dir or .gguf path (default: bundled SmolLM2)")
    model.add_argument("--model-args", default="", help="extra lpes_hf/HFLM arguments, 'k=v,k=v' (e.g. dtype=float32)")
    model.add_argument("--device", default=None, help="cpu / cuda (default: cuda when present)")
    model.add_argument("--batch-size", default="auto",
                       help="prompts per forward of the fitness: an integer, or 'auto' (default: the largest that fits "
                            "on a GPU, halving on out-of-memory; 1 on a CPU, where batching measured no faster); also "
                            "lm-eval's batch size for generate mode. Racing scores at most --chunk-size prompts at once")
    model.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: torch's choice; 1 helps on a CPU shared with other jobs)")
    model.add_argument("--dtype", default="auto", choices=DTYPES,
                       help="auto (default): bfloat16 on CUDA or a CPU with native bfloat16 (avx512_bf16 / AMX), "
                            "else float32; RoPE's cos/sin are computed in float32 either way")
    fit = p.add_argument_group("fitness")
    fit.add_argument("--task", default="kv_retrieval",
                     help="any registered position task (multi_needle, kv_retrieval, mdqa, needle, or "
                          "'module:ATTRIBUTE' of your own; see docs/position_tasks.md). Default: the profile's")
    fit.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"],
                     help="wrap prompts in the model's chat template: auto follows the task (multi_needle: on)")
    fit.add_argument("--fitness", dest="mode", default="greedy", choices=MODES,
                     help="greedy: one pass, gold answer = greedy argmax (paper profile); generate: lm-eval "
                          "generate_until + task metric (the paper's path); logprob: mean gold-token log-prob (cpu profile)")
    fit.add_argument("--weights", default="0.2,0.3,0.5", help="λ for begin,middle,end (default 0.2,0.3,0.5)")
    fit.add_argument("--positions", default=None,
                     help="gold percents for begin,middle,end; join several with '+', e.g. 0,25+50+75,100 "
                          "(default: the task's roles; kv_retrieval 0,40,100; mdqa 0,50,100; multi_needle 0,25+50+75,100)")
    fit.add_argument("--num-samples", type=int, default=200, help="search samples per gold position (paper 200, cpu 12)")
    fit.add_argument("--metadata", default="{}", help="task options as JSON, e.g. '{\"num_pairs\": 30}'")
    fit.add_argument("--chunk-size", type=int, default=25, help="samples per racing step (paper 25, cpu 10)")
    fit.add_argument("--no-racing", action="store_true", help="score every sample of every individual")
    fit.add_argument("--scorer", default="answer-logits", choices=SCORERS,
                     help="one-pass modes: answer-logits (default; output layer only at the answer tokens) "
                          "or lm-eval (lm-eval's loglikelihood; same numbers, slower)")
    ga = p.add_argument_group("genetic algorithm (defaults: the profile's, see below)")
    ga.add_argument("--population", type=int, default=32)
    ga.add_argument("--parents", type=int, default=12)
    ga.add_argument("--mutants", type=int, default=16)
    ga.add_argument("--crossovers", type=int, default=4)
    ga.add_argument("--generations", type=int, default=20)
    ga.add_argument("--mx", type=float, default=2.0, help="max x move of a control point per mutation (layers)")
    ga.add_argument("--my", type=float, default=0.2, help="max y move of a control point per mutation")
    ga.add_argument("--crossover-tries", type=int, default=4, help="N_ct: tries for a valid crossover child")
    ga.add_argument("--mutation", default="paper", choices=["paper", "joint"],
                    help="paper (default): Eq. 4, point k's new x between its old neighbours, within Mx; "
                         "joint: all x moved at once within Mx, only the final order kept (wider than the paper)")
    ga.add_argument("--seed", type=int, default=0)
    ga.add_argument("--sweep", default="none",
                    help="uniform scales scored first, e.g. 1,0.8,1.2; the best starts the search (it does not "
                         "narrow the y range). 'none': start at --initial-y (cpu profile: 1,0.8,1.2)")
    genes = p.add_argument_group("genome")
    genes.add_argument("--curve", default="bezier", choices=["bezier", "linear", "step"])
    genes.add_argument("--control-points", type=int, default=4, help="number of control points, 2..5 (default 4: cubic)")
    genes.add_argument("--brute-force", action="store_true", help="one gene per layer (ablation), initialised U(y_min, y_max)")
    genes.add_argument("--y-min", type=float, default=1.0, help="lowest scale (paper 1.0, cpu 0.6)")
    genes.add_argument("--y-max", type=float, default=2.0, help="highest scale (paper 2.0, cpu 1.6)")
    genes.add_argument("--y-step", type=float, default=0.1)
    genes.add_argument("--initial-y", type=float, default=1.5, help="y of the initial individual, clipped into range (paper 1.5, cpu 1.0)")
    out = p.add_argument_group("output")
    out.add_argument("--output", default=None, help="run directory (default results/<run-name>)")
    out.add_argument("--run-name", default=None, help="default: <task>_<curve>_seed<seed>")
    out.add_argument("--resume", action="store_true", help="continue the run in --output from its checkpoint")
    out.add_argument("--overwrite", action="store_true", help="start afresh even if --output holds a run")
    out.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    out.add_argument("--heldout-samples", type=int, default=0,
                     help="after the search, score vanilla, PI and the best curve on this many held-out samples "
                          "per position, paired (intervals, McNemar p); 0 skips it (cpu profile: 40)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = _read_config(parser, args.config) if args.config else {}
    profile = config.get("profile", args.profile) if args.profile == "auto" else args.profile
    if profile not in ("auto", *PROFILES):
        parser.error(f"--config {args.config}: profile {profile!r} is not one of auto, {', '.join(PROFILES)}")
    if profile == "auto":
        profile = "cpu" if _runs_on_cpu(args.device or config.get("device")) else "gpu"  # the command line wins
    # Precedence: command line > config file > profile > the flags' own (paper) defaults.
    parser.set_defaults(**PROFILES[profile])
    parser.set_defaults(**config)
    args = parser.parse_args(argv)
    args.profile = profile
    try:
        _check(args)
    except ValueError as err:
        parser.error(str(err))
    return args


def _runs_on_cpu(device) -> bool:
    if device:
        return str(device).startswith("cpu")
    # An NVIDIA device node, without importing torch (seconds): bad flags must fail fast.
    return not any(Path("/dev").glob("nvidia[0-9]*"))


def _read_config(parser, path) -> dict:
    text = Path(path).read_text() if Path(path).is_file() else None
    if text is None:
        parser.error(f"--config {path}: file not found")
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            parser.error(f"--config {path}:{err.lineno}: not valid JSON ({err.msg})")
    known = {action.dest for action in parser._actions}
    settings = {key.replace("-", "_"): value for key, value in (data or {}).items()}
    settings = {("mode" if key == "fitness" else key): value for key, value in settings.items()}
    unknown = sorted(set(settings) - known)
    if unknown:
        parser.error(f"--config {path}: unknown setting(s) {unknown}; use the long flag names, e.g. 'generations'")
    return settings


def _check(args) -> None:
    from lpes_harness.search.fitness import task_roles
    from lpes_harness.search.validate import check_search_args
    from lpes_harness.tasks.data import TaskDataError

    check_search_args(args)
    try:
        task_roles(args.task)
    except TaskDataError as err:
        raise ValueError(f"--task: {err}") from None
    args.weights_dict = _role_values(args.weights, "weights", float)
    args.positions_dict = _role_values(args.positions, "positions", _percent_list) if args.positions else None
    args.sweep_values = parse_sweep(args.sweep)
    if args.heldout_samples < 0:
        raise ValueError(f"--heldout-samples must be >= 0, got {args.heldout_samples}")
    if isinstance(args.metadata, str):
        try:
            args.metadata = json.loads(args.metadata)
        except json.JSONDecodeError as err:
            raise ValueError(f"--metadata is not valid JSON: {err.msg}") from None
    if not isinstance(args.metadata, dict):
        raise ValueError("--metadata must be a JSON object")
    for key in ("split", "num_samples"):
        if key in args.metadata:
            raise ValueError(f"--metadata {key!r} is set by the search itself (split=search, --num-samples)")
    if not 2 <= args.control_points <= 8:
        raise ValueError(f"--control-points must be 2..8 (the paper studies 2..5), got {args.control_points}")
    if args.resume and args.overwrite:
        raise ValueError("--resume and --overwrite contradict each other")


def _percent_list(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("+"))


def _role_values(text, name, cast) -> dict:
    parts = [p for p in str(text).split(",") if p.strip()]
    if len(parts) != 3:
        raise ValueError(f"--{name} needs 3 comma-separated values for begin,middle,end; got {text!r}")
    try:
        return dict(zip(ROLES, (cast(p) for p in parts)))
    except ValueError:
        raise ValueError(f"--{name} {text!r}: values must be numbers") from None


# ----------------------------------------------------------------------------- callbacks


class BestScalesCallback(Callback):
    """Keeps ``scales.json`` (and the best control points) up to date after each generation."""

    def __init__(self, directory: Path, model_name: str, dtype: str | None = None):
        self.directory = directory
        self.model_name = model_name
        self.dtype = dtype

    def on_generation_end(self, search, stats) -> None:
        from lpes_harness.scales_file import write_scales_file

        best = search.best
        write_scales_file(
            self.directory / "scales.json",
            best["scales"],
            curve="per-layer" if search.spec.brute_force else search.spec.curve,
            control_points=best["genome"],
            fitness=best["fitness"],
            scores=(best.get("info") or {}).get("scores"),
            generation=stats["generation"],
            model=self.model_name,
            dtype=self.dtype,  # the precision the scales were searched in
        )


# ----------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> dict:
    from lpes_harness.search import distributed
    from lpes_harness.search.genome import GenomeSpec

    launched = time.perf_counter()  # the wall time a user waits: model load and sweep included
    output = Path(args.output or Path("results") / (args.run_name or f"{args.task}_{args.curve}_seed{args.seed}"))
    checkpoint_path = output / "checkpoint.json"
    if checkpoint_path.exists() and not (args.resume or args.overwrite):
        raise SystemExit(f"{output} already holds a run: pass --resume to continue it or --overwrite to start afresh")
    if args.resume and not checkpoint_path.exists():
        raise SystemExit(f"--resume: no checkpoint at {checkpoint_path}")

    config = SearchConfig(
        population_size=args.population, num_parents=args.parents, num_mutants=args.mutants,
        num_crossovers=args.crossovers, generations=args.generations, mutation_x=args.mx, mutation_y=args.my,
        crossover_tries=args.crossover_tries, seed=args.seed, mutation=args.mutation,
    )
    fitness_config = FitnessConfig(
        task=args.task, mode=args.mode, weights=args.weights_dict, positions=args.positions_dict,
        metadata=args.metadata, num_samples=args.num_samples, chunk_size=args.chunk_size, racing=not args.no_racing,
        scorer=args.scorer, chat_template={"auto": None, "on": True, "off": False}[args.chat_template],
        batch_size=int(args.batch_size) if str(args.batch_size).isdigit() else args.batch_size,
    )
    args.dtype_chosen = choose_dtype(_requested_dtype(args), args.device or default_device())
    current = fingerprint({**vars(args), **vars(fitness_config), "dtype": args.dtype_chosen})
    if args.resume:  # before anything is loaded or written: a resume never mixes two experiments
        saved = load_checkpoint(checkpoint_path).get("fingerprint")
        problems = mismatches(saved, current) if saved else ["the checkpoint has no fingerprint (made before it existed)"]
        if problems:
            for line in problems:
                print(f"searches/ga.py: error: --resume {output}: the checkpoint was made with different settings: "
                      f"{line}", file=sys.stderr)
            raise SystemExit(2)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    context = distributed.init()
    lm = load_lm(args)
    from lpes_harness import rope

    n_layers = rope.num_layers(lm.model)
    fitness = distributed.make_fitness(lm, fitness_config, context)
    if not context.is_main:
        distributed.serve(fitness, context)  # follow rank 0's evaluations until it is done
        return {}

    print(f"model dtype {args.dtype_chosen} (--dtype {args.dtype}); chat template "
          f"{'on' if fitness.chat_template else 'off'}; task {args.task}, positions {fitness_config.positions}", flush=True)
    print_estimate(config, fitness, args.sweep_values)
    sweep = None
    if args.sweep_values:
        sweep = _load_or_run_sweep(output, args, fitness, n_layers)
        args.initial_y = snap_initial_y(sweep["best"], args.y_min, args.y_max, args.y_step)
        print(f"sweep: best uniform scale {sweep['best']:g} -> the search starts from y = {args.initial_y:g} "
              f"(range [{args.y_min:g}, {args.y_max:g}] kept)", flush=True)
    spec = GenomeSpec(
        num_layers=n_layers, num_points=args.control_points, y_min=args.y_min, y_max=args.y_max,
        y_step=args.y_step, curve=args.curve, brute_force=args.brute_force, initial_y=args.initial_y,
    )
    callbacks = [
        HistoryCallback(output / "history.jsonl", output / "generations.jsonl"),
        BestScalesCallback(output, args.pretrained or "SmolLM2-135M-Instruct", args.dtype_chosen),
        PlotCallback(output),
        ProgressCallback(disable=args.no_progress or None),
        CheckpointCallback(checkpoint_path, extra={"fingerprint": current}),  # last: the files above agree with it
    ]
    search = GeneticSearch(spec, fitness, config, callbacks)
    for point in (sweep or {}).get("points", []):
        if not (point.get("info") or {}).get("raced"):  # a complete sweep point is a known fitness
            search.cache[cache_key([point["scale"]] * n_layers, config.cache_decimals)] = (point["fitness"], point["info"])
    try:
        if args.resume:
            # Before any file is written: a checkpoint made with other settings changes nothing.
            try:
                search.load_state_dict(load_checkpoint(checkpoint_path))
            except ValueError as err:
                raise SystemExit(f"--resume {output}: {err}") from None
        _write_config(output / "config.json", args.resume, {
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "search": config.to_dict(), "genome": spec.to_dict(),
            "fitness": dict(vars(fitness_config)),
            "model": {"pretrained": args.pretrained or "bundled SmolLM2-135M-Instruct (GGUF)",
                      "model_args": args.model_args, "num_layers": n_layers,
                      "dtype": args.dtype_chosen, "dtype_requested": args.dtype},
            "chat_template": fitness.chat_template,
            "sweep": args.sweep_values, "heldout_samples": args.heldout_samples,
            "processes": context.world, "profile": args.profile,
        })
        started = time.perf_counter()
        result = search.run()
    finally:
        distributed.release(context)  # other ranks stop waiting, also when rank 0 fails
    result["wall_seconds"] = round(time.perf_counter() - started, 1)  # the GA itself
    result["total_seconds"] = round(time.perf_counter() - launched, 1)  # load + sweep + GA
    result["fitness_evaluations"] = fitness.evaluations
    if sweep is not None:
        result["sweep"] = {"best": sweep["best"], "points": [{k: p[k] for k in ("scale", "fitness")} for p in sweep["points"]]}
        plot_sweep(sweep, output / "sweep.png", result["best"]["scales"])
    atomic_write_json(output / "result.json", result)
    best = result["best"]
    print(f"best fitness {best['fitness']:.4f} (generation {best['generation']}), scores {best['info'].get('scores')}")
    print(f"scales written to {output / 'scales.json'}; use: lm_eval --model lpes_hf --model_args scales={output / 'scales.json'}")
    if args.heldout_samples:
        result["heldout"] = evaluate_heldout(lm, args, fitness, best["scales"], sweep, output)
        result["total_seconds_with_heldout"] = round(time.perf_counter() - launched, 1)
        atomic_write_json(output / "result.json", result)
    return result


def _write_config(path: Path, resume: bool, record: dict) -> None:
    """config.json is the first run's record; a resume appends to its ``resumes`` list, never replaces it."""
    if resume and path.exists():
        first = json.loads(path.read_text())
        first.setdefault("resumes", []).append({"command": record["command"], "at": time.strftime("%Y-%m-%dT%H:%M:%S")})
        atomic_write_json(path, first)
    else:
        atomic_write_json(path, {**record, "started": time.strftime("%Y-%m-%dT%H:%M:%S")})


def _requested_dtype(args) -> str:
    from lm_eval.utils import simple_parse_args_string

    extra = simple_parse_args_string(args.model_args)
    if "dtype" in extra and args.dtype != "auto":
        raise SystemExit("searches/ga.py: error: give the dtype once: --dtype or dtype= in --model-args")
    return str(extra.get("dtype", args.dtype))


def evaluate_heldout(lm, args, fitness, scales, sweep, output: Path) -> dict:
    """The best curve, its PI and vanilla (and the sweep's best uniform scale) on held-out samples, paired."""
    from lpes_harness.analysis.paired import format_plain, paired_table, score_methods, write_comparison

    n = len(scales)
    methods = {"vanilla": [1.0] * n, "PI": [sum(scales) / n] * n, "LPES": list(scales)}
    if sweep is not None and sweep["best"] != 1.0:
        methods[f"uniform {sweep['best']:g}"] = [sweep["best"]] * n
    print(f"held-out: {', '.join(methods)} on {args.heldout_samples} samples per position "
          f"(the same samples for each)...", flush=True)
    started = time.perf_counter()
    scored = score_methods(lm, args.task, methods, num_samples=args.heldout_samples, metadata=args.metadata,
                           chat_template=fitness.chat_template)
    table = paired_table(scored)
    files = write_comparison(table, scored, output)
    print(format_plain(table))
    print(f"held-out table: {files['md']}, plot: {files['png']} ({time.perf_counter() - started:.0f} s)")
    return {"table_file": str(files["json"].name), "average": {k: r["average"] for k, r in table["rows"].items()}}


def _load_or_run_sweep(output: Path, args, fitness, n_layers: int) -> dict:
    """The sweep of this run: read back on --resume (same values), else scored now and saved."""
    from lpes_harness.search.fitness import individual_with_scales

    path = output / "sweep.json"
    if args.resume and path.exists():
        saved = json.loads(path.read_text())
        if [p["scale"] for p in saved["points"]] == sorted(args.sweep_values):
            return saved
    print(f"sweep: uniform scales {', '.join(f'{v:g}' for v in args.sweep_values)}", flush=True)
    sweep = run_sweep(lambda scales, threshold: fitness(individual_with_scales(scales), threshold),
                      args.sweep_values, n_layers)
    for point in sweep["points"]:
        info = point["info"] or {}
        print(f"  uniform {point['scale']:g}: fitness {point['fitness']:.4f}{' (raced out)' if info.get('raced') else ''} "
              f"{info.get('scores')}", flush=True)
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, sweep)
    return sweep


def load_lm(args):
    from lm_eval.utils import simple_parse_args_string

    from lpes_harness.lm import LPESLM

    extra = simple_parse_args_string(args.model_args)
    extra.pop("dtype", None)  # resolved into args.dtype_chosen (auto -> bfloat16 only where native)
    # lm-eval's own "auto" probes ever larger batches at the full window: slow on a CPU, and the
    # one-pass fitness batches by itself (FitnessConfig.batch_size); so lm-eval gets a number.
    batch_size = int(args.batch_size) if str(args.batch_size).isdigit() else 1
    return LPESLM(pretrained=args.pretrained, device=args.device, batch_size=batch_size, dtype=args.dtype_chosen, **extra)


def print_estimate(config: SearchConfig, fitness, sweep_values=()) -> None:
    """Time one sample per role now, and project the run's worst case (no cache hits, no racing)."""
    started = time.perf_counter()
    for role in fitness.sizes:
        fitness.score_samples(role, [0])  # this process only: no collective call before the search starts
    per_sample = (time.perf_counter() - started) / len(fitness.sizes)
    samples = sum(fitness.sizes.values())
    individuals = config.planned_individuals() + len(sweep_values)
    worst = individuals * samples * per_sample
    print(
        f"cost estimate: at most {individuals} individuals x {samples} samples "
        f"({len(fitness.sizes)} roles) x {per_sample:.2f} s/sample = {_duration(worst)} worst case; "
        f"the fitness cache and racing cut this (see history.jsonl 'raced' / 'cached')",
        flush=True,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    run(args)


if __name__ == "__main__":
    main()
