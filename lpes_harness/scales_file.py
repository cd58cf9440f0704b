"""The JSON scales file: what a search writes and what ``lpes_hf scales=<path>`` reads.

Format (``"format": "lpes-scales/1"``)::

    {
      "format": "lpes-scales/1",
      "scales": [1.5, 1.48, ...],          # one float per decoder layer (required)
      "num_layers": 30,                    # must equal len(scales) when present
      "curve": "bezier",                   # optional: how the scales were made
      "control_points": [[0, 1.5], ...],   # optional
      "model": "SmolLM2-135M-Instruct",    # optional, informational
      "fitness": 0.41                      # optional, informational
    }

A bare JSON list of numbers is accepted too; every scale must be a finite number > 0.

The second half checks what a user gives ``lpes_hf`` for its scales (``scales``,
``control_points``, ``curve``, ``pi``): the same functions serve ``lm.py`` and the start-up
hook that runs them from ``lm_eval``'s command line before the model loads (so nothing here
imports torch), with the layer count read from the model's ``config.json`` or GGUF header.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from lpes_harness.files import atomic_write_text

FORMAT = "lpes-scales/1"


class ScalesError(ValueError):
    """Bad scales input; the one-line message names the argument, its value and what is accepted."""


class ScalesFileError(ScalesError):
    pass


def read_scales_file(path: str | os.PathLike) -> list[float]:
    """The scales of a file: each a finite number > 0. Errors start with the path (``path:line:`` for JSON)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ScalesFileError(f"{path}: scales file not found") from err
    except IsADirectoryError as err:
        raise ScalesFileError(f"{path}: is a directory, not a scales file") from err
    except UnicodeDecodeError as err:
        raise ScalesFileError(f"{path}: not a text (JSON) file") from err
    except json.JSONDecodeError as err:
        raise ScalesFileError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err
    if isinstance(data, dict):
        if not isinstance(data.get("scales"), list):
            what = "has no 'scales' key" if "scales" not in data else f"has 'scales' {_kind(data['scales'])}"
            raise ScalesFileError(
                f"{path}: {what}; a scales file is a JSON list of numbers or an object with a 'scales' list (format {FORMAT})"
            )
        scales = data["scales"]
        if "num_layers" in data and data["num_layers"] != len(scales):
            raise ScalesFileError(
                f"{path}: 'num_layers' is {data['num_layers']!r} but 'scales' has {len(scales)} entries"
            )
    elif isinstance(data, list):
        scales = data
    else:
        raise ScalesFileError(
            f"{path}: holds {_kind(data)}; a scales file is a JSON list of numbers or an object with a 'scales' list "
            f"(format {FORMAT})"
        )
    if not scales:
        raise ScalesFileError(f"{path}: 'scales' is empty; give one number > 0 per decoder layer")
    for index, value in enumerate(scales):
        if not _is_number(value) or value <= 0:
            raise ScalesFileError(f"{path}: scale {index} is {value!r}; every scale must be a finite number > 0")
    return [float(s) for s in scales]


def _kind(value) -> str:
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r:.40})"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else type(value).__name__


def write_scales_file(path: str | os.PathLike, scales: list[float], **extra: Any) -> None:
    """Write atomically: readers never see a half-written file."""
    document = {"format": FORMAT, "scales": [float(s) for s in scales], "num_layers": len(scales), **extra}
    atomic_write_text(path, json.dumps(document, indent=2) + "\n")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ------------------------------------------------------------ what a user gives lpes_hf
#
# Shared by lpes_hf (lm.py) and the start-up hook, which runs them from lm-eval's command line
# before any model loads: so nothing here imports torch or transformers.

SCALES_FORMS = "a number > 0 (uniform), numbers > 0 separated by ';' (one per layer), or a path to a JSON scales file"
SCALES_ARGS = ("scales", "control_points", "curve", "pi")
# rope.CONFIG_KEY: where rope.install keeps the scales in a model's config (rope imports torch).
SAVED_SCALES_KEY = "lpes_scales"
_TRUE, _FALSE = {"true", "yes", "1"}, {"false", "no", "0"}


