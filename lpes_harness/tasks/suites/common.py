"""Shared plumbing of the suites: data folders, options, the tokenizer, document truncation.

Where the data is, first match wins:

1. task metadata ``data_path`` (``--metadata '{"data_path": "/data"}'``): either a folder laid
   out like the shared data folder (holding ``mmlu/``, ``ceval/``, ``leval/``, ``zeroscrolls/``)
   or the suite's own folder (e.g. ``/data/mmlu``);
2. the environment variable ``LPES_DATA``, the root of such a folder;
3. ``../shared/data`` next to the repository checkout.

Long documents are cut to a token budget (the paper's 3,584 context tokens by default), so a
tokenizer is needed. It is the ``tokenizer`` metadata key if given, else the model's
``pretrained`` (+ ``gguf_file``), which lm-eval 0.4.13 merges from ``--model_args`` into every
task's metadata, else the bundled SmolLM2.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lpes_harness.core.gguf_cache import loadable
from lpes_harness.tasks.data import DATA_ENV_VAR, TaskDataError

# lpes_harness/tasks/suites/common.py -> repository root is three folders up.
_CHECKOUT_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_DATA_ROOT = _CHECKOUT_ROOT.parent / "shared" / "data"

# The paper's long-context setting: 4k window = 3,584 prompt tokens + up to 512 generated.
DEFAULT_MAX_CONTEXT_TOKENS = 3584
DEFAULT_MAX_GEN_TOKS = 512


def suite_dir(suite: str, marker: str, data_path: str | os.PathLike | None = None) -> Path:
    """The folder of ``suite`` (one holding ``marker``), found as the module docstring says."""
    candidates: list[tuple[str, Path]] = []
    if data_path is not None and str(data_path) != "":
        given = Path(str(data_path)).expanduser()
        candidates += [("data_path", given / suite), ("data_path", given)]
    elif os.environ.get(DATA_ENV_VAR):
        candidates.append((DATA_ENV_VAR, Path(os.environ[DATA_ENV_VAR]).expanduser() / suite))
    else:
        candidates.append(("default", DEFAULT_DATA_ROOT / suite))
    for _, folder in candidates:
        if (folder / marker).exists():
            return folder
    tried = ", ".join(f"{source}: {folder / marker}" for source, folder in candidates)
    raise TaskDataError(
        f"could not find the {suite} data (looked for {tried}). Point at a folder laid out like the "
        f"shared data folder (holding {suite}/) with --metadata '{{\"data_path\": \"/path/to/data\"}}' "
        f"or the environment variable {DATA_ENV_VAR}=/path/to/data."
    )


def as_int(task: str, key: str, value: Any, minimum: int = 0) -> int:
    """``value`` as an int (digit strings too), or an error naming the task and the key."""
    try:
        number = int(value)
        if isinstance(value, bool) or number != float(value):
            raise ValueError
    except (TypeError, ValueError):
        raise TaskDataError(f"{task}: {key}={value!r} is not an integer") from None
    if number < minimum:
        raise TaskDataError(f"{task}: {key}={value!r} must be at least {minimum}")
    return number


# ---------------------------------------------------------------- tokenizer


def tokenizer_from_metadata(metadata: Mapping[str, Any]):
    """The tokenizer that measures context length; see the module docstring for the order."""
    given = metadata.get("tokenizer")
    if given is not None and not isinstance(given, (str, os.PathLike)):
        return given  # an already-built tokenizer (in-process use, tests)
    if given:
        gguf_file = metadata.get("gguf_file")
        # HFLM's gguf_file belongs to `pretrained`; use it only if it sits in the tokenizer's folder.
        if not gguf_file or not (Path(str(given)) / str(gguf_file)).is_file():
            gguf_file = None
        return _load_tokenizer(*loadable(str(given), gguf_file, convert=False))
    from lpes_harness.core.models import resolve_pretrained

    pretrained = metadata.get("pretrained")
    if pretrained is not None and not isinstance(pretrained, (str, os.PathLike)):
        pretrained = getattr(getattr(pretrained, "config", None), "_name_or_path", None)
    name, gguf_file = resolve_pretrained(None if pretrained is None else str(pretrained), metadata.get("gguf_file"))
    # The model's converted folder when it has one (a fraction of a second against ~8 s of GGUF parsing).
    return _load_tokenizer(*loadable(name, gguf_file, convert=False))


@functools.lru_cache(maxsize=4)
def _load_tokenizer(name: str, gguf_file: str | None):
    # Every task of a group asks for the same tokenizer: load it once (the GGUF one takes ~8 s).
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        return AutoTokenizer.from_pretrained(name, **kwargs)
    except Exception as err:  # noqa: BLE001 - re-raised with what the user typed
        raise TaskDataError(
            f"could not load the tokenizer {name!r}{' (gguf_file=' + gguf_file + ')' if gguf_file else ''} "
            f"used to truncate long documents: {err}. Name one with --metadata '{{\"tokenizer\": \"<path or id>\"}}'."
        ) from err


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fit_document(
    tokenizer,
    render: Callable[[str], str],
    document: str,
    max_tokens: int,
    separator: str = "",
    starts: list[int] | None = None,
) -> tuple[str, bool]:
    """``render(document)`` cut so the prompt has at most ``max_tokens`` tokens; (prompt, truncated?).

    The document keeps its beginning (as L-Eval and ZeroSCROLLS do); the text around it
    (instruction, question, "Answer:") is always kept whole, with ``separator`` marking the cut.
    ``starts`` (from :func:`token_starts`) saves re-tokenising a document asked about many times.
    """
    starts = token_starts(tokenizer, document) if starts is None else starts
    if len(starts) + count_tokens(tokenizer, render("")) <= max_tokens:
        prompt = render(document)
        excess = count_tokens(tokenizer, prompt) - max_tokens
        if excess <= 0:
            return prompt, False
        keep = len(starts) - excess
    else:
        overhead = count_tokens(tokenizer, render(separator))
        if overhead >= max_tokens:
            raise TaskDataError(
                f"the prompt without its document already has {overhead} tokens, more than "
                f"max_context_tokens={max_tokens}; raise max_context_tokens"
            )
        keep = max_tokens - overhead
    while keep > 0:
        cut = starts[keep] if keep < len(starts) else len(document)
        prompt = render(document[:cut] + separator)
        excess = count_tokens(tokenizer, prompt) - max_tokens
        if excess <= 0:
            return prompt, True
        keep -= excess  # tokens can merge differently at the cut: shave and re-check
    return render(separator), True


def token_starts(tokenizer, text: str) -> list[int]:
    """Character offset at which each token of ``text`` starts."""
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [start for start, _ in encoded["offset_mapping"]]
    except (NotImplementedError, TypeError, ValueError):
        # Slow tokenizers have no offsets: rebuild them from decoded prefixes.
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return [len(tokenizer.decode(ids[:i])) for i in range(len(ids))]
