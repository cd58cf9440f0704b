"""What a user typed as the model, checked before anything loads: :func:`pretrained_problem`.

Every command's ``--pretrained`` (:mod:`lpes_harness.commands.flags`) and lm-eval's
``--model_args pretrained=...`` of our models (:mod:`lpes_harness.lmeval.registration`) run this
check. What it accepts:

- nothing, or a packaged model's short name (:data:`~lpes_harness.core.models.PACKAGED_MODELS`);
- a local folder with a ``config.json`` that is JSON (a Hugging Face model folder), or with a
  ``.gguf`` file inside (named by ``gguf_file``, or any where the caller has no ``gguf_file``);
- a whole ``.gguf`` file: its header is walked and the file must hold every byte its tensors need;
- anything shaped like a Hugging Face id (``org/name`` or a bare ``name``) that is no local path:
  it cannot be checked without the network, so the load says what is wrong with it.

A path that exists but cannot be a model, or a path that does not exist, is refused with one line
naming what was typed and what is accepted. Without this, transformers took 6-14 s to load its
libraries and then raised a 40-50 line traceback (an ``OSError`` about Hub repo ids for a missing
folder, a ``ValueError`` for an empty one, ``struct.error`` for a cut-short GGUF). Cheap: no torch,
no transformers; a GGUF's header is read (SmolLM2's ~3 MB of vocabulary in a fraction of a second),
not its weights.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

from lpes_harness.core.gguf_header import SCALARS, VERSIONS, CutShort, GGUFHeader
from lpes_harness.core.models import PACKAGED_MODELS, packaged_model

ACCEPTED = (f"give a packaged model ({', '.join(PACKAGED_MODELS)}), a folder with config.json, a .gguf file "
            "or a Hugging Face id (org/name)")

# huggingface_hub's repo id: an optional namespace, a name of letters, digits, '-', '_', '.'.
_HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")


def pretrained_problem(pretrained: Any, gguf_file: str | None = None) -> str | None:
    """Why ``pretrained`` (and ``gguf_file``, the GGUF's name inside a folder) cannot be loaded, in one
    line that starts with what was typed and ends with what is accepted; None when it may be."""
    if pretrained is not None and not isinstance(pretrained, (str, os.PathLike)):
        return None  # a model object, in-process use
    if packaged_model(None if pretrained is None else str(pretrained)) is not None:
        return None
    typed = str(pretrained)
    path = Path(typed)
    if path.is_dir():
        return _folder_problem(typed, path, gguf_file)
    if path.exists():
        if path.suffix.lower() != ".gguf":
            return f"{typed!r} is a file but not a .gguf; {ACCEPTED}"
        problem = gguf_problem(path)
        return None if problem is None else f"{typed!r} {problem}; {ACCEPTED}"
    if path.suffix.lower() == ".gguf":
        return f"{typed!r}: GGUF file not found; {ACCEPTED}"
    if _looks_like_a_path(typed):
        return f"{typed!r} does not exist; {ACCEPTED}"
    if not _looks_like_a_hub_id(typed):
        return f"{typed!r} is no local file or folder, nor shaped like a Hugging Face id; {ACCEPTED}"
    return None


def _folder_problem(typed: str, path: Path, gguf_file: str | None) -> str | None:
    if gguf_file:
        inside = path / gguf_file
        if not inside.is_file():
            return f"{typed!r} holds no {gguf_file!r} (gguf_file); {ACCEPTED}"
        problem = gguf_problem(inside)
        return None if problem is None else f"{str(inside)!r} {problem}; {ACCEPTED}"
    config = path / "config.json"
    if config.is_file():
        try:
            json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            line = f" (line {err.lineno})" if isinstance(err, json.JSONDecodeError) else ""
            return f"{typed!r}: its config.json is not readable JSON{line}; {ACCEPTED}"
        return None
    if any(path.glob("*.gguf")):
        return None  # a folder of GGUF files: the command's --gguf-file names one
    return f"{typed!r} is a folder without config.json (not a Hugging Face model folder); {ACCEPTED}"


def _looks_like_a_path(text: str) -> bool:
    """Absolute, home- or dot-relative, or with more separators than ``org/name`` has."""
    return (os.path.isabs(text) or text.startswith(("~", "./", "../", ".\\")) or "\\" in text
            or text.count("/") > 1 or text in (".", ".."))


def _looks_like_a_hub_id(text: str) -> bool:
    return bool(_HUB_ID.match(text)) and "--" not in text and ".." not in text and len(text) <= 96


# ----------------------------------------------------------------------------- a GGUF file's layout

_DEFAULT_ALIGNMENT = 32


def gguf_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with a GGUF file, as the end of a sentence about it ("is not a GGUF file"), or
    None: its header parses, and the file holds every byte its tensors' offsets and sizes need."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb", buffering=1 << 20) as handle:
            if handle.read(4) != b"GGUF":
                return "is not a GGUF file (it does not start with the bytes 'GGUF')"
            needed = _data_end(GGUFHeader(handle))
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    except CutShort:
        return f"is cut short: its {size} bytes end inside the header (an interrupted download or copy?)"
    except (ValueError, UnicodeDecodeError, struct.error) as err:
        return f"has a header that does not parse ({err})"
    if needed > size:
        return (f"is cut short: it has {size} bytes, its tensors need {needed} "
                "(an interrupted download or copy?)")
    return None


def _data_end(header: GGUFHeader) -> int:
    """The byte where the last tensor's data ends, from the header (version 2 or 3)."""
    version = header.read("<I")
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version}; versions 2 and 3 are read")
    tensor_count, kv_count = header.read("<Q"), header.read("<Q")
    alignment = _DEFAULT_ALIGNMENT
    for _ in range(kv_count):
        key, value_type = header.read_string(), header.read("<I")
        if key == "general.alignment" and value_type in SCALARS:
            alignment = int(header.read(SCALARS[value_type])) or _DEFAULT_ALIGNMENT
        else:
            header.skip_value(value_type)
    tensors = []
    for _ in range(tensor_count):
        header.read_string()
        dims = [header.read("<Q") for _ in range(header.read("<I"))]
        tensors.append((dims, header.read("<I"), header.read("<Q")))
    start = -(-header.handle.tell() // alignment) * alignment
    return start + max((offset + _tensor_bytes(dims, kind) for dims, kind, offset in tensors), default=0)


def _tensor_bytes(dims: list[int], kind: int) -> int:
    """A tensor's bytes in the file (ggml's block sizes, from the ``gguf`` package); 1 for a type it
    does not know, so that its offset alone is checked."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        return 1
    elements = 1
    for dim in dims:
        elements *= dim
    return elements // block * block_bytes
