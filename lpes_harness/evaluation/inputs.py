"""What the analyses share: loading the model, building prompts, writing outputs atomically (their
flags: :func:`lpes_harness.commands.flags.add_prompt_inputs`).

Prompts default to generated KV-retrieval contexts (no data files needed); ``--texts FILE``
takes a JSON-lines file (a ``prompt``, ``input`` or ``text`` key per line) or a plain text
file (one prompt per line).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from lpes_harness.core.files import atomic_write_json

TEXT_KEYS = ("prompt", "input", "text")


def kv_prompts(count: int, num_pairs: int, seed: int = 0) -> list[str]:
    """Generated KV-retrieval prompts (LitM format), gold pair in a random place."""
    from lpes_harness.tasks.kv_retrieval import format_kv_records, PROMPT_TEMPLATE, generate_kv_record

    prompts = []
    for index in range(count):
        rng = random.Random(f"analysis/{seed}/{index}")
        record = generate_kv_record(rng, num_pairs, "hex8")
        prompts.append(
            PROMPT_TEMPLATE.format(formatted_kv_records=format_kv_records(record["ordered_kv_records"]), key=record["key"])
        )
    return prompts


def read_texts(path: str | os.PathLike, count: int) -> list[str]:
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = []
    for number, line in enumerate(lines, start=1):
        text: Any = line
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{number}: malformed JSON line") from None
            text = next((record[k] for k in TEXT_KEYS if k in record), None)
            if not isinstance(text, str):
                raise ValueError(f"{path}:{number}: needs one of the keys {list(TEXT_KEYS)} holding a string")
        texts.append(text)
        if len(texts) == count:
            break
    if not texts:
        raise ValueError(f"{path}: no prompts")
    return texts


def prompts_from_args(args) -> list[str]:
    if args.num_inputs < 1:
        raise ValueError(f"--num-inputs must be at least 1, got {args.num_inputs}")
    if args.texts:
        return read_texts(args.texts, args.num_inputs)
    return kv_prompts(args.num_inputs, args.num_pairs)


def encode(tokenizer, texts: list[str], max_tokens: int) -> list:
    """Token id tensors (1, n), each cut to its last ``max_tokens`` tokens (the question stays)."""
    import torch

    encoded = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][-max_tokens:]
        encoded.append(torch.tensor([ids], dtype=torch.long))
    return encoded


def load_model(args):
    from lpes_harness.core.models import load_causal_lm

    return load_causal_lm(args.pretrained, args.gguf_file, device="cpu" if not _cuda() else None)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def write_results(out: Path, name: str, results: Any, plot) -> tuple[Path, Path]:
    """An analysis's ``out/<name>.json`` and its figure ``out/<name>.png`` (drawn by ``plot(results, path)``)."""
    json_path, png_path = out / f"{name}.json", out / f"{name}.png"
    atomic_write_json(json_path, results, indent=2)
    plot(results, png_path)
    return json_path, png_path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
