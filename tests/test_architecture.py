"""The shape of the house, read from the source (ast): what issue #30 set as the bar.

- no import cycle between files, counting the imports inside functions (a function-local
  import hides a cycle from Python, not from a reader);
- the layers (:data:`LAYERS`, lowest first: core, methods, tasks, lmeval, evaluation, search,
  commands) are the top-level folders of the package: a module's folder is its layer (no map), and
  none imports from a layer above its own, function-local imports included (data flows down: a
  command asks evaluation or search, which ask the methods and lm-eval, which stand on the core);
- ``def main`` only under ``commands/``;
- no module-level ``__getattr__`` (a re-export shim keeps a moved name alive at two addresses);
- no private lm-eval name outside ``lpes_harness/lmeval/`` (the one place that knows its insides);
- no module over 450 lines (nor a script of benchmarks/ or searches/).

``python tests/test_architecture.py [PACKAGE_DIR]`` prints the import cycles found.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


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

# The layers, lowest first: a module may import from its own layer and the ones below. A module's
# layer is the top-level folder it sits in (the package's own ``__init__`` stands with the core):
# moving a file to another folder is moving it to another layer, and no list names modules.
# ``tasks`` sits below ``lmeval``: the task definitions know nothing of lm-eval's objects; the
# glue that turns them into lm-eval tasks is lm-eval's side.
LAYERS = ("core", "methods", "tasks", "lmeval", "evaluation", "search", "commands")


def layer_of(module: str, package: str = PACKAGE_DIR.name) -> str | None:
    """``lpes_harness.search.loop`` -> ``search``; the package itself -> ``core``; a module loose
    at the top (no folder) or in a folder that is no layer -> ``None``."""
    if module == package:
        return "core"
    parts = module[len(package) + 1:].split(".")
    is_folder = (PACKAGE_DIR.parent / package / parts[0]).is_dir() if package == PACKAGE_DIR.name else len(parts) > 1
    return parts[0] if parts[0] in LAYERS and (len(parts) > 1 or is_folder) else None


def upward_imports(graph: dict[str, set[str]], layer=layer_of) -> list[str]:
    """``module (its layer) imports target (a higher layer)``, for every such import."""
    rank = {name: index for index, name in enumerate(LAYERS)}
    return sorted(
        f"{module} ({layer(module)}) imports {target} ({layer(target)})"
        for module, targets in graph.items()
        for target in targets
        if layer(module) in rank and layer(target) in rank and rank[layer(target)] > rank[layer(module)]
    )


def main_definitions(modules: dict[str, tuple[Path, ast.Module]]) -> list[str]:
    """Modules that define a top-level ``main``: a command's entry point."""
    return sorted(
        name for name, (path, tree) in modules.items()
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)
    )


def test_no_import_cycle_between_files():
    cycles = import_cycles(import_graph(MODULES))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_every_module_is_in_a_layer_folder():
    """No module lies loose in ``lpes_harness/`` or in a folder that is not a layer."""
    loose = sorted(module for module in MODULES if layer_of(module) is None)
    assert not loose, f"modules outside the layer folders {LAYERS}: {loose}"
    folders = sorted(path.name for path in PACKAGE_DIR.iterdir() if path.is_dir() and path.name != "__pycache__")
    assert folders == sorted(LAYERS), folders


def test_no_module_imports_from_a_layer_above_its_own():
    offenders = upward_imports(import_graph(MODULES))
    assert not offenders, offenders


def test_main_only_under_commands():
    """Every ``main()`` (a parser and its printing) lives in ``commands/``: the library below never parses."""
    offenders = [name for name in main_definitions(MODULES) if layer_of(name) != "commands"]
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
    # The scripts of benchmarks/ and searches/ too: they import their shared pieces from beside them.
    scripts = [*PACKAGE_DIR.parent.joinpath("benchmarks").glob("*.py"), *PACKAGE_DIR.parent.joinpath("searches").glob("*.py")]
    long = sorted(
        f"{path.relative_to(PACKAGE_DIR.parent)}: {lines} lines"
        for path in [*(path for path, _ in MODULES.values()), *scripts]
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    )
    assert scripts and not long, long


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


def test_a_module_in_the_wrong_folder_fails(tmp_path):
    """The layer is read from the folder: a core module that imports a command is caught, and so is a
    module loose at the top or a main() outside commands/ (a toy package, so the check can fail)."""
    package = tmp_path / "toy"
    for folder in ("core", "search", "commands"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "core" / "rope.py").write_text("from toy.commands.cli import parse\n")
    (package / "commands" / "cli.py").write_text("from toy.core import rope\n\ndef main():\n    pass\n")
    (package / "search" / "run.py").write_text("from toy.core import rope\n\ndef main():\n    pass\n")
    (package / "loose.py").write_text("")
    modules = parse_modules(package)
    layer = lambda module: layer_of(module, "toy")  # noqa: E731
    assert upward_imports(import_graph(modules), layer) == ["toy.core.rope (core) imports toy.commands.cli (commands)"]
    assert layer("toy.loose") is None and layer("toy") == "core" and layer("toy.search.run") == "search"
    assert [name for name in main_definitions(modules) if layer(name) != "commands"] == ["toy.search.run"]


if __name__ == "__main__":
    found = import_cycles(import_graph(parse_modules(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_DIR)))
    print(f"{len(found)} import cycle(s) between files")
    for cycle in found:
        print("  " + " -> ".join(cycle))
