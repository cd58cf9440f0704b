"""The flags the commands share, each defined here once: ``--pretrained`` (with ``--gguf-file``),
``--dtype``, ``--device``, ``--threads``, ``--seed``, ``--task`` and ``--metadata``; and the type of
a flag that names a folder to write (:func:`output_folder`).

A command builds its parser as a :class:`CommandParser` and adds the ones it takes
(``flags.add_pretrained(parser)``, ...), so a flag has one name, type, default and help in every
command. Each type checks its value while argparse parses it: a bad one is one line
(``lpes-search: error: argument --pretrained: '/no/such/dir' does not exist; give ...``) and exit 2,
before the command imports torch, loads a model or writes anything.

Two flags take their default from the command, because what the command does needs it: ``--dtype``
(the search and the tuner choose by machine, ``auto``; a re-scoring takes the dtype its scales file
was searched in, so that its scores match the search's; the channel selection measures in float32)
and ``--task`` (the search's default is the paper's task; lpes-check requires one).
``tests/test_command_flags.py`` checks that no command defines these flags itself.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from lpes_harness.core.model_source import pretrained_problem
from lpes_harness.core.models import DTYPE_NAMES, DTYPES, positive_int

PRETRAINED_HELP = ("the model: a packaged one (smollm2, the default; gemma3-270m), a local folder with config.json, "
                   "a .gguf file, or a Hugging Face id (org/name)")
DTYPE_HELP = ("the model's dtype: auto (bfloat16 on CUDA or on a CPU where it is native and timed faster than "
              "float32, else float32), float32, bfloat16 or float16")
TASK_HELP = ("a registered position task (multi_needle, kv_retrieval, mdqa, needle, or 'module:ATTRIBUTE' of your "
             "own; see docs/position_tasks.md)")
METADATA_EXAMPLE = '{"num_pairs": 30}'

# torch's device names the commands run on; a bad one failed only after the model had loaded.
_DEVICE = re.compile(r"^(cpu|mps|cuda(:\d+)?)$")


class CommandParser(argparse.ArgumentParser):
    """Every command's parser: argparse's, with an error as the one line ``prog: error: message`` and exit 2.
    argparse put its usage block above it (30 lines for lpes-search), burying the line that says what was
    wrong; ``--help`` still prints the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def pretrained(text: str) -> str:
    """argparse ``type`` of ``--pretrained``: the text as typed, once :func:`pretrained_problem` finds it usable."""
    problem = pretrained_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def dtype(text: str) -> str:
    """argparse ``type`` of ``--dtype``: one of :data:`~lpes_harness.core.models.DTYPES`."""
    if text in DTYPES:
        return text
    accepted = f"give {', '.join(DTYPES[:-1])} or {DTYPES[-1]}"
    if text in DTYPE_NAMES:  # torch has it (half, float64, ...), the commands' dtype choice does not
        raise argparse.ArgumentTypeError(f"{text!r} is not a dtype the commands load in; {accepted}")
    raise argparse.ArgumentTypeError(f"{text!r} is not a floating-point torch dtype; {accepted}")


def device(text: str) -> str:
    if _DEVICE.match(text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a device; give cpu, cuda, cuda:N or mps")


def metadata(text: str) -> str:
    """argparse ``type`` of ``--metadata``: a JSON object, kept as its text (the command reads it)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON ({err.msg}); give the task's options as a "
                                         f"JSON object, e.g. '{METADATA_EXAMPLE}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object; give the task's options as one, "
                                         f"e.g. '{METADATA_EXAMPLE}'")
    return text


def output_folder(text: str) -> str:
    """argparse ``type`` of a folder a command writes into (made if missing): refused where a file stands
    in its way, which the command met only at its first write (after the model load)."""
    path = Path(text)
    for place in (path, *path.parents):
        if place.exists():
            if not place.is_dir():
                where = "" if place == path else f" ({str(place)!r} is a file)"
                raise argparse.ArgumentTypeError(f"{text!r} is{' a file' if not where else ' under a file'}{where}; "
                                                 "give a folder to write into (made if missing)")
            break
    return text


def add_pretrained(parser, *, gguf_file: bool = False) -> None:
    parser.add_argument("--pretrained", type=pretrained, default=None, help=PRETRAINED_HELP)
    if gguf_file:
        parser.add_argument("--gguf-file", default=None, help="the GGUF file's name inside a --pretrained folder")


def add_dtype(parser, default: str | None, shown_default: str | None = None) -> None:
    """``default``: ``auto``, ``float32``, or None where the command works its dtype out (``shown_default``
    says how, in ``--help``)."""
    parser.add_argument("--dtype", type=dtype, default=default, help=f"{DTYPE_HELP} (default: {shown_default or default})")


def add_device(parser) -> None:
    parser.add_argument("--device", type=device, default=None, help="cpu or cuda (default: cuda when present)")


def add_threads(parser) -> None:
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads (default: torch's choice; 1 helps on a CPU shared with other jobs)")


def add_seed(parser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="the seed of what the command draws at random (default 0)")


def add_task(parser, default: str | None = None, shown_default: str | None = None) -> None:
    """No ``default``: the task is required."""
    if default is None:
        parser.add_argument("--task", required=True, help=TASK_HELP)
    else:
        parser.add_argument("--task", default=default, help=f"{TASK_HELP}; default: {shown_default or default}")


def add_metadata(parser) -> None:
    parser.add_argument("--metadata", type=metadata, default="{}",
                        help=f"the task's options as a JSON object, as lm_eval's --metadata, e.g. "
                             f"'{METADATA_EXAMPLE}' (default: the task's own)")


def add_prompt_inputs(parser) -> None:
    """The analyses' model and prompts (:mod:`lpes_harness.evaluation.inputs` reads them)."""
    add_pretrained(parser, gguf_file=True)
    parser.add_argument("--texts", default=None, help="prompts: JSON lines (prompt/input/text key) or plain text, one per line")
    parser.add_argument("--num-inputs", type=int, default=8, help="how many prompts to use (default 8)")
    parser.add_argument("--num-pairs", type=int, default=30, help="key-value pairs per generated KV prompt (default 30)")
    parser.add_argument("--max-tokens", type=int, default=2048, help="cut each prompt to its last N tokens (default 2048)")
    parser.add_argument("--out", type=output_folder, default="analysis", help="output folder (default ./analysis)")
