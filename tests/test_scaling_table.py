"""The table of scalings (:data:`lpes_harness.core.scaling.SCALINGS`) is the one place that knows them.

Issue 99's bar: the scaling names ``"position"``, ``"base"`` and ``"both"`` are compared in at most
two files, the table and its parser; everything else reads the table's entries. The check reads the
code's AST, so a comparison written in any spelling (``==``, ``!=``, ``in (...)``, a dict literal
dispatched on the name, a ``match``) fails it, and a toy snippet shows that it does. A new scaling is
one entry: a toy one, registered in a test, reaches the parsers' choices, the scales files and
RoPE without an edit anywhere else.
"""

import ast
import json
from pathlib import Path

import pytest
import torch
from tiny_models import logits, random_ids, tiny_model

from lpes_harness.commands.search_cli import build_parser
from lpes_harness.core import rope
from lpes_harness.core.rope_anatomy import LPESError
from lpes_harness.core.scales_args import parse_scales_args
from lpes_harness.core.scales_file import read_scales_and_scaling, write_scales_file
from lpes_harness.core.scaling import AXES, SCALINGS, Scaling

PACKAGE = Path(__file__).resolve().parents[1] / "lpes_harness"
NAMES = frozenset(SCALINGS) | {"position", "base", "both"}
TABLE = {"lpes_harness/core/scaling.py"}  # the table; its parser may join it, nothing else
_COMPARING = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def _names_in(node) -> bool:
    """Whether ``node`` is a scaling name, or a tuple / list / set literal holding one."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_names_in(item) for item in node.elts)


def _keyed_by_names(node) -> bool:
    return isinstance(node, ast.Dict) and any(key is not None and _names_in(key) for key in node.keys)


def scaling_comparisons(source: str) -> list[int]:
    """The lines of ``source`` that compare something with a scaling name, or dispatch on one."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, _COMPARING) for op in node.ops):
            if any(_names_in(operand) for operand in (node.left, *node.comparators)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and _keyed_by_names(node.value):  # {"position": ..}[scaling]
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _keyed_by_names(node.func.value):
            lines.append(node.lineno)  # {"position": ..}.get(scaling)
        elif isinstance(node, ast.MatchValue) and _names_in(node.value):  # case "both":
            lines.append(node.lineno)
    return lines


def test_only_the_table_compares_scaling_names():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = scaling_comparisons(path.read_text(encoding="utf-8"))
        if lines:
            found[path.relative_to(PACKAGE.parent).as_posix()] = lines
    assert set(found) <= TABLE and len(TABLE) <= 2, (
        f"scaling names compared outside the table (lpes_harness/core/scaling.py): "
        f"{ {path: lines for path, lines in found.items() if path not in TABLE} }; read SCALINGS[name]'s attributes")
    assert found, "the table itself compares names: if it no longer does, the check may be reading nothing"


@pytest.mark.parametrize("snippet", [
    'if scaling == "both":\n    pass',
    'x = 2 if args.scaling != "position" else 1',
    'ok = scaling in ("position", "base")',
    'ok = "base" not in [scaling]',
    'label = {"position": "s", "base": "b"}[scaling]',
    'label = {"both": 2}.get(scaling, 1)',
    'match scaling:\n    case "both":\n        pass',
])
def test_the_check_catches_a_comparison(snippet):
    assert scaling_comparisons(snippet)


@pytest.mark.parametrize("snippet", [
    'row = {"position": worst, "accuracy": 0.5}',  # "position" as a JSON key: not a scaling
    'worst = row["position"]',
    'rope.install(model, scales, scaling="both")',
    'scaling = record.get("scaling", "position")',
    'if SCALINGS[scaling].paired:\n    pass',
])
def test_the_check_lets_other_uses_of_the_words_be(snippet):
    assert scaling_comparisons(snippet) == []


# ----------------------------------------------------------------------------- a new kind is one entry

# Scaling both with its halves the other way round: the L base factors first, then the L position factors.
SWAPPED = Scaling("swapped", ("base", "position"), "swapped (base factors first, then position factors)")
POSITIONS, BASES = [1.0, 1.7, 1.0, 0.8], [1.0, 1.0, 4.0, 2.0]


@pytest.fixture
def swapped(monkeypatch):
    monkeypatch.setitem(SCALINGS, SWAPPED.name, SWAPPED)
    return SWAPPED


def test_a_new_kind_is_a_choice_of_the_parsers(swapped):
    assert build_parser().parse_args(["--scaling", "swapped"]).scaling == "swapped"
    parsed = parse_scales_args(scales=";".join(str(v) for v in BASES + POSITIONS), scaling="swapped")
    assert parsed.scaling == "swapped" and parsed.layer_scales(4) == BASES + POSITIONS
    with pytest.raises(ValueError, match="scaling=swapped is ambiguous .a base or a position factor"):
        parse_scales_args(scales="1.5", scaling="swapped")


def test_a_new_kind_is_refused_when_not_in_the_table(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--scaling", "swapped"])
    assert "invalid choice: 'swapped'" in capsys.readouterr().err


def test_a_new_kind_travels_through_a_scales_file(swapped, tmp_path):
    path = tmp_path / "scales.json"
    write_scales_file(path, BASES + POSITIONS, scaling="swapped")
    document = json.loads(path.read_text())
    assert document["scales"] == BASES and document["base_scales"] == POSITIONS  # by half, as the format has it
    assert read_scales_and_scaling(path) == (BASES + POSITIONS, "swapped")


def test_a_new_kind_runs_through_rope_with_no_other_edit(swapped):
    model = tiny_model("llama")
    ids = random_ids(40)
    vanilla = logits(model, ids)
    rope.install(model, SCALINGS["both"].join(POSITIONS, BASES), scaling="both")
    both = logits(model, ids)
    rope.remove(model)
    rope.install(model, swapped.identity(4), scaling="swapped")
    assert torch.equal(logits(model, ids), vanilla)
    rope.set_scales(model, swapped.join(BASES, POSITIONS))
    assert torch.equal(logits(model, ids), both)  # the same pairs, stated the other way round
    assert rope.get_scaling(model) == "swapped"
    with pytest.raises(LPESError, match="scaling='swapped' takes 2 factors per layer, the 4 base factors then"):
        rope.set_scales(model, 1.5)


def test_the_entries_restate_one_another():
    both = SCALINGS["both"]
    assert both.axes == AXES and both.identity_factor == (1.0, 1.0) and SCALINGS["base"].identity_factor == 1.0
    assert SCALINGS["position"].restate([1.5, 2.0], both) == [1.5, 2.0, 1.0, 1.0]
    assert SCALINGS["base"].restate([1.5, 2.0], both) == [1.0, 1.0, 1.5, 2.0]
    assert both.canonical([1.5, 2.0, 1.0, 1.0]) == [1.5, 2.0] and both.canonical([1.0, 1.0, 2.0, 1.0]) == [1, 1, 2, 1]
    assert both.narrowed([1.0, 1.0, 2.0, 3.0]) == ("base", [2.0, 3.0])
    assert both.narrowed([2.0, 3.0, 1.0, 1.0]) == ("position", [2.0, 3.0])
    assert [SCALINGS[name].rope_pair(f) for name, f in (("position", 1.5), ("base", 2.0), ("both", (1.5, 2.0)))] \
        == [(1.5, 1.0), (1.0, 2.0), (1.5, 2.0)]
    with pytest.raises(ValueError, match="cannot state factors of scaling 'both'"):
        both.restate([1.0, 1.0], SCALINGS["position"])
