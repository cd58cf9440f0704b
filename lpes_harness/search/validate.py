"""Checks of a search's settings (``searches/ga.py``) before anything heavy loads.

``check_search_args(args)`` takes the parsed ``argparse.Namespace`` (after the profile and
``--config`` are applied) and raises ``ValueError`` with one line naming the flag, the value
and what is allowed; the command line turns it into ``parser.error`` (exit code 2). It
imports no torch: the model's layer count, for the genome checks, comes from its
``config.json`` or GGUF header (:func:`lpes_harness.core.scales_file.model_layer_info`).

Attributes a namespace lacks are skipped, so the check follows the command line as it grows.
"""

from __future__ import annotations

import math
from typing import Any

from lpes_harness.core import arg_values
from lpes_harness.search.operators import check_mutation

_MISSING = object()
# flag -> (attribute, smallest value): the search sizes.
SIZES = {
    "--population": ("population", 1),
    "--parents": ("parents", 1),
    "--mutants": ("mutants", 0),
    "--crossovers": ("crossovers", 0),
    "--generations": ("generations", 0),
    "--crossover-tries": ("crossover_tries", 1),
    "--num-samples": ("num_samples", 1),
    "--chunk-size": ("chunk_size", 1),
    "--control-points": ("control_points", 2),
}
MAX_CONTROL_POINTS = 8
# Scale arguments the search sets itself: in --model-args they would be overwritten at once.
SEARCH_SETS = ("scales", "control_points", "curve", "pi")


def _get(args, name: str) -> Any:
    return getattr(args, name, _MISSING)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_search_args(args) -> None:
    """Raise ``ValueError("--flag value: what is allowed")`` for the first bad setting."""
    for flag, (name, smallest) in SIZES.items():
        value = _get(args, name)
        if value is _MISSING or value is None:
            continue
        if not _is_int(value) or value < smallest:
            raise ValueError(f"{flag} {value!r}: must be an integer >= {smallest}")
    _check_population(args)
    _check_mutation(args)
    _check_y_range(args)
    threads = _get(args, "threads")
    if threads not in (_MISSING, None) and (not _is_int(threads) or threads < 1):
        raise ValueError(f"--threads {threads!r}: must be an integer >= 1")
    batch_size = _get(args, "batch_size")
    if batch_size is not _MISSING and not _is_batch_size(batch_size):
        raise ValueError(f"--batch-size {batch_size!r}: must be an integer >= 1 or 'auto'")
    _check_model_args(args)
    _check_packaged_model(args)
    _check_genome_fits_the_model(args)


def _check_population(args) -> None:
    population, parents = _get(args, "population"), _get(args, "parents")
    mutants, crossovers = _get(args, "mutants"), _get(args, "crossovers")
    if _MISSING in (population, parents, mutants, crossovers):
        return
    if parents > population:
        raise ValueError(f"--parents {parents}: must be at most --population ({population})")
    if parents + crossovers + mutants != population:
        raise ValueError(
            f"--population {population}: must equal --parents + --crossovers + --mutants "
            f"({parents} + {crossovers} + {mutants} = {parents + crossovers + mutants}); "
            "each generation is the parents, the crossover children and the mutants"
        )
    if crossovers and parents < 2:
        raise ValueError(f"--crossovers {crossovers}: crossover needs --parents >= 2, got {parents}")


def _check_mutation(args) -> None:
    for flag, name in (("--mx", "mx"), ("--my", "my")):
        value = _get(args, name)
        if value is not _MISSING and (not _is_number(value) or value < 0):
            raise ValueError(f"{flag} {value!r}: must be a finite number >= 0")
    mutation = _get(args, "mutation")
    if mutation is not _MISSING:
        try:
            check_mutation(mutation)
        except ValueError as err:
            raise ValueError(f"--{err}") from None  # the flag's name, as the other checks give it
    mx, my, y_step = _get(args, "mx"), _get(args, "my"), _get(args, "y_step")
    if _MISSING in (mx, my, y_step) or not _is_number(y_step) or y_step <= 0:
        return
    x_moves = mx >= 1 and _get(args, "brute_force") is not True  # the x grid step is one layer
    if not x_moves and my + 1e-9 < y_step:
        raise ValueError(
            f"--my {my}: below the y step {y_step}, and x cannot move (--mx {mx}"
            f"{', --brute-force' if _get(args, 'brute_force') is True else ''}): a mutation could move nothing; "
            f"give --my >= {y_step}"
        )


