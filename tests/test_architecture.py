"""The shape of the house, read from the source (ast): what issue #30 set as the bar.

- no import cycle between files, counting the imports inside functions (a function-local
  import hides a cycle from Python, not from a reader);
- ``analysis/``, ``lmeval/`` and ``tasks/`` never import ``search/``;
- no module-level ``__getattr__`` (a re-export shim keeps a moved name alive at two addresses);
- no private lm-eval name outside ``lpes_harness/lmeval/`` (the one place that knows its insides);
- no module over 450 lines.

``python tests/test_architecture.py [PACKAGE_DIR]`` prints the import cycles found.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "lpes_harness"
MAX_LINES = 450


def _module_name(path: Path, package_dir: Path) -> str:
    parts = (package_dir.name,) + path.relative_to(package_dir).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse_modules(package_dir: Path = PACKAGE_DIR) -> dict[str, tuple[Path, ast.Module]]:
    """Every module of the package: dotted name -> (file, syntax tree)."""
    return {
        _module_name(path, package_dir): (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for path in sorted(package_dir.rglob("*.py"))
    }


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imported_names(module: str, path: Path, tree: ast.Module) -> set[str]:
    """Dotted names a module imports, anywhere in it (``from a import b`` gives ``a`` and ``a.b``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if _is_package(path) else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(modules: dict[str, tuple[Path, ast.Module]]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (itself left out)."""
    return {
        name: {target for target in imported_names(name, path, tree) if target in modules and target != name}
        for name, (path, tree) in modules.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (Tarjan), each as a closed path."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_within(group, graph) for group in groups]


def _cycle_within(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest closed path through the group's first module (breadth-first)."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target == start:
                    return paths[node] + [start]
                if target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected group always has one


MODULES = parse_modules()


def test_no_import_cycle_between_files():
    cycles = import_cycles(import_graph(MODULES))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_analysis_lmeval_and_tasks_never_import_search():
    graph = import_graph(MODULES)
    lower = ("lpes_harness.analysis", "lpes_harness.lmeval", "lpes_harness.tasks")
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.startswith(lower)
        for target in targets
        if target == "lpes_harness.search" or target.startswith("lpes_harness.search.")
    )
    assert not offenders, offenders


def test_no_module_level_getattr():
    shims = sorted(
        str(path.relative_to(PACKAGE_DIR.parent))
        for path, tree in MODULES.values()
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
    )
    assert not shims, f"module-level __getattr__ (a re-export shim) in {shims}"


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def _private_lm_eval_uses(tree: ast.Module) -> list[str]:
    """``from lm_eval.x import _y``, ``import lm_eval._x``, ``lm_eval.x._y`` (also through a name
    bound by an import, ``from lm_eval.api import registry; registry._y``): what lm-eval keeps to itself."""
    bound = {}  # local name -> the lm-eval dotted name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "lm_eval":
                    bound[alias.asname or "lm_eval"] = alias.name if alias.asname else "lm_eval"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lm_eval":
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    uses = {dotted for dotted in bound.values() if _private(dotted)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                dotted = ".".join([bound[value.id]] + chain[::-1])
                if _private(dotted):
                    uses.add(dotted)
    # Report the shortest private prefix once (``a._b`` rather than ``a._b`` and ``a._b.c``).
    return sorted(use for use in uses if not any(use.startswith(other + ".") for other in uses))


def test_no_private_lm_eval_name_outside_lmeval():
    offenders = sorted(
        f"{path.relative_to(PACKAGE_DIR.parent)}: {use}"
        for name, (path, tree) in MODULES.items()
        if not name.startswith("lpes_harness.lmeval")
        for use in _private_lm_eval_uses(tree)
    )
    assert not offenders, offenders


def test_no_module_over_450_lines():
    long = sorted(
        f"{path.relative_to(PACKAGE_DIR.parent)}: {lines} lines"
        for path, _ in MODULES.values()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    )
    assert not long, long


def test_the_graph_sees_function_local_imports_and_cycles(tmp_path):
    """The checks above would pass vacuously if the parser missed imports: pin it on a toy package."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from toy.b import g\n    return g\n")
    (package / "b.py").write_text("from . import a\n\ndef g():\n    return a\n")
    (package / "c.py").write_text("import lm_eval\nfrom lm_eval.api import _private\nx = lm_eval.api._hidden\n")
    modules = parse_modules(package)
    assert import_cycles(import_graph(modules)) == [["toy.a", "toy.b", "toy.a"]]
    assert _private_lm_eval_uses(modules["toy.c"][1]) == ["lm_eval.api._hidden", "lm_eval.api._private"]


if __name__ == "__main__":
    found = import_cycles(import_graph(parse_modules(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_DIR)))
    print(f"{len(found)} import cycle(s) between files")
    for cycle in found:
        print("  " + " -> ".join(cycle))
