"""The table of methods (``lpes_harness.methods.METHODS``): every entry holds what it says.

- every parameter's bounds contain its default and its identity value;
- every entry's identity setting, installed on tiny random Llama, Qwen2 and Mistral models built in
  code, leaves the logits bit for bit the plain model's, ``remove`` restores them exactly, and a
  second install is refused by name (LPES's own ``install`` updates its scales instead);
- every entry's lm-eval model name is registered, lazily, as the class the table names;
- the table imports no torch (lm-eval reads it at start-up), and docs/baselines.md's table of
  methods is the one written from it: ``python tests/test_methods_table.py`` rewrites it.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from tiny_models import logits, random_ids, tiny_model

from lpes_harness.methods import METHODS, by_lm_eval, lm_eval_models, run_of

DOCS = Path(__file__).resolve().parents[1] / "docs" / "baselines.md"
BEGIN = "<!-- the table of methods: written by python tests/test_methods_table.py -->"
END = "<!-- end of the table of methods -->"
ARCHS = ("llama", "qwen2", "mistral")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_parameter_has_bounds_containing_its_default_and_identity(name):
    entry = METHODS[name]
    assert entry.parameters, f"{name} lists no parameter"
    for parameter in entry.parameters:
        for value in (parameter.default, parameter.identity):
            if value is not None:  # None: derived from other arguments or the model (documented as such)
                assert parameter.within(value), f"{name}.{parameter.name}={value!r} outside {parameter.accepted()}"
                if not isinstance(value, tuple):
                    assert parameter.check(value, name) == value


@pytest.mark.parametrize("arch", ARCHS)
def test_every_identity_setting_is_the_plain_model_and_remove_restores_it(arch):
    model = tiny_model(arch)
    ids = random_ids(24, batch=2)
    vanilla = logits(model, ids)
    installs_nothing = set()
    for name, entry in METHODS.items():
        module = entry.load()
        arguments = entry.identity(len(model.model.layers))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MoICE without a gates file says its routers are untrained
            assert module.install(model, **arguments) is model
        if not any(m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m) for m in model.modules()):
            installs_nothing.add(name)
        assert torch.equal(logits(model, ids), vanilla), f"{name} at {arguments} is not the plain model"
        if module.__name__ != "lpes_harness.core.rope":
            with pytest.raises(ValueError, match="already installed"):
                module.install(model, **arguments)
        assert module.remove(model) is model
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()), name
        assert not any("forward" in vars(m) for m in model.modules()), name
        assert torch.equal(logits(model, ids), vanilla), f"{name}: remove did not restore the model"
    # An identity that installs nothing is the plain model whatever the method's code does, so the check above
    # cannot fail for it: each such entry has its code's own identity checked apart (STRING, off at S = 0 as
    # its reference: test_methods_rivals.py::test_string_rewrite_at_its_identity_is_the_plain_model).
    assert installs_nothing == {"string"}, f"identity settings that install nothing: {sorted(installs_nothing)}"


def test_every_lm_eval_name_is_registered_as_the_class_the_table_names():
    from lm_eval.api.registry import get_model

    from lpes_harness.lmeval.plugin import register

    register()
    for lm_eval, target in lm_eval_models().items():
        cls = get_model(lm_eval)
        assert f"{cls.__module__}:{cls.__qualname__}" == target, lm_eval
        own = getattr(cls, "method", None)
        assert own is None or METHODS[own].lm_eval == lm_eval
        # the tuner checks a grid's argument names against the class's signature: the table's are there
        names = set(inspect.signature(cls.__init__).parameters)
        for entry in by_lm_eval(lm_eval):
            assert {p.name for p in entry.parameters} <= names, (lm_eval, entry.name)
            assert set(entry.grid or {}) <= names, (lm_eval, entry.name)


def test_the_table_is_the_only_registration_and_every_model_is_one_method_model():
    """One meaning of "method": each lm-eval model of ours, LPES's included, is a subclass of the one method
    model, built from its entry; nothing registers a model beside the table (no decorator, no entry point)."""
    from lm_eval.api.registry import get_model

    from lpes_harness.lmeval.method_lm import MethodLM
    from lpes_harness.lmeval.plugin import register

    register()
    for lm_eval in lm_eval_models():
        cls = get_model(lm_eval)
        assert issubclass(cls, MethodLM) and METHODS[cls.method].lm_eval == lm_eval, lm_eval
    root = Path(__file__).resolve().parents[1]
    decorated = [str(p.relative_to(root)) for p in (root / "lpes_harness").rglob("*.py") if "register_model" in p.read_text()]
    assert decorated == []
    assert '[project.entry-points."lm_eval.models"]' not in (root / "pyproject.toml").read_text()


def test_a_method_setup_is_factors_for_the_loaded_model_or_a_model_of_its_own():
    from lpes_harness.methods.setup import MethodSetup

    scaled = MethodSetup.of_scales([1, 1.5])
    assert scaled.is_scaled and scaled.scales == (1.0, 1.5) and scaled.recorded == [1.0, 1.5]
    baseline = MethodSetup("mspoe_hf", "head_mapping=rank")
    assert not baseline.is_scaled and baseline.spec == baseline.recorded == "mspoe_hf:head_mapping=rank"
    assert MethodSetup("hf").spec == "hf"
    with pytest.raises(ValueError, match="scales are set on the loaded lpes_hf, not on mspoe_hf"):
        MethodSetup("mspoe_hf", scales=[1.0])


def test_lpes_eval_help_ends_with_every_model_of_the_table_and_every_position_task(capsys):
    from lpes_harness.commands.eval import main
    from lpes_harness.tasks import BUILTIN_POSITION_TASKS

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code in (0, None)
    text = capsys.readouterr().out
    ours = text[text.index("lpes-harness adds"):]  # after lm-eval's own help, which names none of these
    assert 0 <= text.find("Language Model Evaluation Harness") < text.index("lpes-harness adds")  # lm-eval's first
    for method in METHODS.values():
        assert f"{method.lm_eval}: " in ours and method.label in ours, method.name
    for name in BUILTIN_POSITION_TASKS:
        assert f"    {name}: positions " in ours, name
    assert "kv_retrieval: positions 0, 20, 40, 60, 80, 100 %; num_pairs (default 30)" in ours
    assert "mmlu_local" in ours and "zeroscrolls" in ours


def test_a_run_is_named_by_its_model_and_arguments():
    assert run_of("lpes_hf", {"scales": "run/scales.json"}).label == "LPES"
    assert run_of("lpes_hf", {"scales": "f.json", "scaling": "base"}).name == "lpes_base"
    assert run_of("lpes_hf", {"scales": "f.json", "pi": True}).name == "pi"
    assert run_of("mspoe_hf", {}).label == "Ms-PoE"
    assert run_of("hf", {}) is None and run_of(None) is None


def test_the_table_imports_no_torch():
    code = "import sys, lpes_harness.methods; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _value(value) -> str:
    if value is None:
        return "derived"
    if isinstance(value, tuple):
        return ";".join(f"{v:g}" for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bounds(parameter) -> str:
    low = "-inf" if parameter.low is None else f"{parameter.low:g}"
    high = "inf" if parameter.high is None else f"{parameter.high:g}"
    return f"{'(' if parameter.low_open or parameter.low is None else '['}{low}, {high}{']' if parameter.high is not None else ')'}"


def docs_table() -> str:
    """docs/baselines.md's table of methods, from METHODS."""
    lines = [BEGIN, "| method | lm-eval model | parameters: default, identity, bounds | forwards per token | what it is |",
             "|---|---|---|---|---|"]
    for entry in METHODS.values():
        model = f"`{entry.lm_eval}`" + (f" `{entry.model_args}`" if entry.model_args else "")
        parameters = "; ".join(f"`{p.name}`{' (per layer)' if p.per_layer else ''}: {_value(p.default)}, "
                               f"{_value(p.identity) if p.identity is not None else '–'}, {_bounds(p)}"
                               for p in entry.parameters)
        lines.append(f"| {entry.label} | {model} | {parameters} | {entry.forwards} | {entry.description} |")
    return "\n".join([*lines, END])


def test_the_docs_list_every_method_of_the_table():
    text = DOCS.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{DOCS} has no table of methods; run python tests/test_methods_table.py"
    written = text[text.index(BEGIN):text.index(END) + len(END)]
    assert written == docs_table(), f"{DOCS}'s table of methods is out of date; run python tests/test_methods_table.py"


if __name__ == "__main__":
    text = DOCS.read_text(encoding="utf-8")
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + docs_table() + text[text.index(END) + len(END):]
    else:
        raise SystemExit(f"{DOCS}: put the two lines {BEGIN!r} and {END!r} where the table goes")
    DOCS.write_text(text, encoding="utf-8")
    print(f"wrote the table of methods into {DOCS}")
