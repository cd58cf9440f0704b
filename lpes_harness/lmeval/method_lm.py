"""Every method of the table as an lm-eval model: HFLM loads the model, then the method is installed.

:class:`MethodLM` is the one lm-eval model class: every entry of :data:`lpes_harness.methods.METHODS`
runs as a subclass of it (LPES's ``lpes_hf`` included: :mod:`.lpes_lm`). A subclass names its entry
(``method = "mspoe"``) and gets, as ``--model_args``, HFLM's arguments and the method's own (its
``__init__`` signature lists them, for lm-eval's users and the baseline tuner's check of a grid's
names). Two hooks are all a subclass may change of the loading:

- :meth:`MethodLM.before_load`: the method's arguments checked before the (slow) model load; by
  default the entry's ``check_arguments``, where it has one, and its arguments are its ``install``'s.
  A subclass whose method needs other arguments (a setting file, a curve of scales) names them as the
  hook's keyword-only parameters;
- :meth:`MethodLM.after_load`: the method installed on the loaded model (default: the entry's
  ``install`` with the entry's ``install_args``);

and :meth:`MethodLM.method_info` is what lm-eval's model info records (default: the entry's
``settings(model)`` under its name). Around the hooks, MethodLM itself installs the LPES curve of
``lpes_scales=`` under a method that stacks with one (:mod:`.lpes_stack`), before the method, and takes
it off after it; the model info then names the stack (``lpes+pcd``) and the curve. Beyond that a subclass adds what its method needs of HFLM
(its own ``loglikelihood`` or decoding loop: :mod:`.method_models`).

An entry with no class of its own (``lm_class`` None) is run by :class:`MethodLM` bound to it,
:data:`BOUND`\\ ``.<name>``: the attribute path its lazy lm-eval registry entry names
(:mod:`.registration`). So a new method is its module and its table entry.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from lm_eval.models.huggingface import HFLM

from lpes_harness.core import rope
from lpes_harness.core.models import hflm_model_args
from lpes_harness.lmeval.lpes_stack import STACK_ARGUMENTS, parse_curve, stack_parameters
from lpes_harness.methods import METHODS


def install_arguments(name: str) -> list[inspect.Parameter]:
    """The keyword arguments of entry ``name``'s ``install``, after the model."""
    return list(inspect.signature(METHODS[name].load().install).parameters.values())[1:]