def _shown(value: Any) -> str:
    """A value as the user wrote it (lm-eval turns ``true`` into True and ``-1`` into -1.0)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


def number_list(text: str, separators: str = ";") -> list[float]:
    """The numbers in ``text`` separated by any of ``separators`` (blank parts skipped).

    The one parser of ``1.0;1.3;1.6`` lists (scales here, the baselines' ``bases``); raises
    ``ValueError`` on a part that is not a number, each caller words its own error.
    """
    for separator in separators[1:]:
        text = text.replace(separator, separators[0])
    return [float(part) for part in text.split(separators[0]) if part.strip()]


def parse_scales(value: Any) -> float | list[float]:
    """What a user gave for ``scales=`` -> a number or a list of numbers, each finite and > 0.

    A number; a list; a string holding a number, numbers separated by ``;``, or the path of a
    scales file. The layer count is checked later (:func:`check_scales`).
    """
    given = f"scales={_shown(value)}"
    if isinstance(value, bool) or value is None:
        raise ScalesError(f"{given} is not understood; give {SCALES_FORMS}")
    if isinstance(value, (int, float)):
        return _positive(float(value), given)
    if isinstance(value, (list, tuple)):
        if not value:
            raise ScalesError(f"{given} is empty; give {SCALES_FORMS}")
        return [_positive(v, given, index) for index, v in enumerate(value)]
    text = str(value).strip()
    given = f"scales={text!r}"
    if os.path.isfile(text) or text.endswith(".json") or os.path.isdir(text):
        try:
            return read_scales_file(text)
        except ScalesFileError as err:
            raise ScalesFileError(f"scales={err}") from None
    try:
        numbers = number_list(text)
    except ValueError:
        raise ScalesError(f"{given} is not understood; give {SCALES_FORMS}") from None
    if not numbers:
        raise ScalesError(f"{given} is empty; give {SCALES_FORMS}")
    if len(numbers) == 1:
        return _positive(numbers[0], given)
    return [_positive(v, given, index) for index, v in enumerate(numbers)]


def _positive(value: Any, given: str, index: int | None = None) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or not math.isfinite(number) or number <= 0:
        which = "the scale" if index is None else f"scale {index} ({value!r})"
        raise ScalesError(f"{given}: {which} must be a finite number > 0 (a layer reads position i as i / scale)")
    return number


def check_scales(scales: float | Sequence[float], num_layers: int, given: str = "scales") -> list[float]:
    """One scale per layer: a single number is used for every layer, a list must have ``num_layers``."""
    if isinstance(scales, (int, float)) and not isinstance(scales, bool):
        return [float(scales)] * num_layers
    values = [float(s) for s in scales]
    if len(values) != num_layers:
        raise ScalesError(
            f"{given} gives {len(values)} scales but the model has {num_layers} decoder layers; "
            "give one scale per layer, or a single number for all"
        )
    return values


def parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ScalesError(f"{name}={_shown(value)} is not allowed; give true or false")


@dataclass
class ScalesArgs:
    """lpes_hf's scale arguments, parsed and checked as far as possible without the model."""

    scales: float | list[float] | None = None
    control_points: list[tuple[float, float]] | None = None
    curve: str = "bezier"
    pi: bool = False
    given: dict = field(default_factory=dict)  # argument -> how the user wrote it, for messages

    def layer_scales(self, num_layers: int, saved: Sequence[float] | None = None) -> list[float] | None:
        """One scale per layer for a model of ``num_layers`` layers, or None (nothing given).

        ``saved``: scales kept in the model's config, which ``pi=true`` alone averages.
        """
        from lpes_harness import curves

        if self.scales is not None:
            values = check_scales(self.scales, num_layers, self.given["scales"])
        elif self.control_points is not None:
            try:
                values = curves.curve_scales(self.control_points, num_layers, curve=self.curve)
            except ValueError as err:
                raise ScalesError(f"{self.given['control_points']}: {err}") from None
        elif self.pi and saved:
            values = check_scales(list(saved), num_layers, f"the model's saved {SAVED_SCALES_KEY}")
        elif self.pi:
            raise ScalesError(
                f"{self.given['pi']} has nothing to average: give scales=... or control_points=... "
                "(or a model saved with LPES scales)"
            )
        else:
            return None
        if self.pi:
            values = [sum(values) / len(values)] * num_layers
        return values


def parse_scales_args(scales: Any = None, control_points: Any = None, curve: Any = None, pi: Any = False) -> ScalesArgs:
    """Check lpes_hf's ``scales`` / ``control_points`` / ``curve`` / ``pi`` before the model loads.

    Everything but the layer count: :meth:`ScalesArgs.layer_scales` checks that once known.
    """
    from lpes_harness import curves

    given = {}
    if scales is not None and control_points is not None:
        raise ScalesError(
            f"scales={_shown(scales)} and control_points={_shown(control_points)} both given; give either, not both"
        )
    parsed_curve = "bezier"
    if curve is not None:
        given["curve"] = f"curve={_shown(curve)}"
        if not isinstance(curve, str) or curve not in curves.CURVES:
            raise ScalesError(f"{given['curve']} is not a curve; accepted: {', '.join(sorted(curves.CURVES))}")
        if control_points is None and curve != "bezier":
            raise ScalesError(f"{given['curve']} shapes control_points=... only, and none are given")
        parsed_curve = curve
    parsed_pi = parse_bool("pi", pi if pi is not None else False)
    given["pi"] = f"pi={_shown(pi)}"
    result = ScalesArgs(curve=parsed_curve, pi=parsed_pi, given=given)
    if scales is not None:
        given["scales"] = f"scales={_shown(scales.strip() if isinstance(scales, str) else scales)}"
        result.scales = parse_scales(scales)
    if control_points is not None:
        given["control_points"] = f"control_points={_shown(control_points)}"
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
    return result


def check_model_args(model_args: Mapping[str, Any]) -> ScalesArgs:
    """lpes_hf's scale arguments checked before the model loads, layer count included when the
    model's config (or GGUF header) can be read cheaply. Raises :class:`ScalesError`."""
    parsed = parse_scales_args(**{key: model_args[key] for key in SCALES_ARGS if key in model_args})
    if parsed.scales is None and parsed.control_points is None and not parsed.pi:
        return parsed
    info = model_layer_info(model_args.get("pretrained"), model_args.get("gguf_file"), model_args.get("revision"))
    if info is not None:
        parsed.layer_scales(info["num_layers"], info.get("saved_scales"))
    return parsed


# ------------------------------------------------------- the layer count, without the weights


def model_layer_info(pretrained: Any = None, gguf_file: str | None = None, revision: str | None = None) -> dict | None:
    """``{"num_layers", "saved_scales", "source"}`` from a model's config.json or GGUF header, or None.

    Reads a few KB: a local directory's ``config.json``, a ``.gguf`` file's metadata (the bundled
    model's too), or a hub model's ``config.json`` already in the local cache. None when it
    cannot be known that way; the model load then checks.
    """
    try:
        return _model_layer_info(pretrained, gguf_file, revision)
    except Exception:  # never fail here: the load reports a missing or unreadable model itself
        return None


def _model_layer_info(pretrained, gguf_file, revision) -> dict | None:
    from lpes_harness.models import resolve_pretrained

    if pretrained is not None and not isinstance(pretrained, str):
        return None  # a model object
    directory, gguf_name = resolve_pretrained(pretrained, gguf_file)
    if gguf_name:
        path = Path(directory) / gguf_name
        layers = gguf_block_count(path) if path.is_file() else None
        return None if layers is None else {"num_layers": layers, "saved_scales": None, "source": str(path)}
    config_path = Path(directory) / "config.json"
    if not config_path.is_file():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(directory, "config.json", revision=revision)
        if not isinstance(cached, str):
            return None
        config_path = Path(cached)
    config = json.loads(config_path.read_text())
    for section in (config, config.get("text_config") or {}):
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if isinstance(section.get(key), int) and not isinstance(section.get(key), bool):
                saved = config.get(SAVED_SCALES_KEY)
                return {"num_layers": section[key], "saved_scales": saved, "source": str(config_path)}
    return None


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_block_count(path: str | os.PathLike) -> int | None:
    """``<architecture>.block_count`` from a GGUF file's header, read up to that key only.

    (``gguf.GGUFReader`` would parse the whole tokenizer too: seconds instead of milliseconds.)
    """
    import struct

    with open(path, "rb") as handle:

        def read(fmt):
            size = struct.calcsize(fmt)
            data = handle.read(size)
            if len(data) != size:
                raise EOFError(path)
            return struct.unpack(fmt, data)[0]

        def read_string():
            return handle.read(read("<Q")).decode("utf-8", errors="replace")

        def skip(value_type):
            if value_type == 8:
                handle.seek(read("<Q"), os.SEEK_CUR)
            elif value_type == 9:
                item_type, count = read("<I"), read("<Q")
                if item_type in _GGUF_SCALARS:
                    handle.seek(struct.calcsize(_GGUF_SCALARS[item_type]) * count, os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip(item_type)
            else:
                handle.seek(struct.calcsize(_GGUF_SCALARS[value_type]), os.SEEK_CUR)

        if handle.read(4) != b"GGUF" or read("<I") not in (2, 3):
            return None
        read("<Q")  # tensor count
        architecture = None
        for _ in range(read("<Q")):
            key, value_type = read_string(), read("<I")
            if key == "general.architecture" and value_type == 8:
                architecture = read_string()
            elif architecture and key == f"{architecture}.block_count" and value_type in _GGUF_SCALARS:
                return int(read(_GGUF_SCALARS[value_type]))
            else:
                skip(value_type)
    return None
