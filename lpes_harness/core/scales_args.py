"""What a user gives ``lpes_hf`` for its scales: ``scales``, ``control_points``, ``curve``, ``pi``,
``layer_type``, ``scaling``.

Shared by ``lpes_hf`` (:mod:`lpes_harness.lmeval.lpes_lm`) and the start-up hook, which runs these checks from
lm-eval's command line before any model loads: so nothing here imports torch or transformers.
The layer count comes from the model's ``config.json`` or GGUF header
(:func:`lpes_harness.core.scales_file.model_layer_info`); a ``scales=`` path is a scales file
(:mod:`lpes_harness.core.scales_file`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from lpes_harness.core.arg_values import number_list, parse_bool, shown
from lpes_harness.core.scaling import DEFAULT, SCALINGS, Scaling
from lpes_harness.core.scales_file import (
    SAVED_SCALES_KEY,
    ScalesError,
    ScalesFileError,
    model_layer_info,
    read_scales_and_scaling,
)

SCALES_FORMS = "a number > 0 (uniform), numbers > 0 separated by ';' (one per layer), or a path to a JSON scales file"
_COUNTS = {2: "two"}  # spelled out in messages
SCALES_ARGS = ("scales", "control_points", "curve", "pi", "layer_type", "scaling")


def parse_scales(value: Any) -> float | list[float]:
    """What a user gave for ``scales=`` -> a number or a list of numbers, each finite and > 0.

    A number; a list; a string holding a number, numbers separated by ``;``, or the path of a
    scales file. The layer count is checked later (:func:`check_scales`).
    """
    return _parse_scales(value)[0]


def _parse_scales(value: Any) -> tuple[float | list[float], str | None]:
    """:func:`parse_scales`, and the scaling that a scales file names (None for anything else)."""
    given = f"scales={shown(value)}"
    if isinstance(value, bool) or value is None:
        raise ScalesError(f"{given} is not understood; give {SCALES_FORMS}")
    if isinstance(value, (int, float)):
        return _positive(float(value), given), None
    if isinstance(value, (list, tuple)):
        if not value:
            raise ScalesError(f"{given} is empty; give {SCALES_FORMS}")
        return [_positive(v, given, index) for index, v in enumerate(value)], None
    text = str(value).strip()
    given = f"scales={text!r}"
    if os.path.isfile(text) or text.endswith(".json") or os.path.isdir(text):
        try:
            return read_scales_and_scaling(text)
        except ScalesFileError as err:
            raise ScalesFileError(f"scales={err}") from None
    try:
        numbers = number_list(text)
    except ValueError:
        raise ScalesError(f"{given} is not understood; give {SCALES_FORMS}") from None
    if not numbers:
        raise ScalesError(f"{given} is empty; give {SCALES_FORMS}")
    if len(numbers) == 1:
        return _positive(numbers[0], given), None
    return [_positive(v, given, index) for index, v in enumerate(numbers)], None


def _positive(value: Any, given: str, index: int | None = None) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or not math.isfinite(number) or number <= 0:
        which = "the scale" if index is None else f"scale {index} ({value!r})"
        raise ScalesError(f"{given}: {which} must be a finite number > 0 (a layer reads position i as i / scale)")
    return number


def paired_forms(kind: Scaling) -> str:
    """What a paired scaling's ``scales=`` may be (``both``: a scales file of it, or its 2L numbers)."""
    blocks = ", then ".join(f"the L {axis} factors" for axis in kind.axes)
    return f"a scales file of scaling {kind.name}, or {kind.per_layer}L numbers > 0 separated by ';' ({blocks})"


def ambiguous(given: str, kind: Scaling) -> str:
    """Why one number cannot be a paired scaling's factors."""
    which = " or ".join(f"a {axis}" for axis in kind.axes)
    return f"{given} with scaling={kind.name} is ambiguous ({which} factor?); give {paired_forms(kind)}"


