"""A search run's start: the folder claimed, a resume checked, the model and fitness loaded, the plan.

:func:`start` refuses, before anything is loaded or written, a folder that holds another run (without
``--resume`` or ``--overwrite``), a resume with other settings, held-out caches of other samples and a
folder another lpes-search is running on. Then it loads the model and the fitness, prints the cost
estimate (or sizes the run to ``--time-budget``), and writes ``config.json``: from then on the folder holds
a run that ``--resume`` continues. It returns the :class:`~lpes_harness.search.run_context.Run` every
stage reads, or None where this process has no stages to run (``--estimate``; accelerate's other ranks,
which serve rank 0's evaluations until it is done).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from lpes_harness.core.models import auto_dtype, choose_dtype, default_device
from lpes_harness.evaluation.conditions import Condition, apply_chat_template
from lpes_harness.search.callbacks import load_checkpoint
from lpes_harness.search.config import SearchConfig
from lpes_harness.search.fingerprint import fingerprint
from lpes_harness.search.fitness import FitnessConfig
from lpes_harness.search.gradient_stage import GRADIENT_STATE, gradient_plan
from lpes_harness.search.racing_stage import RACING_FILE, racing_plan
from lpes_harness.search.run_context import Run
from lpes_harness.search.run_record import (RUN_RECORD, check_resume, clear_run_state, fail, holding_run_folder,
                                           idle_since_last_write, read_run_record, run_folder, settings_record)
from lpes_harness.search.timing import apply_budget, heldout_rows, heldout_share, print_estimate, time_one_sample


def start(args, folder_lock: contextlib.ExitStack) -> Run | None:
    """The run, checked, loaded and recorded; None where this process runs no stage (see the module)."""
    from lpes_harness.search import distributed, heldout
    from lpes_harness.search.condition_fitness import ConditionsFitness, condition_configs

    launched = time.perf_counter()  # the wall time a user waits: model load and sweep included
    launched_at = time.time()  # config.json's clock: started, and the gaps before resumes
    output = run_folder(args)
    checkpoint_path = output / "checkpoint.json"
    holds_run = checkpoint_path.exists() or (output / RUN_RECORD).exists()
    if holds_run and not (args.resume or args.overwrite or args.estimate):
        fail(f"{output} already holds a run: pass --resume to continue it or --overwrite to start afresh")
    if args.resume and not holds_run:
        fail(f"--resume: no run in {output} to continue (no {RUN_RECORD}, no checkpoint.json)")
    main_process = distributed.launched_rank() == 0  # accelerate's other ranks only serve rank 0
    # Before anything is loaded or written: a folder another lpes-search is running on is refused.
    holding = main_process and output.is_dir() and not args.estimate  # an estimate writes nothing there
    if holding:
        folder_lock.enter_context(holding_run_folder(output))
    # When the stopped process last did work, read before this one writes: the gap is not the run's time.
    idle_before = idle_since_last_write(output, launched_at) if args.resume else None
    try:
        record = read_run_record(output) if args.resume else None
    except ValueError as err:
        fail(f"--resume {output}: {err}")
    resume_search = args.resume and checkpoint_path.exists()  # else a resume before the search began
    saved_state = load_checkpoint(checkpoint_path) if resume_search else None  # read once: nothing rewrites it before the loop
    args.dtype_chosen, dtype_why = run_dtype(args.dtype_requested, args.device or default_device(), record)
    config, fitness_config, current = _configure(args)
    if args.resume:  # before anything is loaded or written: a resume never mixes two experiments
        check_resume(output, record, saved_state, current)
    conditions = run_conditions(args)
    several = bool(args.conditions)  # --condition given: the fitness and the tables go by condition
    if args.heldout_samples:
        try:
            heldout.check_caches(output, conditions, several, args)
        except ValueError as err:
            fail(str(err))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    context = distributed.init()
    if args.estimate and context.world > 1:
        fail("--estimate times one sample in one process; launch it without accelerate/torchrun")
    if several and context.world > 1:
        fail("--condition: a search over conditions runs in one process (the samples of each are not yet split "
             "across processes); launch it without accelerate/torchrun")
    lm = load_lm(args)
    from lpes_harness.core import rope

    num_layers = rope.num_layers(lm.model)
    configs = condition_configs(conditions, fitness_config) if several else {conditions[0].name: fitness_config}
    if several:
        fitness = ConditionsFitness(lm, configs, args.condition_objective)
    else:
        fitness = distributed.make_fitness(lm, fitness_config, context)
    if not context.is_main:
        distributed.serve(fitness, context)  # follow rank 0's evaluations until it is done
        return None

    chat = fitness.chat_template
    print(f"model dtype {args.dtype_chosen} (--dtype {args.dtype}{dtype_why}); chat template "
          f"{chat if several else ('on' if chat else 'off')}; "
          + (f"conditions {', '.join(c.name for c in conditions)} ({args.condition_objective})" if several else
             f"task {args.task}, positions {fitness_config.positions}"), flush=True)
    args.heldout_share = None  # set where a validation or a held-out table follows the search
    # A sample is timed (ten forwards or so) only for a plan or an estimate that uses it.
    drawn = args.search_method in ("gradient", "racing")  # a stage on drawn samples, with its own plan
    if args.time_budget_seconds and not resume_search and not drawn:
        apply_budget(args, fitness, time_one_sample(fitness), time.perf_counter() - launched)  # sets heldout_share
        config, fitness_config, current = _configure(args)
    elif args.heldout_samples or args.validation_samples:
        args.heldout_share = heldout_share(fitness)  # for the estimate, and --status's (config.json)
    left = _left_to_do(output) if resume_search and not args.time_budget_seconds else None
    spec, samples = _genome_spec(args, num_layers, lm), None
    plan, state = {"gradient": (gradient_plan, GRADIENT_STATE), "racing": (racing_plan, RACING_FILE)}.get(
        args.search_method, (None, None))
    if plan is not None and not (args.resume and (output / state).is_file()):
        # Before the folder is written: --estimate and --time-budget's plan time the stage's own samples.
        samples = plan(args, lm, fitness_config, fitness, spec, time.perf_counter() - launched)
    elif left:  # a resumed search: what is left of it, not the whole run's worst case again
        print(f"resumed; {left}", flush=True)
    elif not args.time_budget_seconds:  # a budgeted run printed its plan, and its deadline bounds it
        print_estimate(config, fitness, time_one_sample(fitness), len(args.sweep_values) + len(args.base_sweep_values),
                       heldout_rows(args) * _positions(conditions) * args.heldout_samples, args,
                       args.heldout_share or 1.0)
    if args.estimate:
        print(f"--estimate: nothing searched, nothing written ({output} not made or changed)", flush=True)
        return None
    run = Run(args=args, output=output, folder_lock=folder_lock, launched=launched, launched_at=launched_at,
              idle_before=idle_before, resume_search=resume_search, saved_state=saved_state, config=config,
              fitness_config=fitness_config, fingerprint=current, settings=settings_record(args),
              conditions=conditions, configs=configs, context=context, lm=lm, fitness=fitness,
              num_layers=num_layers, spec=spec, drawn_samples=samples)
    if not resume_search:
        # From here on the folder holds a run that --resume continues: before the sweep, so that
        # nothing it scores is lost to a kill.
        if main_process and not holding:  # a new folder: taken as it is made
            output.mkdir(parents=True, exist_ok=True)
            folder_lock.enter_context(holding_run_folder(output))
        if not args.resume:
            clear_run_state(output)  # --overwrite: an old run's state must not be resumed into this one
        run.write_record()
    return run


def run_conditions(args) -> list[Condition]:
    """The run's conditions: its ``--condition`` list, or the one its ``--task`` and ``--metadata`` make."""
    conditions = getattr(args, "conditions", None)
    if conditions:
        return list(conditions)
    return [Condition(name=args.task, task=args.task, metadata=dict(args.metadata), chat_template=args.chat_template)]


