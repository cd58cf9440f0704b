"""The command line of ``lpes-search`` (``searches/ga.py``): flags, profiles, config files, and the checks of
the settings that run before anything heavy loads (``parse_args`` exits 2 with one line)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lpes_harness.commands import flags, search_method_flags
from lpes_harness.core.scaling import DEFAULT, SCALINGS
from lpes_harness.lmeval.position_scorer import MODES, SCORERS
from lpes_harness.search.config import INITIAL_POPULATIONS
from lpes_harness.search.fitness import OBJECTIVES, ROLES
from lpes_harness.search.condition_fitness import CONDITION_OBJECTIVES
from lpes_harness.search.profiles import EPILOG, PROFILES, auto_profile, profile_heldout_samples
from lpes_harness.search.sweep import check_lines, parse_lines, parse_sweep
from lpes_harness.search.run_record import RUN_RECORD, read_run_record, run_folder
from lpes_harness.search.sample_order import SAMPLE_ORDERS
from lpes_harness.search.selection import SELECTION_RULES

DESCRIPTION = """\
Search per-layer RoPE scales (LPES) with the paper's Bézier-constrained genetic algorithm.

Each individual is a set of control points; its curve gives one scale per decoder layer;
its fitness is λ_B·score(begin) + λ_M·score(middle) + λ_E·score(end) on the `search`
split of a position task, computed through lm-eval on one loaded lpes_hf model whose
scales are changed in place.
"""

def build_parser() -> argparse.ArgumentParser:
    p = flags.CommandParser(
        prog="lpes-search", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help="JSON (or YAML) file of settings; its keys are the long flag names")
    p.add_argument("--profile", default="auto", choices=["auto", *PROFILES],
                   help="default settings: " + ", ".join(PROFILES) + ", or auto (racing-smollm2 for the bundled "
                        "SmolLM2 on a CPU, robust-smollm2-gpu on a GPU, racing-gemma3 for gemma3-270m; for other models gpu on a GPU, cpu-bf16 on a CPU "
                        "where bfloat16 is native and faster than float32, else cpu); see below")
    model = p.add_argument_group("model")
    flags.add_pretrained(model)
    model.add_argument("--model-args", default="", help="extra lpes_hf/HFLM arguments, 'k=v,k=v' (e.g. dtype=float32)")
    flags.add_device(model)
    model.add_argument("--batch-size", default="auto",
                       help="prompts per forward of the fitness: an integer, or 'auto' (default: the largest that fits "
                            "on a GPU, halving on out-of-memory; 1 on a CPU, where batching measured no faster); also "
                            "lm-eval's batch size for generate mode. Racing scores at most --chunk-size prompts at once")
    flags.add_threads(model)
    flags.add_dtype(model, "auto", "auto; RoPE's cos/sin are computed in float32 either way")
    fit = p.add_argument_group("fitness")
    flags.add_task(fit, "kv_retrieval", "the profile's (the paper's kv_retrieval)")
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
    flags.add_metadata(fit)
    fit.add_argument("--condition", action="append", default=None, metavar="NAME=JSON",
                     help="search over several conditions (repeatable): each a name and task options as JSON on top "
                          "of --task and --metadata, plus 'task' and 'chat_template' (on/off/auto), e.g. "
                          "'4x length={\"num_sentences\": 240}'. Every individual is scored on the same samples of "
                          "each; the held-out table has one block per condition (robust profiles: 3 for SmolLM2, 2 "
                          "for Gemma-3)")
    fit.add_argument("--condition-objective", default="mean", choices=CONDITION_OBJECTIVES,
                     help="how the conditions' fitnesses combine: mean (default) or worst (the lowest condition)")
    fit.add_argument("--chunk-size", type=int, default=25, help="samples per racing step (paper 25, cpu 6)")
    fit.add_argument("--racing", action=argparse.BooleanOptionalAction, default=True,
                     help="stop scoring an individual once it cannot become a parent (default); --no-racing "
                          "scores every sample of every individual")
    fit.add_argument("--sample-order", default="roles", choices=SAMPLE_ORDERS,
                     help="the order racing scores an individual's samples in: roles (default: the heaviest role "
                          "first) or hardest (the samples earlier individuals got wrong first, so that racing stops "
                          "a hopeless individual sooner). The same individuals are selected either way; only the "
                          "forwards differ (benchmarks/sample_order.py)")
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
    ga.add_argument("--initial", default="mutants", choices=INITIAL_POPULATIONS,
                    help="generation 0 beside the start: mutants of it (default, the paper's) or random valid genomes "
                         "(wider: --initial random --generations 0 --parents 1 --crossovers 0 is a random search "
                         "raced against the best so far)")
    flags.add_seed(ga)
    ga.add_argument("--sweep", default="none",
                    help="uniform scales scored first, e.g. 1,0.8,1.2; the best starts the search (it does not "
                         "narrow the y range). 'none': start at --initial-y (cpu profile: 1,0.8,1.2)")
    ga.add_argument("--lines", default="none",
                    help="straight lines over depth scored right after the start, before any mutant or draw, each "
                         "raced against the best so far: FIRST:LAST from FIRST at layer 0 to LAST at the last layer, "
                         "comma-separated (demo: 0.6:1.4, the rising line the searched curves lean on, so that a "
                         "short budget still ends on a per-layer curve); 'none' (default)")
    search_method_flags.add_search_method_flags(p)
    genes = p.add_argument_group("genome")
    genes.add_argument("--curve", default="bezier", choices=["bezier", "linear", "step"])
    genes.add_argument("--control-points", type=int, default=4, help="number of control points, 2..5 (default 4: cubic)")
    genes.add_argument("--brute-force", action="store_true", help="one gene per layer (ablation), initialised U(y_min, y_max)")
    genes.add_argument("--layer-type", default=None, metavar="TYPE",
                       help="move only the layers of this attention type (the model config's layer_types, e.g. "
                            "full_attention = Gemma-3's global layers); the others keep plain RoPE (scale 1). "
                            "The sweep's, PI's and the held-out uniform rows move the same layers. Default: all "
                            "layers (gemma3-cpu: full_attention)")
    genes.add_argument("--position-layer-type", default=None, metavar="TYPE",
                       help="--scaling both: the position curve moves only the layers of this attention type, the "
                            "base curve every layer --layer-type allows (Gemma-3: position factors break its "
                            "sliding-window layers, base factors help them). Default: both curves on the same layers")
    genes.add_argument("--scaling", default=DEFAULT, choices=SCALINGS,  # the table itself: a new entry is a choice
                       help="what a layer's factor s_h multiplies: position (the paper's: layer h reads position i "
                            "as i / s_h), base (layer h's RoPE base becomes s_h x theta, at the true positions; "
                            "plain RoPE only), or both (two curves in one genome: each layer's position factor and "
                            "base factor; --base-y-* give the base curve's range). scales.json records it, so "
                            "lpes_hf scales=<file> applies it. Default position (gemma3-base-cpu: base; "
                            "robust-smollm2: both)")
    genes.add_argument("--base-y-min", type=float, default=0.5, help="--scaling both: lowest base factor (default 0.5)")
    genes.add_argument("--base-y-max", type=float, default=4.0, help="--scaling both: highest base factor (default 4)")
    genes.add_argument("--base-y-step", type=float, default=0.25, help="--scaling both: the base factors' grid step")
    genes.add_argument("--my-base", type=float, default=None,
                       help="--scaling both: max y move of a base control point per mutation (default: as many "
                            "grid steps as --my is of the position curve's)")
    genes.add_argument("--base-sweep", default="none",
                       help="--scaling both: uniform base factors the sweep scores beside --sweep's position factors, "
                            "e.g. 2,4; the best of either kind starts the search")
    genes.add_argument("--y-min", type=float, default=1.0, help="lowest scale (paper 1.0; cpu, cpu-bf16, gpu 0.25)")
    genes.add_argument("--y-max", type=float, default=2.0, help="highest scale (paper 2.0; cpu, cpu-bf16, gpu 2.5)")
    genes.add_argument("--y-step", type=float, default=0.1)
    genes.add_argument("--initial-y", type=float, default=1.5, help="y of the initial individual, clipped into range (paper 1.5, cpu 1.0)")
    out = p.add_argument_group("output")
    out.add_argument("--output", type=flags.output_folder, default=None, help="run directory (default results/<run-name>)")
    out.add_argument("--run-name", default=None, help="default: <task>_<curve>_seed<seed>")
    out.add_argument("--resume", action="store_true", help="continue the run in --output where it stopped, with its "
                     "own settings (from its config.json): no other flag is needed; one given again must keep its "
                     "value, except --generations, which may grow")
    out.add_argument("--status", action="store_true", help="print where the run in --output stands, stage by stage, "
                     "and what is left, from its files alone, and exit: no model is loaded, nothing is written; safe "
                     "while the run goes on in another shell")
    out.add_argument("--estimate", action="store_true", help="time one sample of each condition on this machine, print "
                     "what the run would cost (or --time-budget's plan) and exit: nothing is searched or written")
    out.add_argument("--overwrite", action="store_true", help="start afresh even if --output holds a run: its checkpoint, "
                     "journals, results, tables and plots are removed first; score caches (keyed by scales) stay")
    out.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    out.add_argument("--heldout-samples", type=int, default=0,
                     help="after the search, score vanilla, PI and the best curve on this many held-out samples "
                          "per position, paired (intervals, McNemar p); 0 skips it. Default: the profile's "
                          "(cpu 40, cpu-bf16 and gpu 200, paper 0), scaled with --num-samples when that is changed "
                          "and this is not: e.g. cpu-bf16 with --num-samples 2 gets 200 x 2/20 = 20, so a quick "
                          "search gets a quick table")
    out.add_argument("--validation-samples", type=int, default=0,
                     help="honest selection: after the search, re-score its --select-top best individuals, the "
                          "uniform start and the best uniform factors on this many samples per position of a "
                          "validation split (disjoint from search and held-out samples), doubling them (up to 4x) "
                          "while two are within two standard errors; the winner becomes scales.json. 0 (default "
                          "outside the robust profiles): the search's best is the run's curve")
    out.add_argument("--select-top", type=int, default=4, help="individuals of the search the validation re-scores")
    out.add_argument("--selection-rule", choices=SELECTION_RULES, default=SELECTION_RULES[0],
                     help="how the validation chooses: two-se (default) weighs positions as the fitness does and "
                          "keeps a uniform factor unless a curve leads it by two standard errors; accuracy (the "
                          "racing profile's) weighs every validation prompt alike and takes the most accurate "
                          "candidate, a uniform factor only on an exact tie")
    out.add_argument("--uniform-tuning", action=argparse.BooleanOptionalAction, default=False,
                     help="write uniform.json: the best single factor of each kind the scaling has, tuned with the "
                          "search's fitness on at least the genetic search's forwards (robust profiles: on)")
    out.add_argument("--time-budget", default=None, metavar="DURATION",
                     help="e.g. 10m or 1h, or auto (20 min, or 600 samples' time where this CPU takes more than 2 s "
                          "a sample: make demo's on CPUs without AMX or avx512_bf16): time the first forwards, then "
                          "size the population, generations and the "
                          "held-out table so that the run ends within it (the table large enough for a +10-point "
                          "gain to reach p < 0.01, unless --heldout-samples or the config gives its size: 0 gives "
                          "the whole budget to the search), print the plan; refused before the search when it cannot be. "
                          "The search stops in time for its held-out table whatever it planned (a resume counts on "
                          "from the time spent). With --initial random the search is the start and random draws "
                          "until that deadline")
    out.add_argument("--heldout-extra", default="pi,uniform",
                     help="the held-out table's rows besides vanilla and the best curve: a comma list of 'pi' "
                          "(the curve's mean, uniform) and 'uniform' (the sweep's best uniform scale, when it is "
                          "not 1), or 'none' (default: pi,uniform; the demo takes none to stay under 10 minutes)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.status and (args.resume or args.overwrite):  # before --resume reads the folder: the flags are the error
        parser.error("--status only reads the run folder: give it without --resume or --overwrite")
    if args.estimate and (args.resume or args.status):
        parser.error("--estimate times a new run; for one under way, --status --output DIR says what is left")
    config = _read_config(parser, args.config) if args.config else {}
    # --resume: the run's own settings, as its config.json recorded them ({} for a folder made
    # before runs recorded them: its flags must be given again).
    saved = _saved_settings(parser, args) if args.resume else {}
    if args.condition is not None:  # a list the command line gives replaces the saved one, never extends it
        saved.pop("condition", None)
        config.pop("condition", None)
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
        profile = auto_profile(args.device or below.get("device"), dtype, args.pretrained or below.get("pretrained"))
    # Precedence: command line > config file > the resumed run's saved settings > profile > the
    # flags' own (paper) defaults. The profile's held-out size is left open (None) until the
    # search's size is known.
    defaults = {**PROFILES[profile], "heldout_samples": None}
    if args.condition is not None:  # the command line's list replaces the profile's (argparse would append to it)
        defaults.pop("condition", None)
    parser.set_defaults(**defaults)
    parser.set_defaults(**saved)
    parser.set_defaults(**config)
    args = parser.parse_args(argv)
    args.profile = profile
    # --time-budget sizes the table the user left open, and keeps one the command line or config sized.
    args.heldout_samples_asked = args.heldout_samples
    if args.heldout_samples is None:
        args.heldout_samples = profile_heldout_samples(profile, args.num_samples)
    _drop_profile_conditions_for_another_task(args, profile)
    try:
        _check(args)
    except ValueError as err:
        parser.error(str(err))
    if not args.output:  # --output's type checked a folder given; this is the default one, results/<run-name>
        try:
            flags.output_folder(str(run_folder(args)))
        except argparse.ArgumentTypeError as err:
            parser.error(f"the run's folder (no --output given) {err}")
    # A profile's task options (gemma3-cpu: num_sentences 240) stay under the user's own
    # --metadata: adding num_needles must not silently drop the haystack size.
    args.metadata = {**PROFILES[profile].get("metadata", {}), **args.metadata}
    args.setting_names = setting_names()  # what the run folder's record keeps (search.run_record.settings_record)
    return args


# Flags that say how to run this command, not what the run is: never saved, never restored.
NOT_SAVED = frozenset({"config", "resume", "overwrite", "output", "no_progress", "status", "estimate"})


def setting_names() -> list[str]:
    """The flags a run's ``config.json`` keeps under ``"settings"`` for ``--resume``: every flag of
    :func:`build_parser` but :data:`NOT_SAVED`. Generic over the parser: a flag added later is saved
    and restored with no further edit (a run saved before it existed gets the flag's default on resume)."""
    return sorted({action.dest for action in build_parser()._actions if action.dest != "help"} - NOT_SAVED)


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
    saved = {name: value for name, value in (record.get("settings") or {}).items() if name in known}
    if saved:  # recorded before --sample-order existed: it raced in the roles order (a profile may now say hardest)
        saved.setdefault("sample_order", "roles")
    return saved


def model_args_given(model_args: str) -> dict[str, str]:
    """``--model-args`` as lm-eval's 'k=v,k=v' form, read without importing lm-eval: bad flags must fail fast."""
    return dict(part.split("=", 1) for part in str(model_args or "").split(",") if "=" in part)


def requested_dtype(dtype_flag: str, model_args: str) -> str:
    """The dtype asked for, by ``--dtype`` or by ``dtype=`` in ``--model-args`` (not both)."""
    extra = model_args_given(model_args)
    if "dtype" in extra and dtype_flag != "auto":
        raise ValueError("give the dtype once: --dtype or dtype= in --model-args")
    return extra.get("dtype", dtype_flag).strip()


HELDOUT_EXTRA = ("pi", "uniform")


def _heldout_extra(value) -> tuple[str, ...]:
    """``--heldout-extra``: 'none' or a comma list of HELDOUT_EXTRA (a config file may give a list; an empty
    one is none, as a run's saved settings record it)."""
    given_list = isinstance(value, (list, tuple))
    items = value if given_list else str(value).split(",")
    items = [str(item).strip().lower() for item in items if str(item).strip()]
    if items == ["none"] or (given_list and not items):
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
    args.base_sweep_values = parse_sweep(args.base_sweep) if SCALINGS[args.scaling].paired else []
    args.line_values = check_lines(parse_lines(args.lines), args)
    args.heldout_extra = _heldout_extra(args.heldout_extra)
    _check_robust_settings(args)
    search_method_flags.check_search_method_settings(args)
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


def _drop_profile_conditions_for_another_task(args, profile: str) -> None:
    """A robust profile's conditions are options of its own task (multi_needle's haystack sizes): a
    search of another ``--task`` without ``--condition`` of its own searches that task alone."""
    own = PROFILES[profile]
    if args.task == own.get("task"):
        return
    if own.get("condition") and args.condition == own["condition"]:
        print(f"note: --task {args.task}: the {profile} profile's conditions are {own.get('task')}'s; searching "
              f"{args.task} alone (give --condition to search several)", file=sys.stderr)
        args.condition = None
    # Likewise the lengths the race draws from (racing-smollm2, auto's CPU profile for the bundled model): they
    # are multi_needle's num_sentences; another task's samples keep their own size.
    if own.get("draw_sentences") and args.draw_sentences == own["draw_sentences"]:
        print(f"note: --task {args.task}: the {profile} profile draws {own.get('task')}'s num_sentences "
              f"({own['draw_sentences']}); {args.task}'s samples keep their size (give --draw-sentences to draw)",
              file=sys.stderr)
        args.draw_sentences = "none"
    if own.get("every_item") and args.every_item and not search_method_flags.task_asks_items(args.task):
        print(f"note: --task {args.task}: cannot ask a prompt about every item; one question a prompt", file=sys.stderr)
        args.every_item = False


def _check_robust_settings(args) -> None:
    """--condition, --scaling both, --validation-samples, --select-top, --time-budget."""
    from lpes_harness.evaluation.conditions import search_conditions
    from lpes_harness.search.budget import parse_duration

    metadata = args.metadata
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError:
            metadata = {}  # named by the --metadata check
    args.conditions = search_conditions(args.condition or [], args.task, metadata if isinstance(metadata, dict) else {},
                                        args.chat_template)
    if SCALINGS[args.scaling].paired:
        if args.brute_force:
            raise ValueError("--scaling both searches two curves of control points; --brute-force has one gene per layer")
        if not (0 < args.base_y_min <= args.base_y_max) or args.base_y_step <= 0:
            raise ValueError(f"--base-y-min {args.base_y_min} --base-y-max {args.base_y_max} --base-y-step "
                             f"{args.base_y_step}: need 0 < min <= max and a step > 0")
        if args.my_base is not None and args.my_base < 0:
            raise ValueError(f"--my-base {args.my_base}: must be >= 0")
    elif getattr(args, "position_layer_type", None):
        raise ValueError(f"--position-layer-type {args.position_layer_type}: it holds the position curve of "
                         f"--scaling both on the other layers; with --scaling {args.scaling} use --layer-type")
    if args.validation_samples < 0 or args.select_top < 1:
        raise ValueError(f"--validation-samples {args.validation_samples} / --select-top {args.select_top}: "
                         "need >= 0 and >= 1")
    args.time_budget_seconds = parse_duration(args.time_budget) if args.time_budget else None


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