def check_scales(scales: float | Sequence[float], num_layers: int, given: str = "scales",
                 scaling: str = DEFAULT) -> list[float]:
    """One scale per layer: a single number is used for every layer, a list must have ``num_layers``.

    ``scaling="both"``: a list of ``2 * num_layers`` (the position factors, then the base factors)."""
    kind = SCALINGS[scaling]
    if kind.paired:
        if isinstance(scales, (int, float)) and not isinstance(scales, bool):
            raise ScalesError(ambiguous(given, kind))
        values = [float(s) for s in scales]
        if len(values) != kind.per_layer * num_layers:
            blocks = " then ".join(f"the {num_layers} {axis} factors" for axis in kind.axes)
            raise ScalesError(
                f"{given} gives {len(values)} factors but scaling={scaling} takes {kind.per_layer} per decoder layer: "
                f"this model has {num_layers}, so {kind.per_layer * num_layers} numbers, {blocks}"
            )
        return values
    if isinstance(scales, (int, float)) and not isinstance(scales, bool):
        return [float(scales)] * num_layers
    values = [float(s) for s in scales]
    if len(values) != num_layers:
        raise ScalesError(
            f"{given} gives {len(values)} scales but the model has {num_layers} decoder layers; "
            "give one scale per layer, or a single number for all"
        )
    return values


@dataclass
class ScalesArgs:
    """lpes_hf's scale arguments, parsed and checked as far as possible without the model."""

    scales: float | list[float] | None = None
    control_points: list[tuple[float, float]] | None = None
    curve: str = "bezier"
    pi: bool = False
    layer_type: str | None = None
    # What the factors multiply; None when neither ``scaling=`` nor a scales file says (then the
    # model's saved scaling, else positions).
    scaling: str | None = None
    given: dict = field(default_factory=dict)  # argument -> how the user wrote it, for messages

    def scaling_for(self, saved_scaling: str | None = None) -> str:
        """What the factors multiply: ``scaling=`` or the scales file's; else, when the model's saved
        scales are used (no ``scales``, no ``control_points``), their ``saved_scaling``; else positions."""
        from_saved = self.scales is None and self.control_points is None
        return self.scaling or (saved_scaling if from_saved and saved_scaling else DEFAULT)

    def layer_scales(self, num_layers: int, saved: Sequence[float] | None = None,
                     layer_types: Sequence[str] | None = None, scaling: str | None = None) -> list[float] | None:
        """One scale per layer for a model of ``num_layers`` layers, or None (nothing given).

        ``saved``: scales kept in the model's config, which ``pi=true`` alone averages.
        ``layer_types``: the model's attention type per layer, which ``layer_type`` needs; the
        check before the model loads has none and checks the rest.
        ``scaling``: what the factors multiply (:meth:`scaling_for`; default ``self.scaling`` or
        positions); under ``both`` the result is 2L numbers, the position factors then the base factors.
        """
        from lpes_harness.core import curves

        scaling = scaling or self.scaling or DEFAULT
        if self.scales is not None:
            values = check_scales(self.scales, num_layers, self.given["scales"], scaling)
        elif self.control_points is not None:
            try:
                values = curves.curve_scales(self.control_points, num_layers, curve=self.curve)
            except ValueError as err:
                raise ScalesError(f"{self.given['control_points']}: {err}") from None
        elif self.pi and saved:
            values = check_scales(list(saved), num_layers, f"the model's saved {SAVED_SCALES_KEY}", scaling)
        elif self.pi:
            raise ScalesError(
                f"{self.given['pi']} has nothing to average: give scales=... or control_points=... "
                "(or a model saved with LPES scales)"
            )
        else:
            return None
        kept = range(num_layers)
        if self.layer_type and layer_types is not None:
            # A curve searched with --layer-type T moved only T's layers (Gemma-3's global ones:
            # its sliding-window layers break under any scale). Its PI is then the mean over those
            # layers, put on those layers, and a uniform scale goes only there too.
            kept = [i for i, kind in enumerate(layer_types) if kind == self.layer_type]
            if not kept:
                raise ScalesError(f"{self.given['layer_type']}: this model's layers are of type(s) "
                                  f"{', '.join(dict.fromkeys(layer_types))}")
        curves_out = []
        for curve in SCALINGS[scaling].halves(values):  # both: the position factors, then the base factors, alike
            if self.pi:
                curve = [sum(curve[i] for i in kept) / len(kept)] * num_layers
            curves_out.append([curve[i] if i in kept else 1.0 for i in range(num_layers)])
        return SCALINGS[scaling].join(*curves_out)