def _configure(args) -> tuple[SearchConfig, FitnessConfig, dict]:
    """The GA's settings, the fitness's, and the run's fingerprint, from the parsed flags."""
    config = SearchConfig.from_settings(args)  # the flags have the config's names
    fitness_config = FitnessConfig(
        task=args.task, fitness=args.fitness, objective=args.objective, weights=args.weights_dict, positions=args.positions_dict,
        metadata=args.metadata, num_samples=args.num_samples, chunk_size=args.chunk_size, racing=args.racing,
        scorer=args.scorer, chat_template=apply_chat_template(args.chat_template),
        batch_size=int(args.batch_size) if str(args.batch_size).isdigit() else args.batch_size,
        sample_order=args.sample_order,
    )
    current = fingerprint({**vars(args), **vars(fitness_config), "dtype": args.dtype_chosen})
    return config, fitness_config, current


def run_dtype(requested: str, device: str, record: dict | None) -> tuple[str, str]:
    """The dtype a run computes in, and why (for its log line). ``auto`` on a resume is the dtype the run
    was made in: ``auto`` decides by CPU kind, so a run resumed on another machine would otherwise be
    refused, or mix two dtypes in one search. A dtype asked for by name is taken as asked (the resume
    check then refuses one that differs from the run's)."""
    made_in = ((record or {}).get("model") or {}).get("dtype")
    if requested == "auto" and made_in:
        return made_in, ": the dtype the resumed run was made in"
    if requested == "auto":
        chosen, why = auto_dtype(device)
        return chosen, f": {why}"
    return choose_dtype(requested, device), ""


