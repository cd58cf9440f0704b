"""The JSON scales file: what a search writes and what ``lpes_hf scales=<path>`` reads.

Format (``"format": "lpes-scales/1"``)::

    {
      "format": "lpes-scales/1",
      "scales": [1.5, 1.48, ...],          # one float per decoder layer (required)
      "num_layers": 30,                    # must equal len(scales) when present
      "scaling": "base",                   # optional: what they multiply, "position" (default), "base" or "both"
      "base_scales": [2.0, 2.0, ...],      # "both" only (and required there): the base factors, one per layer
      "curve": "bezier",                   # optional: how the scales were made
      "control_points": [[0, 1.5], ...],   # optional
      "model": "SmolLM2-135M-Instruct",    # optional, informational
      "fitness": 0.41                      # optional, informational
    }

A bare JSON list of numbers is accepted too; every scale must be a finite number > 0. Under
``"scaling": "both"`` the file holds each layer's pair: ``scales`` the position factors, ``base_scales``
the base factors; readers give them as one flat list of 2L numbers, positions first
(:mod:`lpes_harness.core.scaling`), and :func:`write_scales_file` takes that list.

What a user gives ``lpes_hf`` for its scales is checked in :mod:`lpes_harness.core.scales_args`, with
the layer count that :func:`model_layer_info` reads here from the model's ``config.json`` or
GGUF header (no torch: the start-up hook runs it before the model loads).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from lpes_harness.core.files import atomic_write_text
from lpes_harness.core.scaling import AXES, DEFAULT, SCALINGS, scaling_of, with_axes

FORMAT = "lpes-scales/1"
# rope.CONFIG_KEY / CONFIG_SCALING_KEY: where rope.install keeps the scales and their scaling in a
# model's config (rope imports torch).
SAVED_SCALES_KEY = "lpes_scales"
SAVED_SCALING_KEY = "lpes_scaling"


class ScalesError(ValueError):
    """Bad scales input; the one-line message names the argument, its value and what is accepted."""


class ScalesFileError(ScalesError):
    pass


def read_scales_file(path: str | os.PathLike) -> list[float]:
    """The scales of a file (2L numbers for a ``both`` file: :func:`read_scales_and_scaling`)."""
    return read_scales_and_scaling(path)[0]


def read_scales_and_scaling(path: str | os.PathLike) -> tuple[list[float], str | None]:
    """A scales file's factors, each a finite number > 0, and its ``scaling`` (None when it names none:
    a bare list, or a file from before base scaling, i.e. positions). A ``both`` file's factors come
    as one list, its ``scales`` then its ``base_scales``. Errors start with the path (``path:line:`` for JSON)."""
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
    scaling, base_scales = None, None
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
        scaling = data.get("scaling")
        if scaling is not None and scaling not in SCALINGS:
            raise ScalesFileError(f"{path}: 'scaling' is {scaling!r}; accepted: {', '.join(SCALINGS)}")
        base_scales = _base_scales(path, data, scaling_of(scaling), len(scales))
    elif isinstance(data, list):
        scales = data
    else:
        raise ScalesFileError(
            f"{path}: holds {_kind(data)}; a scales file is a JSON list of numbers or an object with a 'scales' list "
            f"(format {FORMAT})"
        )
    if not scales:
        raise ScalesFileError(f"{path}: 'scales' is empty; give one number > 0 per decoder layer")
    for name, values in (("scale", scales), ("base scale", base_scales or [])):
        for index, value in enumerate(values):
            if not _is_number(value) or value <= 0:
                raise ScalesFileError(f"{path}: {name} {index} is {value!r}; every scale must be a finite number > 0")
    if base_scales is not None:
        return scaling_of(scaling).join(scales, base_scales), scaling
    return [float(s) for s in scales], scaling


def _base_scales(path: Path, data: dict, scaling, num_layers: int) -> list | None:
    """A paired (``both``) file's ``base_scales``, checked against its ``scales``; None in any other file."""
    if not scaling.paired:
        if "base_scales" in data:
            raise ScalesFileError(f"{path}: has 'base_scales' but its 'scaling' is {scaling.name!r}; base factors "
                                  f"beside position factors belong to a file of scaling {with_axes(*AXES).name!r}")
        return None
    base_scales = data.get("base_scales")
    if not isinstance(base_scales, list):
        what = "no 'base_scales' key" if base_scales is None else f"'base_scales' {_kind(base_scales)}"
        raise ScalesFileError(f"{path}: 'scaling' is {scaling.name!r} but the file has {what}; a {scaling.name!r} "
                              "file holds 'scales' (the position factors) and 'base_scales' (the base factors), one "
                              "per layer")
    if len(base_scales) != num_layers:
        raise ScalesFileError(f"{path}: 'scales' has {num_layers} position factors but 'base_scales' "
                              f"{len(base_scales)} base factors; give one of each per decoder layer")
    return base_scales


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
    """Write atomically: readers never see a half-written file.

    With ``scaling="both"``, ``scales`` is the flat list of 2L factors (positions first): the file
    holds the position factors as ``scales`` and the base factors as ``base_scales``."""
    # A name not in the table is written as given: reading the file refuses it.
    kind = SCALINGS.get(extra.get("scaling") or DEFAULT)
    if kind is not None and kind.paired:
        positions, bases = kind.halves(scales)
        document = {"format": FORMAT, "scales": positions, "base_scales": bases, "num_layers": len(positions), **extra}
    else:
        document = {"format": FORMAT, "scales": [float(s) for s in scales], "num_layers": len(scales), **extra}
    atomic_write_text(path, json.dumps(document, indent=2) + "\n")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ------------------------------------------------------- the layer count, without the weights