def parse_scales_args(scales: Any = None, control_points: Any = None, curve: Any = None, pi: Any = False,
                      layer_type: Any = None, scaling: Any = None) -> ScalesArgs:
    """Check lpes_hf's ``scales`` / ``control_points`` / ``curve`` / ``pi`` / ``layer_type`` / ``scaling``
    before the model loads.

    Everything but the layer count: :meth:`ScalesArgs.layer_scales` checks that once known. A scales
    file's own ``scaling`` applies when ``scaling=`` is not given; given, it must agree.
    """
    from lpes_harness.core import curves

    given = {}
    if scales is not None and control_points is not None:
        raise ScalesError(
            f"scales={shown(scales)} and control_points={shown(control_points)} both given; give either, not both"
        )
    parsed_curve = "bezier"
    if curve is not None:
        given["curve"] = f"curve={shown(curve)}"
        if not isinstance(curve, str) or curve not in curves.CURVES:
            raise ScalesError(f"{given['curve']} is not a curve; accepted: {', '.join(sorted(curves.CURVES))}")
        if control_points is None and curve != "bezier":
            raise ScalesError(f"{given['curve']} shapes control_points=... only, and none are given")
        parsed_curve = curve
    parsed_pi = parse_bool("pi", pi if pi is not None else False, ScalesError)
    given["pi"] = f"pi={shown(pi)}"
    result = ScalesArgs(curve=parsed_curve, pi=parsed_pi, given=given)
    in_file = None
    if scales is not None:
        given["scales"] = f"scales={shown(scales.strip() if isinstance(scales, str) else scales)}"
        result.scales, in_file = _parse_scales(scales)
    if scaling is not None:
        given["scaling"] = f"scaling={shown(scaling)}"
        if scaling not in SCALINGS:
            raise ScalesError(f"{given['scaling']} is not understood; accepted: "
                              + ", ".join(kind.description for kind in SCALINGS.values()))
        result.scaling = scaling
    if in_file is not None and result.scaling not in (None, in_file):
        raise ScalesError(f"{given['scaling']} but {given['scales']} holds factors of scaling {in_file!r}; "
                          f"drop scaling= (the file's applies) or give scaling={in_file}")
    result.scaling = result.scaling or in_file
    kind = SCALINGS[result.scaling or DEFAULT]
    if kind.paired and isinstance(result.scales, float):
        raise ScalesError(ambiguous(given["scales"], kind))
    if kind.paired and control_points is not None:
        raise ScalesError(f"control_points={shown(control_points)} make one curve, and scaling={kind.name} takes "
                          f"{_COUNTS.get(kind.per_layer, kind.per_layer)} ({' and '.join(kind.axes)} factors); "
                          f"give scales= with {paired_forms(kind)}")
    if control_points is not None:
        given["control_points"] = f"control_points={shown(control_points)}"
        try:
            if isinstance(control_points, str):
                points = curves.parse_control_points(control_points)
            elif isinstance(control_points, (list, tuple)):
                points = list(control_points)
            else:
                raise ValueError(f"expected 'x:y' pairs separated by ';', e.g. {curves.EXAMPLE_CONTROL_POINTS!r}")
            result.control_points = curves.validate_control_points(points, None)
        except ValueError as err:
            raise ScalesError(f"{given['control_points']}: {err}") from None
    if layer_type is not None:
        given["layer_type"] = f"layer_type={shown(layer_type)}"
        if not isinstance(layer_type, str) or not layer_type.strip():
            raise ScalesError(f"{given['layer_type']} is not an attention type; give one the model's config names "
                              "in layer_types, e.g. full_attention")
        if scales is None and control_points is None and not parsed_pi:
            raise ScalesError(f"{given['layer_type']} restricts scales=..., control_points=... or pi=true to "
                              "that type's layers, and none is given")
        result.layer_type = layer_type.strip()
    return result


def check_model_args(model_args: Mapping[str, Any]) -> ScalesArgs:
    """lpes_hf's scale arguments checked before the model loads, layer count included when the
    model's config (or GGUF header) can be read cheaply. Raises :class:`ScalesError`."""
    parsed = parse_scales_args(**{key: model_args[key] for key in SCALES_ARGS if key in model_args})
    if parsed.scales is None and parsed.control_points is None and not parsed.pi:
        return parsed
    info = model_layer_info(model_args.get("pretrained"), model_args.get("gguf_file"), model_args.get("revision"))
    if info is not None:
        parsed.layer_scales(info["num_layers"], info.get("saved_scales"),
                            scaling=parsed.scaling_for(info.get("saved_scaling")))
    return parsed
