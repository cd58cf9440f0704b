"""A GGUF file converted once into a plain Hugging Face folder, so that later loads skip the conversion.

transformers loads a ``.gguf`` by parsing its metadata and dequantizing every tensor, on every load,
and parses the file again for the tokenizer and again for the config. That takes 21-26 s for the
bundled SmolLM2 and 67-80 s for Gemma-3-270M (its 262k-token vocabulary), against 0.4 s and 3.4 s
for the same weights as safetensors (``benchmarks/model_load.py``, a 2-core AVX2-only CPU). The first load of a GGUF saves what it converted (the weights in
float32, which holds the dequantized values exactly; the tokenizer; the config; the generation
config) to a folder of the cache, and every later load of the same file reads that folder. The
logits are the same bit for bit (``tests/test_gguf_cache.py``).

- Where: ``$LPES_CACHE_DIR``, else ``$XDG_CACHE_HOME/lpes_harness``, else ``~/.cache/lpes_harness``.
  There is one folder per GGUF file, named by the file's stem and a key made of its absolute
  path, size and modification time and of the transformers version whose converter wrote it.
  A changed file or a new transformers converts again.
- ``LPES_GGUF_CACHE=0`` turns the cache off: every load reads the GGUF as before.
- Nothing is half-written. A conversion writes into a temporary folder and renames it into place,
  so a killed run leaves no folder that a later load would trust. When the cache cannot be
  written (a full disk, a read-only home), the run says so once and loads the GGUF directly.

What a run records of its model (search fingerprints, ``lpes_source``) stays the GGUF's path: the
cache is how the file is read, not which model it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

CACHE_ENV = "LPES_CACHE_DIR"
SWITCH_ENV = "LPES_GGUF_CACHE"
MARKER = "lpes_gguf_source.json"  # written last, before the rename: a folder with it is complete


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lpes_harness"


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def source_record(gguf_path: Path) -> dict:
    """What identifies one conversion: the file (path, size, modification time) and the converter."""
    import transformers

    stat = gguf_path.stat()
    return {"gguf": str(gguf_path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "transformers": transformers.__version__}


def converted_folder(gguf_path: Path) -> Path:
    record = source_record(gguf_path)
    key = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{gguf_path.stem}-{key}"


def loadable(pretrained, gguf_file: str | None, convert: bool = True) -> tuple:
    """``(pretrained, gguf_file)`` to hand to ``from_pretrained``: the converted folder (and no GGUF
    file) when the cache has it, or after converting it now when ``convert``; else what was given.

    Only a local GGUF file is converted; anything else (a model object, an HF id, a folder of
    safetensors) passes through unchanged. ``convert=False`` serves readers of the tokenizer or
    config alone, for which a whole conversion would cost more than it saves."""
    if not gguf_file or not isinstance(pretrained, (str, os.PathLike)) or not enabled():
        return pretrained, gguf_file
    path = Path(pretrained) / gguf_file
    if not path.is_file():
        return pretrained, gguf_file  # transformers says what is missing, as without the cache
    target = converted_folder(path)
    if (target / MARKER).is_file() or (convert and _convert(path, target)):
        return str(target), None
    return pretrained, gguf_file


def _convert(gguf_path: Path, target: Path) -> bool:
    """Load the GGUF once and save it as a Hugging Face folder at ``target``; False if it cannot be saved."""
    temporary = target.parent / f".{target.name}.partial-{os.getpid()}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # before the slow load: a bad cache fails at once
        print(f"converting {gguf_path.name} once into {target} (later loads read that folder)", file=sys.stderr)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs = {"gguf_file": gguf_path.name}
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kwargs)
        # transformers marks a model loaded from GGUF as quantized "gguf" and refuses to save it, though
        # its weights are already plain dequantized tensors: drop the mark, so the folder loads as plain.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
        (temporary / MARKER).write_text(json.dumps(source_record(gguf_path), indent=1) + "\n")
        try:
            temporary.rename(target)
        except OSError:
            if not (target / MARKER).is_file():  # not another process's finished copy: a real failure
                raise
        return True
    except OSError as err:
        warnings.warn(f"could not save the converted {gguf_path.name} under {target.parent} ({err}); loading the "
                      f"GGUF directly (set {CACHE_ENV} to a writable folder, or {SWITCH_ENV}=0 to silence this)",
                      stacklevel=3)
        return False
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