def _check_y_range(args) -> None:
    y_min, y_max, y_step = _get(args, "y_min"), _get(args, "y_max"), _get(args, "y_step")
    if y_min is not _MISSING and (not _is_number(y_min) or y_min <= 0):
        raise ValueError(f"--y-min {y_min!r}: must be a finite number > 0 (it is a scale)")
    if y_max is not _MISSING and not _is_number(y_max):
        raise ValueError(f"--y-max {y_max!r}: must be a finite number")
    if y_min is not _MISSING and y_max is not _MISSING and y_max < y_min:
        raise ValueError(f"--y-min {y_min} --y-max {y_max}: the y range is empty; give --y-min <= --y-max")
    if y_step is not _MISSING and (not _is_number(y_step) or y_step <= 0):
        raise ValueError(f"--y-step {y_step!r}: must be a finite number > 0")
    initial_y = _get(args, "initial_y")
    if initial_y is not _MISSING and (not _is_number(initial_y) or initial_y <= 0):
        raise ValueError(f"--initial-y {initial_y!r}: must be a finite number > 0 (it is clipped into the y range)")


def _is_batch_size(value) -> bool:
    try:
        arg_values.batch_size(value)  # the fitness's own rule (answer_logits.resolve_batch_size)
    except ValueError:
        return False
    return True


def _model_args(args) -> dict:
    text = _get(args, "model_args")
    if text is _MISSING or not text:
        return {}
    if isinstance(text, dict):
        return dict(text)
    for item in str(text).split(","):
        if item.strip() and "=" not in item:
            raise ValueError(f"--model-args {text!r}: {item.strip()!r} is not key=value; give 'k=v,k=v'")
    from lm_eval.utils import simple_parse_args_string

    return simple_parse_args_string(str(text))


def _check_model_args(args) -> None:
    extra = _model_args(args)
    given = [key for key in SEARCH_SETS if key in extra]
    if given:
        raise ValueError(
            f"--model-args {_get(args, 'model_args')!r}: {', '.join(given)} cannot be given to a search, "
            "which sets the layer scales itself"
        )


def _check_packaged_model(args) -> None:
    """A short model name (``gemma3-270m``) whose package is not installed: say how to install it, now."""
    from lpes_harness.core.models import BundledModelMissing, resolve_pretrained

    pretrained = _get(args, "pretrained")
    try:
        resolve_pretrained(None if pretrained is _MISSING else pretrained)
    except BundledModelMissing as err:
        raise ValueError(str(err)) from None
    except OSError:
        return  # a path that is not there: the load reports it with the path


def _check_genome_fits_the_model(args) -> None:
    """``--control-points`` on the model's x grid (one position per layer), its layer count read cheaply."""
    points = _get(args, "control_points")
    if points is _MISSING or _get(args, "brute_force") is True:
        return
    if points > MAX_CONTROL_POINTS:
        raise ValueError(f"--control-points {points}: must be 2..{MAX_CONTROL_POINTS} (the paper studies 2..5)")
    from lpes_harness.core.scales_file import model_layer_info

    extra = _model_args(args)
    pretrained = _get(args, "pretrained")
    info = model_layer_info(
        None if pretrained is _MISSING else pretrained, extra.get("gguf_file"), extra.get("revision")
    )
    if info is not None and points > info["num_layers"]:
        raise ValueError(
            f"--control-points {points}: a {info['num_layers']}-layer model has {info['num_layers']} x positions "
            "for points with strictly increasing x"
        )
