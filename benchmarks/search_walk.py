"""The walk of one ``lpes-search`` run through the package: how far a reader has to follow it.

    python benchmarks/search_walk.py                     # the tree this checkout imports
    python benchmarks/search_walk.py --show              # and every step of the walk
    git worktree add /tmp/old 3de516a && PYTHONPATH=/tmp/old python benchmarks/search_walk.py
                                                         # an older tree (remove the worktree after)

Issue #99's measure. A tiny run of every stage (sweep, genetic search, uniform factors, validation,
held-out table) on a random 4-layer Llama and a character tokenizer built here (no download, a few
seconds of model time) is run in this process through the ``lpes-search`` entry point of the tree
that ``lpes_harness`` is imported from (its ``pyproject.toml``), under ``sys.settrace``.

**The walk** is the calls from a function of the package into another package file, each (calling
function, file called) pair once, at its first call: what a reader who follows the run's arguments from
``main`` opens, and in which order (a function that calls five methods of one class opens its file once;
a property read is a call). A call through code outside the package (lm-eval
calling our model, torch calling our hooks) counts as a call from the package function nearest on the
stack. Imports are not the walk: a module's body, and what it calls while it is imported, are left out.

It prints three numbers:

- **files entered**: the package files the walk enters (the entry point's file included);
- **climbs**: steps from a file of a lower layer into one of a higher layer (a callback, a function
  passed down and called there, a lower module that imports upward);
- **returns**: steps into a file the walk had entered before (from another file): the reader goes
  back to a file already left, instead of finding a stage's inputs and outputs in one place.
  Returning to a caller when a call ends is not a step: the stack does that for the reader. Of these,
  **back up the stack**: steps into a file that is still on the stack below the caller (A calls B, which
  calls back into A: the file is left and re-entered before its own call is done).

The layer of a file is its folder (``lpes_harness/<layer>/``; lowest first core, methods, tasks,
lmeval, evaluation, search, commands). A tree from before the folders were the layers (3de516a) keeps
its map of modules to layers in its own ``tests/test_architecture.py`` (``LAYER_OF``, where lm-eval and
tasks are one layer), and that map is read instead.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import tempfile
import threading
import tomllib
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

FOLDER_LAYERS = ("core", "methods", "tasks", "lmeval", "evaluation", "search", "commands")

# Every stage a search runs, each as small as it goes: a sweep of two factors, one generation of four,
# uniform factors on the search's budget, a validation of the top individuals, a held-out table.
RUN_FLAGS = [
    "--device", "cpu", "--threads", "1", "--dtype", "float32", "--fitness", "logprob",
    "--task", "kv_retrieval", "--metadata", '{"num_pairs": 3}', "--num-samples", "4", "--chunk-size", "2",
    "--sweep", "1,0.5", "--population", "4", "--parents", "2", "--mutants", "1", "--crossovers", "1",
    "--generations", "1", "--uniform-tuning", "--validation-samples", "2", "--select-top", "2",
    "--heldout-samples", "2", "--no-progress",
]  # fmt: skip


# ----------------------------------------------------------------------------- the tiny model


def save_tiny_llama(folder: Path) -> str:
    """A random 4-layer Llama and a character-level tokenizer (as tests/tiny_models.py builds them)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + [chr(c) for c in range(32, 32 + 96 - len(specials))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(folder)
    return str(folder)


# ----------------------------------------------------------------------------- the tree traced


def package_dir() -> Path:
    import lpes_harness

    return Path(lpes_harness.__file__).resolve().parent


def entry_point(package: Path):
    """``lpes-search``'s function, as the tree's own pyproject.toml names it."""
    scripts = tomllib.loads((package.parent / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["lpes-search"].partition(":")
    return getattr(importlib.import_module(module), name)


def start_up() -> None:
    """What the tree's .pth hook does at start-up (lm-eval sees our tasks): an older tree's hook has
    another module name than the one the installed .pth imports."""
    for name in ("lpes_harness.lmeval.startup", "lpes_harness._startup"):
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
            return


def layer_rule(package: Path):
    """(layer of a file, rank of a layer): the folder, or an older tree's ``LAYER_OF`` map."""
    spec = importlib.util.spec_from_file_location("_walked_architecture", package.parent / "tests" / "test_architecture.py")
    architecture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(architecture)
    layer_of = getattr(architecture, "LAYER_OF", None)
    if layer_of is None:
        def of_file(path: Path) -> str:
            parts = path.relative_to(package).parts
            return parts[0] if len(parts) > 1 else "core"  # the package's own __init__ stands on nothing

        return of_file, {layer: i for i, layer in enumerate(FOLDER_LAYERS)}

    def of_map(path: Path) -> str:
        parts = path.relative_to(package).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        return layer_of[".".join(parts)]

    return of_map, {layer: i for i, layer in enumerate(architecture.LAYERS)}


# ----------------------------------------------------------------------------- the walk


class Walk:
    """The first call from each package function into each other package file."""

    def __init__(self, package: Path):
        self.root = str(package) + os.sep
        self.steps: list[tuple[str, str, str, str]] = []  # caller file, caller function, callee file, callee function
        self.up_the_stack: set[int] = set()  # the steps whose callee's file is on the stack below the caller
        self.entry: str | None = None
        self._seen: set = set()

    def _ours(self, frame) -> bool:
        return frame.f_code.co_filename.startswith(self.root)

    def trace(self, frame, event, arg):
        if event != "call" or not self._ours(frame) or frame.f_code.co_name == "<module>":
            return None
        caller = frame.f_back
        while caller is not None and not self._ours(caller):
            caller = caller.f_back
        if caller is None:
            if self.entry is None:
                self.entry = frame.f_code.co_filename
            return None
        if caller.f_code.co_name == "<module>" or _imported_between(frame, caller):
            return None  # done while a module is imported: not the run's walk
        callee, by = frame.f_code, caller.f_code
        if callee.co_filename == by.co_filename or (by, callee.co_filename) in self._seen:
            return None
        self._seen.add((by, callee.co_filename))
        if callee.co_filename in _files_below(caller):
            self.up_the_stack.add(len(self.steps))
        self.steps.append((by.co_filename, by.co_qualname, callee.co_filename, callee.co_qualname))
        return None


def _files_below(frame) -> set[str]:
    files = set()
    frame = frame.f_back
    while frame is not None:
        files.add(frame.f_code.co_filename)
        frame = frame.f_back
    return files


def _imported_between(frame, caller) -> bool:
    """Whether ``frame`` runs under an import started by ``caller`` (a module body, or importlib,
    on the stack between them)."""
    frame = frame.f_back
    while frame is not None and frame is not caller:
        if frame.f_code.co_name == "<module>" or frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def measure(walk: Walk, package: Path, layer, rank) -> dict:
    entered, climbs, returns, back_up = [walk.entry] if walk.entry else [], [], [], []
    for index, (caller, by, callee, name) in enumerate(walk.steps):
        step = f"{_short(caller, package)}:{by} -> {_short(callee, package)}:{name}"
        if index in walk.up_the_stack:
            back_up.append(step)
        if callee in entered:
            returns.append(step)
        else:
            entered.append(callee)
        low, high = layer(Path(caller)), layer(Path(callee))
        if rank[high] > rank[low]:
            climbs.append(f"{step}  ({low} -> {high})")
    return {"files": [_short(f, package) for f in entered], "climbs": climbs, "returns": returns, "back_up": back_up}


def _short(path: str, package: Path) -> str:
    return str(Path(path).relative_to(package.parent))


# ----------------------------------------------------------------------------- main


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", action="store_true", help="print every step of the walk, the climbs and the returns")
    options = parser.parse_args(argv)
    package = package_dir()
    layer, rank = layer_rule(package)
    start_up()
    search = entry_point(package)
    with tempfile.TemporaryDirectory(prefix="search-walk-") as tmp:
        checkpoint = save_tiny_llama(Path(tmp) / "model")
        walk = Walk(package)
        threading.settrace(walk.trace)
        sys.settrace(walk.trace)
        try:
            search(["--pretrained", checkpoint, *RUN_FLAGS, "--output", str(Path(tmp) / "run")])
        finally:
            sys.settrace(None)
            threading.settrace(None)
        made = sorted(p.name for p in (Path(tmp) / "run").iterdir())
    found = measure(walk, package, layer, rank)
    if options.show:
        print("\nthe walk:")
        print("\n".join(f"  {_short(a, package)}:{b} -> {_short(c, package)}:{d}" for a, b, c, d in walk.steps))
        print("\nclimbs:\n" + "\n".join(f"  {c}" for c in found["climbs"]))
        print("\nreturns:\n" + "\n".join(f"  {r}" for r in found["returns"]))
        print("\nback up the stack:\n" + "\n".join(f"  {r}" for r in found["back_up"]))
        print("\nfiles entered:\n" + "\n".join(f"  {f}" for f in found["files"]))
    print(f"\nthe walk of lpes-search in {package}: the run wrote {', '.join(made)}")
    print(f"steps {len(walk.steps)}; files entered {len(found['files'])}; climbs from a lower layer to a higher one "
          f"{len(found['climbs'])}; returns to a file already left {len(found['returns'])} "
          f"({len(found['back_up'])} of them back up the stack)")


if __name__ == "__main__":
    main()
