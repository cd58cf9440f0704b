"""The shape of the house, read from the source (ast): what issue #30 set as the bar.

- no import cycle between files, counting the imports inside functions (a function-local
  import hides a cycle from Python, not from a reader);
- the layers (:data:`LAYERS`, lowest first: core, methods, lmeval and tasks, evaluation, search,
  commands): every module is in one (:data:`LAYER_OF`), and none imports from a layer above its
  own, function-local imports included (data flows down: a command asks evaluation or search,
  which ask the methods and lm-eval, which stand on the core);
- ``analysis/``, ``lmeval/`` and ``tasks/`` never import ``search/``;
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

# The layers, lowest first: a module may import from its own layer and the ones below.
LAYERS = ("core", "methods", "lmeval and tasks", "evaluation", "search", "commands")

# Every module of lpes_harness (without the ``lpes_harness.`` prefix; "" is the package) and its layer.
# A module that is a library and a command at once (an analysis module with a main()) is in the
# layer of its library part: where its importers need it, which its own imports allow.
LAYER_OF = {
    **dict.fromkeys((
        "", "arg_values", "curves", "files", "gguf_cache", "models", "named_path", "plots", "rope", "rope_anatomy", "rope_factors",
        "rope_math", "scales_args", "scales_file", "scaling",
    ), "core"),
    # every way of changing a model at inference, the table of them, and what they share
    **dict.fromkeys((
        "methods", "methods.arguments", "methods.attention", "methods.buckets", "methods.decoding", "methods.fitm",
        "methods.model_checks", "methods.moice", "methods.mspoe", "methods.parameters", "methods.poshidden",
        "methods.query_rows", "methods.state", "methods.string_shift", "methods.train_moice",
    ), "methods"),
    # lm-eval's side: registration (the .pth hook, lpes-eval's register), our lm-eval models, the tasks
    **dict.fromkeys((
        "_startup", "plugin", "lm", "lmeval", "lmeval.answer_logits", "lmeval.contract",
        "lmeval.hflm", "lmeval.method_lm", "lmeval.method_models", "lmeval.model_args", "lmeval.position_scorer", "lmeval.prefix_generation",
        "lmeval.registration", "lmeval.requests", "lmeval.tasks",
        "tasks", "tasks.data", "tasks.kv_retrieval", "tasks.mdqa", "tasks.metrics", "tasks.multi_needle",
        "tasks.needle", "tasks.position", "tasks.suites", "tasks.suites.common", "tasks.suites.data_files", "tasks.suites.leval",
        "tasks.suites.multiple_choice", "tasks.suites.yaml_files", "tasks.suites.zeroscrolls",
    ), "lmeval and tasks"),
    # the library under the commands: methods scored on the same samples, caches, statistics, tables
    **dict.fromkeys((
        "analysis", "analysis.baseline_rows", "analysis.calibration", "analysis.conditions", "analysis.inputs",
        "analysis.layer_types", "analysis.leaderboard_rows", "analysis.logged_samples", "analysis.paired",
        "analysis.paired_table", "analysis.pooled",
        "analysis.report_tables", "analysis.results_files", "analysis.score_cache", "analysis.search_history",
        "analysis.stats", "analysis.transfer", "analysis.wrong_answers",
        "methods.poshidden_channel",  # the channel statistic, then candidates scored on a task's samples
    ), "evaluation"),
    **dict.fromkeys((
        "search", "search.budget", "search.callbacks", "search.condition_fitness", "search.config",
        "search.distributed", "search.final_choice", "search.fingerprint", "search.fitness", "search.genome",
        "search.heldout", "search.loop", "search.operators", "search.profiles", "search.run_record",
        "search.sample_order", "search.selection", "search.sweep", "search.timing", "search.uniform_tuning",
        "search.validate",
    ), "search"),
    # entry points: lpes-search (run, its parser cli, its --status), lpes-report, lpes-check (validity), python -m ...
    **dict.fromkeys((
        "report", "search.run", "search.cli", "search.status", "search.tune_baselines", "analysis.attention", "analysis.rsm",
        "analysis.validity", "tasks.__main__",
        "analysis.leaderboard", "analysis.leaderboard_boards",  # the leaderboard page, and the tables it ranks
    ), "commands"),
}


def layer_of(module: str, package: str = PACKAGE_DIR.name) -> str | None:
    return LAYER_OF.get(module[len(package) + 1:] if module != package else "")


def upward_imports(graph: dict[str, set[str]], layer=layer_of) -> list[str]:
    """``module (its layer) imports target (a higher layer)``, for every such import."""
    rank = {name: index for index, name in enumerate(LAYERS)}
    return sorted(
        f"{module} ({layer(module)}) imports {target} ({layer(target)})"
        for module, targets in graph.items()
        for target in targets
        if layer(module) in rank and layer(target) in rank and rank[layer(target)] > rank[layer(module)]
    )


def test_no_import_cycle_between_files():
    cycles = import_cycles(import_graph(MODULES))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_every_module_is_in_one_layer():
    names = {layer_of(module) for module in MODULES}
    unplaced = sorted(module for module in MODULES if layer_of(module) is None)
    assert not unplaced, f"modules in no layer (add them to LAYER_OF): {unplaced}"
    assert names <= set(LAYERS)
    gone = sorted(set(LAYER_OF) - {module.partition(".")[2] for module in MODULES})
    assert not gone, f"LAYER_OF names modules that are not there: {gone}"


def test_no_module_imports_from_a_layer_above_its_own():
    offenders = upward_imports(import_graph(MODULES))
    assert not offenders, offenders


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
    toy_layers = {"toy.a": "core", "toy.b": "methods", "toy.c": "commands"}.get
    assert upward_imports(import_graph(modules), toy_layers) == ["toy.a (core) imports toy.b (methods)"]
    assert _private_lm_eval_uses(modules["toy.c"][1]) == ["lm_eval.api._hidden", "lm_eval.api._private"]


if __name__ == "__main__":
    found = import_cycles(import_graph(parse_modules(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_DIR)))
    print(f"{len(found)} import cycle(s) between files")
    for cycle in found:
        print("  " + " -> ".join(cycle))
