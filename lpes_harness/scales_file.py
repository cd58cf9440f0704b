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

A bare JSON list of numbers is accepted too.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from lpes_harness.files import atomic_write_text

FORMAT = "lpes-scales/1"


class ScalesFileError(ValueError):
    pass


def read_scales_file(path: str | os.PathLike) -> list[float]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ScalesFileError(f"scales file not found: {path}") from err
    except json.JSONDecodeError as err:
        raise ScalesFileError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err
    if isinstance(data, dict):
        if "scales" not in data:
            raise ScalesFileError(f"{path}: a scales file needs a 'scales' list (format {FORMAT})")
        scales = data["scales"]
        if "num_layers" in data and data["num_layers"] != len(scales):
            raise ScalesFileError(
                f"{path}: 'num_layers' is {data['num_layers']} but 'scales' has {len(scales)} entries"
            )
    else:
        scales = data
    if not isinstance(scales, list) or not all(_is_number(s) for s in scales):
        raise ScalesFileError(f"{path}: 'scales' must be a list of numbers, got {scales!r:.80}")
    return [float(s) for s in scales]


def write_scales_file(path: str | os.PathLike, scales: list[float], **extra: Any) -> None:
    """Write atomically: readers never see a half-written file."""
    document = {"format": FORMAT, "scales": [float(s) for s in scales], "num_layers": len(scales), **extra}
    atomic_write_text(path, json.dumps(document, indent=2) + "\n")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
