"""One set of flags (issue #99): ``--pretrained``, ``--gguf-file``, ``--dtype``, ``--device``, ``--threads``,
``--seed``, ``--task`` and ``--metadata`` are defined in ``lpes_harness/commands/flags.py`` alone, and every
command that takes one takes it from there: the same type (so the same checks) and the same help.

Two checks: the source (ast) of the package defines none of these flags outside the flags module, and
each command's parser, caught as its ``main`` parses (nothing else runs), holds the shared definition.
"""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

import pytest

from lpes_harness.commands import flags

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "lpes_harness"
FLAGS_MODULE = PACKAGE_DIR / "commands" / "flags.py"
SHARED = ("--pretrained", "--gguf-file", "--dtype", "--device", "--threads", "--seed", "--task", "--metadata")
# The type each shared flag has wherever it is (None: no type, the text as typed).
TYPES = {"--pretrained": flags.pretrained, "--gguf-file": None, "--dtype": flags.dtype, "--device": flags.device,
         "--threads": flags.positive_int, "--seed": int, "--task": None, "--metadata": flags.metadata}
# lpes-eval is lm-eval's own command line (its flags are lm-eval's); write_tasks takes no flag.
COMMANDS = ("attention", "check", "compare", "layer_types", "leaderboard", "paired", "pooled", "poshidden_channel", "report",
            "rsm", "search", "suites_yaml", "train_moice", "transfer", "tune")


def flag_definitions(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """``(line, flag)`` of every ``add_argument`` / ``add`` call whose option strings name a shared flag."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name not in ("add_argument", "add"):
                continue
            for argument in node.args:
                if isinstance(argument, ast.Constant) and argument.value in SHARED:
                    found.append((node.lineno, argument.value))
    return found


def test_the_shared_flags_are_defined_in_the_flags_module_alone():
    elsewhere = [f"{path.relative_to(PACKAGE_DIR)}:{line}: {flag}"
                 for path in sorted(PACKAGE_DIR.rglob("*.py")) if path != FLAGS_MODULE
                 for line, flag in flag_definitions(path.read_text(encoding="utf-8"), str(path))]
    assert elsewhere == [], "define these through lpes_harness.commands.flags:\n" + "\n".join(elsewhere)
    assert sorted({flag for _, flag in flag_definitions(FLAGS_MODULE.read_text(encoding="utf-8"))}) == sorted(SHARED)


def test_the_source_check_finds_a_flag_defined_by_hand():
    """What the check above would say of a command that wrote its own --pretrained (so it can fail)."""
    source = ('import argparse\np = argparse.ArgumentParser()\np.add_argument("--pretrained", default=None)\n'
              'group = p.add_argument_group("x")\ngroup.add_argument("-s", "--seed", type=int)\n'
              'add = p.add_argument\nadd("--metadata")\np.add_argument("--scales")\n')
    assert flag_definitions(source) == [(3, "--pretrained"), (5, "--seed"), (7, "--metadata")]


class Parsed(Exception):
    """Raised in place of parsing: the command's parser, and nothing after the parse runs."""


def command_parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    def caught(self, *args, **kwargs):
        raise Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    module = importlib.import_module(f"lpes_harness.commands.{name}")
    with pytest.raises(Parsed) as parsed:
        module.main([])
    return parsed.value.args[0]


def test_every_command_is_listed():
    """A command added to commands/ must be added to :data:`COMMANDS` (or said to take no flag)."""
    modules = {path.stem for path in (PACKAGE_DIR / "commands").glob("*.py")}
    # Not commands: the shared flags, and lpes-search's parser and its gradient flags (checked through "search").
    assert modules - {"__init__", "flags", "search_cli", "search_method_flags", "eval", "write_tasks"} == set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_a_commands_shared_flags_are_the_shared_definitions(name, monkeypatch):
    parser = command_parser(name, monkeypatch)
    assert isinstance(parser, flags.CommandParser), name  # its errors: one line
    for flag in SHARED:
        action = parser._option_string_actions.get(flag)
        if action is None:
            continue
        assert action.type is TYPES[flag], (name, flag, action.type)
        twin = argparse.ArgumentParser()
        {"--pretrained": flags.add_pretrained, "--gguf-file": lambda p: flags.add_pretrained(p, gguf_file=True),
         "--dtype": lambda p: flags.add_dtype(p, action.default), "--device": flags.add_device,
         "--threads": flags.add_threads, "--seed": flags.add_seed,
         "--task": lambda p: flags.add_task(p, action.default), "--metadata": flags.add_metadata}[flag](twin)
        shared = twin._option_string_actions[flag]
        # the same help (--dtype and --task say their command's default at its end)
        assert action.help.split(" (default: ")[0].split("; default: ")[0] == \
            shared.help.split(" (default: ")[0].split("; default: ")[0], (name, flag)
        if flag not in ("--dtype", "--task"):
            assert action.default == shared.default, (name, flag)


def test_a_command_error_is_one_line(capsys):
    parser = flags.CommandParser(prog="lpes-x")
    flags.add_pretrained(parser)
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(["--pretrained", "/no/such/dir"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == ("lpes-x: error: argument --pretrained: '/no/such/dir' does not exist; give a "
                                       "packaged model (smollm2, gemma3-270m), a folder with config.json, a .gguf "
                                       "file or a Hugging Face id (org/name)\n")


def test_the_commands_that_load_a_model_take_pretrained(monkeypatch):
    takes = {name for name in COMMANDS if "--pretrained" in command_parser(name, monkeypatch)._option_string_actions}
    assert takes == {"attention", "check", "compare", "layer_types", "paired", "poshidden_channel", "rsm", "search",
                     "train_moice", "transfer", "tune"}
