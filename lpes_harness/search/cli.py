"""The command line of ``lpes-search`` (``searches/ga.py``): flags, profiles, config files, and the checks of
the settings that run before anything heavy loads (``parse_args`` exits 2 with one line)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from lpes_harness.models import DTYPES, PACKAGED_MODELS, choose_dtype, packaged_model
from lpes_harness.lmeval.position_scorer import MODES, SCORERS
from lpes_harness.search.fitness import OBJECTIVES, ROLES
from lpes_harness.search.sweep import parse_sweep

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
        "task": "multi_needle", "fitness": "greedy", "num_samples": 12, "chunk_size": 6,
        "population": 8, "parents": 3, "mutants": 4, "crossovers": 1, "generations": 3,
        "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0, "my": 0.4, "mx": 3.0,
        "sweep": "1,0.8,1.2", "heldout_samples": 40,
    },
    # The cpu search on a CPU that runs bfloat16 natively (avx512_bf16 / AMX), which `auto`
    # picks there: a ~950-token prompt is one bfloat16 forward of ~0.26 s on 2 threads
    # (float32 0.73 s on the same CPU). 20 samples at each of the 5 positions is 100 forwards,
    # ~26 s per individual; a 3-point sweep plus 12 + 4 x (6 + 2) individuals is at most 47,
    # ~21 min worst case; then 200 held-out samples per position for vanilla, PI, the best
    # curve and the sweep's best uniform scale (4,000 forwards, ~18 min). 20 samples per
    # position and ~40 individuals is the size at which every GPU search in #18 found the gain.
    "cpu-bf16": {
        "task": "multi_needle", "fitness": "greedy", "num_samples": 20, "chunk_size": 10,
        "population": 12, "parents": 5, "mutants": 6, "crossovers": 1, "generations": 4,
        "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0, "my": 0.4, "mx": 3.0,
        "sweep": "1,0.8,1.2", "heldout_samples": 200,
    },
    # Gemma-3-270M (`--pretrained gemma3-270m`), which `auto` picks for it on a CPU. At the
    # default haystack it scores 1.00 everywhere; at 240 sentences (~2.3k tokens, past its
    # 512-token sliding window) lpes-check finds the U-curve with room, .95/.375/.525/.575/1.00
    # with nothing right once the gold needle is removed (results/calibration_gemma3_multi_needle).
    # A ~2.3k-token prompt is a bfloat16 forward of ~1 s on 2 threads, ~4x a SmolLM2 sample: 16
    # samples per position is 80 forwards, ~80 s per individual; a 3-point sweep plus 10 + 3 x
    # (5 + 1) individuals is at most 31, ~45 min worst case (racing cuts it); then 200 held-out
    # samples per position for vanilla, PI, the best curve and the best uniform scale (4,000
    # forwards, about an hour; a later seed can reuse vanilla's scores, see results/).
    # Only the 3 global layers (5, 11, 17) move (--layer-type full_attention): scaling the
    # sliding-window layers breaks Gemma (1.5 there alone: -45 points; uniform 0.8: 0 at the end
    # position), and in the paper's range [1, 2] over all layers a first search's mutants were
    # all within a point of vanilla. On the global layers alone 2 to 8 lift the 25 and 50 %
    # positions by 19-31 points, but from 5 up they cost the end position 31-56 points, and
    # below 1 nothing helps (results/gemma3_layer_type_probe, 16 samples per position), so y
    # spans [1, 6] in steps of 0.25 with My 1, and the sweep tries 2 and 4 as starts.
    "gemma3-cpu": {
        "task": "multi_needle", "metadata": {"num_sentences": 240}, "fitness": "greedy",
        "num_samples": 16, "chunk_size": 8, "population": 10, "parents": 4, "mutants": 5, "crossovers": 1,
        "generations": 3, "layer_type": "full_attention", "y_min": 1.0, "y_max": 6.0, "y_step": 0.25,
        "initial_y": 1.0, "my": 1.0, "mx": 2.0, "sweep": "1,2,4", "heldout_samples": 200,
    },
    # Gemma-3-270M with base scaling (--scaling base: layer h's RoPE base becomes s_h x theta, its
    # layer type's theta), which `auto` picks for it on any device (on one H200: 2.5 min a search). Position scales could not remove its
    # bias: the gemma3-cpu search found nothing on its own samples and its curve gained +3.6 on 1,000
    # held-out ones (results/gemma3_multi_needle_heldout200), while one base 2 x theta on every
    # layer answered 80 of 80 search samples as Attention Buckets' best did (.975 against vanilla's
    # .831; results/tuned_baselines_gemma3/buckets_single_base). So: every layer moves (a base
    # factor leaves the fast frequencies that the sliding-window layers live on nearly as they
    # are), the sweep tries the uniform factors 1, 2 and 4 as starts, and y spans [0.5, 8] in steps
    # of 0.25 with My 1. The same task, samples, GA sizes and held-out table as gemma3-cpu.
    "gemma3-base-cpu": {
        "task": "multi_needle", "metadata": {"num_sentences": 240}, "fitness": "greedy",
        "num_samples": 16, "chunk_size": 8, "population": 10, "parents": 4, "mutants": 5, "crossovers": 1,
        "generations": 3, "scaling": "base", "y_min": 0.5, "y_max": 8.0, "y_step": 0.25,
        "initial_y": 1.0, "my": 1.0, "mx": 2.0, "sweep": "1,2,4", "heldout_samples": 200,
    },
    # The same calibrated multi_needle search scaled up for one GPU: the paper's population and
    # generations (432 individuals at most), 100 samples per position in batches of up to 100
    # prompts (racing per batch), bfloat16 (auto). The target on one H100 is 15 minutes for
    # SmolLM2: ~216k samples at the ~240 samples/s a batched bfloat16 scorer reached there.
    # Not yet measured on a GPU by this project.
    "gpu": {
        "task": "multi_needle", "fitness": "greedy", "num_samples": 100, "chunk_size": 100,
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
  cpu-bf16  the cpu search sized for a CPU that runs bfloat16 natively (avx512_bf16 /
         AMX; ~0.26 s a sample against 0.73 s in float32): population 12, 5 parents,
         6 mutants + 1 crossover, 4 generations, 20 samples per position (racing in
         chunks of 10); then 200 held-out samples per position (under 45 min on 2 cores)
  gpu    the cpu profile's multi_needle search scaled up for one GPU: the paper's
         population 32 / 12 parents / 16 mutants + 4 crossovers / 20 generations,
         100 samples per position (chunks of 100 = the batch), sweep 1,0.9,0.8,1.1,1.2,
         200 held-out samples per position; bfloat16 by --dtype auto (not yet measured
         on a GPU by this project)
  gemma3-cpu  Gemma-3-270M (--pretrained gemma3-270m) on a 2-core CPU: multi_needle with
         num_sentences 240 (~2.3k tokens, where it shows the U-curve), population 10,
         4 parents, 5 mutants + 1 crossover, 3 generations, 16 samples per position;
         only the global layers move (--layer-type full_attention; scaling its
         sliding-window layers breaks it), y in [1, 6], My 1, Mx 2, sweep 1,2,4; then
         200 held-out samples per position (~45 min of search in bfloat16, then about an
         hour of held-out table)
  gemma3-base-cpu  gemma3-cpu's task, samples and sizes with --scaling base on every
         layer (each factor multiplies the layer's RoPE base): y in [0.5, 8], sweep 1,2,4.
         Position scales could not remove Gemma's bias; a larger base does
  auto   (default) gemma3-base-cpu for --pretrained gemma3-270m (on any device); otherwise gpu when the
         model runs on a GPU; on a CPU, cpu-bf16 when --dtype resolves to bfloat16 (auto
         does where it is native), else cpu

why the cpu range is wide: on SmolLM2 the curves that remove position bias go to 1.5-1.85
in late layers, while *uniform* 1.2 already wrecks the model. The sweep therefore only
picks the starting individual (the best uniform scale); it never narrows the range.

examples:
  lpes-search                                   # bundled SmolLM2, profile auto
  lpes-search --profile paper --device cuda     # the paper's settings
  lpes-search --generations 5 --num-samples 50 --y-min 0.6 --y-max 1.6
  lpes-search --resume --output results/my_run  # continue a stopped run
  lpes-search --config my_search.json           # settings from a file (keys = long flag names)
  accelerate launch --multi_gpu --num_processes 2 searches/ga.py ...  # split each evaluation's samples (gloo on CPU)
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lpes-search", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help="JSON (or YAML) file of settings; its keys are the long flag names")
    p.add_argument("--profile", default="auto", choices=["auto", *PROFILES],
                   help="default settings: paper, cpu, cpu-bf16, gemma3-cpu, gemma3-base-cpu, gpu, or auto (gemma3-base-cpu for gemma3-270m; gpu on a GPU, cpu-bf16 on a CPU "
                        "with native bfloat16, else cpu); see below")
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
    fit.add_argument("--fitness", default="greedy", choices=MODES,
                     help="greedy (default): one pass, correct iff the gold answer is the greedy argmax; generate: "
                          "lm-eval generate_until + task metric (the paper's path); logprob: mean gold-token log-prob; "
                          "tiebreak: greedy accuracy, ties broken by the gold answer's probability")
    fit.add_argument("--weights", default="0.2,0.3,0.5", help="λ for begin,middle,end (default 0.2,0.3,0.5)")
    fit.add_argument("--objective", default="weighted", choices=OBJECTIVES,
                     help="weighted (default, the paper's): λ_B·begin + λ_M·middle + λ_E·end; ranked: the same λ by "
                          "rank, the largest to the worst-off role, so no position is traded away for another")
    fit.add_argument("--positions", default=None,
                     help="gold percents for begin,middle,end; join several with '+', e.g. 0,25+50+75,100 "
                          "(default: the task's roles; kv_retrieval 0,40,100; mdqa 0,50,100; multi_needle 0,25+50+75,100)")
    fit.add_argument("--num-samples", type=int, default=200, help="search samples per gold position (paper 200, cpu 12)")
    fit.add_argument("--metadata", default="{}", help="task options as JSON, e.g. '{\"num_pairs\": 30}'")
    fit.add_argument("--chunk-size", type=int, default=25, help="samples per racing step (paper 25, cpu 6)")
    fit.add_argument("--racing", action=argparse.BooleanOptionalAction, default=True,
                     help="stop scoring an individual once it cannot become a parent (default); --no-racing "
                          "scores every sample of every individual")
    fit.add_argument("--scorer", default="answer-logits", choices=SCORERS,
                     help="one-pass modes: answer-logits (default; each prompt runs once for all its answers, the output "
                          "layer only at the answer tokens) or lm-eval (lm-eval's loglikelihood, one row per answer, "
                          "full-vocabulary logits; same numbers, slower)")
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
    genes.add_argument("--layer-type", default=None, metavar="TYPE",
                       help="move only the layers of this attention type (the model config's layer_types, e.g. "
                            "full_attention = Gemma-3's global layers); the others keep plain RoPE (scale 1). "
                            "The sweep's, PI's and the held-out uniform rows move the same layers. Default: all "
                            "layers (gemma3-cpu: full_attention)")
    genes.add_argument("--scaling", default="position", choices=["position", "base"],
                       help="what a layer's factor s_h multiplies: position (the paper's: layer h reads position i "
                            "as i / s_h) or base (layer h's RoPE base becomes s_h x theta, at the true positions; "
                            "plain RoPE only). scales.json records it, so lpes_hf scales=<file> applies it. "
                            "Default position (gemma3-base-cpu: base)")
    genes.add_argument("--y-min", type=float, default=1.0, help="lowest scale (paper 1.0; cpu, cpu-bf16, gpu 0.25)")
    genes.add_argument("--y-max", type=float, default=2.0, help="highest scale (paper 2.0; cpu, cpu-bf16, gpu 2.5)")
    genes.add_argument("--y-step", type=float, default=0.1)
    genes.add_argument("--initial-y", type=float, default=1.5, help="y of the initial individual, clipped into range (paper 1.5, cpu 1.0)")
    out = p.add_argument_group("output")
    out.add_argument("--output", default=None, help="run directory (default results/<run-name>)")
    out.add_argument("--run-name", default=None, help="default: <task>_<curve>_seed<seed>")
    out.add_argument("--resume", action="store_true",
                     help="continue the run in --output where it stopped, with its own settings (read from its "
                          "config.json): no other flag is needed; one given again must keep its value, except "
                          "--generations, which may grow")
    out.add_argument("--overwrite", action="store_true", help="start afresh even if --output holds a run")
    out.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    out.add_argument("--heldout-samples", type=int, default=0,
                     help="after the search, score vanilla, PI and the best curve on this many held-out samples "
                          "per position, paired (intervals, McNemar p); 0 skips it. Default: the profile's "
                          "(cpu 40, cpu-bf16 and gpu 200, paper 0), scaled with --num-samples when that is changed "
                          "and this is not: e.g. cpu-bf16 with --num-samples 2 gets 200 x 2/20 = 20, so a quick "
                          "search gets a quick table")
    out.add_argument("--heldout-extra", default="pi,uniform",
                     help="the held-out table's rows besides vanilla and the best curve: a comma list of 'pi' "
                          "(the curve's mean, uniform) and 'uniform' (the sweep's best uniform scale, when it is "
                          "not 1), or 'none' (default: pi,uniform; the demo takes none to stay under 10 minutes)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = _read_config(parser, args.config) if args.config else {}
    # --resume: the run's own settings, as its config.json recorded them ({} for a folder made
    # before runs recorded them: its flags must be given again).
    saved = _saved_settings(parser, args) if args.resume else {}
    below = {**saved, **config}  # what lies beneath the command line
    profile = below.get("profile", args.profile) if args.profile == "auto" else args.profile
    if profile not in ("auto", *PROFILES):
        parser.error(f"--config {args.config}: profile {profile!r} is not one of auto, {', '.join(PROFILES)}")
    if profile == "auto":  # the command line wins over the config file
        dtype = args.dtype if args.dtype != "auto" else below.get("dtype", "auto")
        try:
            dtype = requested_dtype(dtype, args.model_args or below.get("model_args", ""))
        except ValueError as err:
            parser.error(str(err))
        profile = _auto_profile(args.device or below.get("device"), dtype, args.pretrained or below.get("pretrained"))
    # Precedence: command line > config file > the resumed run's saved settings > profile > the
    # flags' own (paper) defaults. The profile's held-out size is left open (None) until the
    # search's size is known.
    parser.set_defaults(**{**PROFILES[profile], "heldout_samples": None})
    parser.set_defaults(**saved)
    parser.set_defaults(**config)
    args = parser.parse_args(argv)
    args.profile = profile
    if args.heldout_samples is None:
        args.heldout_samples = profile_heldout_samples(profile, args.num_samples)
    try:
        _check(args)
    except ValueError as err:
        parser.error(str(err))
    # A profile's task options (gemma3-cpu: num_sentences 240) stay under the user's own
    # --metadata: adding num_needles must not silently drop the haystack size.
    args.metadata = {**PROFILES[profile].get("metadata", {}), **args.metadata}
    return args


# Flags that say how to run this command, not what the run is: never saved, never restored.
NOT_SAVED = frozenset({"config", "resume", "overwrite", "output", "no_progress"})
RUN_RECORD = "config.json"  # in the run folder: its "settings" are what --resume restores


def settings_record(args: argparse.Namespace) -> dict:
    """The run's settings under their flag names, as ``config.json``'s ``"settings"`` keeps them for
    ``--resume``: every flag of :func:`build_parser` (but :data:`NOT_SAVED`) with the value this
    run has, after profile, config file and command line. Generic over the parser: a flag added
    later is saved and restored with no further edit (a run saved before it existed gets the
    flag's default on resume)."""
    flags = {action.dest for action in build_parser()._actions if action.dest != "help"} - NOT_SAVED
    return json.loads(json.dumps({name: getattr(args, name) for name in sorted(flags) if hasattr(args, name)},
                                 default=str))


def run_folder(args: argparse.Namespace) -> Path:
    """The folder a run writes to (``--output``, else ``results/<run name>``)."""
    return Path(args.output or Path("results") / (args.run_name or f"{args.task}_{args.curve}_seed{args.seed}"))


def read_run_record(folder: Path) -> dict | None:
    """The run's ``config.json``, or None when there is none; ValueError when it is not JSON."""
    path = Path(folder) / RUN_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not a run record (a JSON object)")
    return record


def _saved_settings(parser, args) -> dict:
    """The settings a ``--resume`` restores from the run folder's ``config.json`` (unknown names,
    e.g. of a flag since removed, are left out); {} for a folder made before they were recorded.

    Without ``--output`` or ``--run-name`` the folder is known only once the settings are: the
    flags' values decide it (``results/<task>_<curve>_seed<seed>``), and nothing is restored."""
    if not (args.output or args.run_name):
        return {}
    folder = run_folder(args)
    try:
        record = read_run_record(folder)
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: --resume {folder}: {err}\n")
    if record is None:
        if not (folder / "checkpoint.json").is_file():
            parser.exit(2, f"{parser.prog}: error: --resume: no run in {folder} to continue (no {RUN_RECORD}, "
                           "no checkpoint.json)\n")
        return {}
    known = {action.dest for action in parser._actions} - NOT_SAVED
    return {name: value for name, value in (record.get("settings") or {}).items() if name in known}


def profile_heldout_samples(profile: str, num_samples) -> int:
    """The profile's held-out samples per position, scaled by the search's ``num_samples`` against the
    profile's own (rounded up): the table stays in proportion to the search it checks."""
    settings = PROFILES[profile]
    heldout = settings.get("heldout_samples", 0)
    searched = settings.get("num_samples", build_parser().get_default("num_samples"))
    if not heldout or not isinstance(num_samples, int) or num_samples < 1 or num_samples == searched:
        return heldout  # a bad --num-samples is named by the checks
    return math.ceil(heldout * num_samples / searched)


def _auto_profile(device, dtype, pretrained=None) -> str:
    """gemma3-base-cpu for the packaged Gemma-3-270M on any device; otherwise gpu on a GPU, and on a
    CPU cpu-bf16 where the search will run in bfloat16, else cpu.

    Gemma-3-270M needs its own task size (at multi_needle's default it has no position bias to
    remove, so the gpu profile would search for nothing) and base scaling; the profile's sizes fit
    a 2-core CPU and take 2.5 min on one H200. The two SmolLM2 CPU profiles differ only in size:
    bfloat16 is ~2.8x faster than float32 where the CPU runs it natively, so the same hour holds a
    larger search there.
    """
    if packaged_model(pretrained) is PACKAGED_MODELS["gemma3-270m"]:
        return "gemma3-base-cpu"
    if not _runs_on_cpu(device):
        return "gpu"
    return "cpu-bf16" if choose_dtype(dtype, "cpu") == "bfloat16" else "cpu"


def model_args_given(model_args: str) -> dict[str, str]:
    """``--model-args`` as lm-eval's 'k=v,k=v' form, read without importing lm-eval: bad flags must fail fast."""
    return dict(part.split("=", 1) for part in str(model_args or "").split(",") if "=" in part)


def requested_dtype(dtype_flag: str, model_args: str) -> str:
    """The dtype asked for, by ``--dtype`` or by ``dtype=`` in ``--model-args`` (not both)."""
    extra = model_args_given(model_args)
    if "dtype" in extra and dtype_flag != "auto":
        raise ValueError("give the dtype once: --dtype or dtype= in --model-args")
    return extra.get("dtype", dtype_flag).strip()


def _runs_on_cpu(device) -> bool:
    if device:
        return str(device).startswith("cpu")
    # An NVIDIA device node, without importing torch (seconds): bad flags must fail fast.
    return not any(Path("/dev").glob("nvidia[0-9]*"))


HELDOUT_EXTRA = ("pi", "uniform")


def _heldout_extra(value) -> tuple[str, ...]:
    """``--heldout-extra``: 'none' or a comma list of HELDOUT_EXTRA (a config file may give a list)."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    items = [str(item).strip().lower() for item in items if str(item).strip()]
    if items == ["none"]:
        return ()
    unknown = [item for item in items if item not in HELDOUT_EXTRA]
    if unknown or not items:
        raise ValueError(f"--heldout-extra {value!r}: give 'none' or a comma list of {', '.join(HELDOUT_EXTRA)}")
    return tuple(dict.fromkeys(items))


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
    unknown = sorted(set(settings) - known)
    if unknown:
        parser.error(f"--config {path}: unknown setting(s) {unknown}; use the long flag names, e.g. 'generations'")
    return settings


def _check(args) -> None:
    from lpes_harness.search.fitness import check_tiebreak, task_roles
    from lpes_harness.search.validate import check_search_args
    from lpes_harness.tasks.data import TaskDataError

    check_search_args(args)
    args.dtype_requested = requested_dtype(args.dtype, args.model_args)  # what auto and the run resolve
    given = model_args_given(args.model_args)
    if given.get("scaling", args.scaling).strip() != args.scaling:
        raise ValueError(f"--model-args scaling={given['scaling'].strip()} and --scaling {args.scaling} disagree; "
                         "give --scaling only")
    try:
        task_roles(args.task)
    except TaskDataError as err:
        raise ValueError(f"--task: {err}") from None
    args.weights_dict = _role_values(args.weights, "weights", float)
    args.positions_dict = _role_values(args.positions, "positions", _percent_list) if args.positions else None
    if args.fitness == "tiebreak":  # here, so that a bad setting is one line before anything loads
        check_tiebreak(args.weights_dict, args.num_samples, args.positions_dict or task_roles(args.task), args.objective)
    args.sweep_values = parse_sweep(args.sweep)
    args.heldout_extra = _heldout_extra(args.heldout_extra)
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