def load_lm(args):
    from lm_eval.utils import simple_parse_args_string

    from lpes_harness.lmeval.lpes_lm import LPESLM

    extra = simple_parse_args_string(args.model_args)
    extra.pop("dtype", None)  # resolved into args.dtype_chosen (auto -> bfloat16 only where native)
    extra["scaling"] = args.scaling  # --model-args may repeat it, never contradict it (cli._check)
    # lm-eval's own "auto" probes ever larger batches at the full window: slow on a CPU, and the
    # one-pass fitness batches by itself (FitnessConfig.batch_size); so lm-eval gets a number.
    batch_size = int(args.batch_size) if str(args.batch_size).isdigit() else 1
    return LPESLM(pretrained=args.pretrained, device=args.device, batch_size=batch_size, dtype=args.dtype_chosen, **extra)


def _left_to_do(output: Path) -> str | None:
    """``--status``'s line on what is left of the run in ``output`` (None where it cannot say)."""
    from lpes_harness.search.status import run_status

    try:
        lines = [line.strip() for line in run_status(output)]
    except (ValueError, OSError, KeyError):
        return None
    return next((line for line in lines if line.startswith("left:")), None)


def _positions(conditions) -> int:
    """Gold positions over all conditions (what one held-out sample per position costs)."""
    from lpes_harness.evaluation.paired import task_positions

    return sum(len(task_positions(c.task)) for c in conditions)


def _genome_spec(args, n_layers: int, lm):
    from lpes_harness.core.scaling import SCALINGS
    from lpes_harness.search.genome import GenomeSpec

    both = {"base_y_min": args.base_y_min, "base_y_max": args.base_y_max, "base_y_step": args.base_y_step,
            "base_initial_y": 1.0} if SCALINGS[args.scaling].paired else {}
    try:
        return GenomeSpec(
            num_layers=n_layers, num_points=args.control_points, y_min=args.y_min, y_max=args.y_max,
            y_step=args.y_step, curve=args.curve, brute_force=args.brute_force, initial_y=args.initial_y,
            held_layers=_held_layers(lm, args.layer_type), **both,
            position_held_layers=_held_layers(lm, getattr(args, "position_layer_type", None), "--position-layer-type"),
        )
    except ValueError as err:
        fail(str(err))


def _held_layers(lm, layer_type: str | None, flag: str = "--layer-type") -> tuple[int, ...]:
    """The layers ``--layer-type`` (or ``--position-layer-type``, in the position curve) keeps at 1:
    those of every other attention type."""
    if not layer_type:
        return ()
    from lpes_harness.evaluation.layer_types import layers_not_of
    from lpes_harness.core.models import config_layer_types

    types = config_layer_types(lm.model.config)
    try:
        held = layers_not_of(types, layer_type, flag)
    except ValueError as err:
        raise SystemExit(f"lpes-search: error: {err}") from None
    moved = [str(i) for i, kind in enumerate(types) if kind == layer_type]
    what = "the position curve moves" if flag == "--position-layer-type" else "the search moves"
    print(f"{flag} {layer_type}: {what} layers {', '.join(moved)}; the other {len(held)} stay at 1", flush=True)
    return held