def model_layer_info(pretrained: Any = None, gguf_file: str | None = None, revision: str | None = None) -> dict | None:
    """``{"num_layers", "saved_scales", "saved_scaling", "source"}`` from a model's config.json or GGUF header, or None.

    Reads a few KB: a local directory's ``config.json``, a ``.gguf`` file's metadata (the bundled
    model's too), or a hub model's ``config.json`` already in the local cache. None when it
    cannot be known that way; the model load then checks.
    """
    try:
        return _model_layer_info(pretrained, gguf_file, revision)
    except Exception:  # never fail here: the load reports a missing or unreadable model itself
        return None


def _model_layer_info(pretrained, gguf_file, revision) -> dict | None:
    from lpes_harness.core.models import resolve_pretrained

    if pretrained is not None and not isinstance(pretrained, str):
        return None  # a model object
    directory, gguf_name = resolve_pretrained(pretrained, gguf_file)
    if gguf_name:
        path = Path(directory) / gguf_name
        layers = gguf_block_count(path) if path.is_file() else None
        return None if layers is None else {"num_layers": layers, "saved_scales": None, "saved_scaling": None,
                                            "source": str(path)}
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
                return {"num_layers": section[key], "saved_scales": saved,
                        "saved_scaling": config.get(SAVED_SCALING_KEY) if saved else None, "source": str(config_path)}
    return None


def gguf_block_count(path: str | os.PathLike) -> int | None:
    """``<architecture>.block_count`` from a GGUF file's header, read up to that key only
    (:mod:`lpes_harness.core.gguf_header`: milliseconds, where ``gguf.GGUFReader`` takes seconds)."""
    from lpes_harness.core.gguf_header import SCALARS, STRING, VERSIONS, GGUFHeader

    with open(path, "rb") as handle:
        header = GGUFHeader(handle, errors="replace")
        if handle.read(4) != b"GGUF" or header.read("<I") not in VERSIONS:
            return None
        header.read("<Q")  # tensor count
        architecture = None
        for _ in range(header.read("<Q")):
            key, value_type = header.read_string(), header.read("<I")
            if key == "general.architecture" and value_type == STRING:
                architecture = header.read_string()
            elif architecture and key == f"{architecture}.block_count" and value_type in SCALARS:
                return int(header.read(SCALARS[value_type]))
            else:
                header.skip_value(value_type)
    return None