class MethodLM(HFLM):
    """HFLM with one method of the table installed on the model it loads."""

    method = ""  # the entry of METHODS this class runs
    lpes_curve = None  # the LPES curve under the method (a CurveUnder), where lpes_scales= gives one

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.method and "__init__" not in vars(cls):
            cls.__init__ = _signed_init(cls)

    def __init__(self, pretrained: Any = None, gguf_file: str | None = None, device: str | None = None, **kwargs) -> None:
        own = self.taken_arguments()
        arguments = {name: kwargs.pop(name) for name in list(kwargs) if name in own}
        load = {"pretrained": pretrained, "gguf_file": gguf_file, "device": device, **kwargs}
        prepared = self.prepare(load, **arguments)  # what needs no model, before the (slow) model load
        super().__init__(**hflm_model_args(pretrained, gguf_file, device, kwargs.get("dtype")), **kwargs)
        self._load_arguments = load
        self._install(prepared)

    def reconfigure(self, **arguments) -> None:
        """The method at other settings on the model already loaded, as a load with these arguments would
        install it: checked by the steps a load runs, taken off (``remove`` leaves the plain model), the
        curve under it after it, and installed again (a stack's curve only where ``lpes_scales`` is among
        ``arguments``). A tuner trying many settings of one method loads the weights once instead of once
        a setting (25 s each for the bundled model)."""
        installed_curve = self.lpes_curve
        prepared = self.prepare(self._load_arguments, **arguments)  # a bad setting leaves the model as it was
        METHODS[self.method].load().remove(self.model)
        if installed_curve is not None:
            rope.remove(self.model)
        self._install(prepared)

    def prepare(self, load: dict, **arguments) -> Any:
        """Everything checked before the model loads: the stack's curve (:func:`~.lpes_stack.parse_curve`,
        which refuses a method that does not stack), then :meth:`before_load` with the method's own arguments."""
        stack = {name: arguments.pop(name) for name in STACK_ARGUMENTS if name in arguments}
        curve = parse_curve(self.method, load, **stack)
        prepared = self.before_load(load, **arguments)
        self.lpes_curve = curve
        return prepared

    def _install(self, prepared: Any) -> None:
        # The curve first: the method's hooks must run after the curve's and see the (cos, sin) it gives a layer.
        if self.lpes_curve is not None:
            self.lpes_curve.install(self.model)
        self.after_load(prepared)

    @classmethod
    def taken_arguments(cls) -> set[str]:
        """The ``--model_args`` :meth:`prepare` takes, the rest going to HFLM: the method's own, and the stack's on
        every method (one that does not stack refuses them there, in one line)."""
        return {p.name for p in cls.method_arguments()} | set(STACK_ARGUMENTS)

    @classmethod
    def method_arguments(cls) -> list[inspect.Parameter]:
        """The method's own ``--model_args``: :meth:`before_load`'s keyword-only parameters where a
        subclass names them, else the keyword arguments of the entry's ``install``; and a method that
        stacks with an LPES curve, the curve's (``lpes_scales``, ``lpes_scaling``)."""
        named = [p for p in inspect.signature(cls.before_load).parameters.values() if p.kind is p.KEYWORD_ONLY]
        stack = stack_parameters() if METHODS[cls.method].stacks_with_lpes else []
        return [*(named or install_arguments(cls.method)), *stack]

    def before_load(self, load: dict, **arguments) -> Any:
        """The method's arguments checked before the model loads; returns what :meth:`after_load` installs.
        ``load``: the HFLM arguments the model is about to load with (``pretrained``, ``batch_size``, ...)."""
        check = getattr(METHODS[self.method].load(), "check_arguments", None)
        if check is not None:
            check(**arguments)
        return arguments

    def after_load(self, prepared: Any) -> None:
        """The method installed on ``self.model``, from what :meth:`before_load` returned."""
        entry = METHODS[self.method]
        entry.load().install(self.model, **{**entry.install_args, **prepared})

    def method_info(self) -> dict:
        """What lm-eval's model info records of the method: the entry's ``settings(model)``, under its name."""
        settings = getattr(METHODS[self.method].load(), "settings", None)
        return {} if settings is None else {self.method: settings(self.model)}

    def get_model_info(self) -> dict:
        stack = {} if self.lpes_curve is None else self.lpes_curve.info(self.model)
        return {**super().get_model_info(), **self.method_info(), **stack}


def _signed_init(cls: type[MethodLM]):
    """``MethodLM.__init__`` whose signature names ``cls``'s own arguments (:meth:`MethodLM.method_arguments`)."""

    def __init__(self, *args, **kwargs) -> None:
        MethodLM.__init__(self, *args, **kwargs)

    base = list(inspect.signature(MethodLM.__init__).parameters.values())
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in cls.method_arguments()]
    __init__.__signature__ = inspect.Signature([*base[:-1], *own, base[-1]])
    return __init__


def bind(name: str) -> type[MethodLM]:
    """:class:`MethodLM` bound to entry ``name``."""
    entry = METHODS[name]
    class_name = "".join(part.title() for part in name.split("_")) + "LM"
    return type(class_name, (MethodLM,), {
        "method": name, "__module__": __name__, "__qualname__": f"BOUND.{name}",
        "__doc__": f"HFLM with {entry.label}: {entry.description}.",
    })


# The lm-eval models of the entries without a class of their own, by entry name.
BOUND = types.SimpleNamespace(**{name: bind(name) for name, entry in METHODS.items() if entry.lm_class is None})
