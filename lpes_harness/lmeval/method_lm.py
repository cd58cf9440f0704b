"""A method of the table as an lm-eval model: HFLM loads the model, then the method's ``install``.

:class:`MethodLM` runs any entry of :data:`lpes_harness.methods.METHODS`: a subclass names its
entry (``method = "mspoe"``) and gets, as ``--model_args``, HFLM's arguments and the keyword
arguments of the method's ``install`` (its ``__init__`` signature lists them, for lm-eval's users
and the baseline tuner's check of a grid's names). The method's ``check_arguments``, where it has
one, sees them before the (slow) model load; its ``settings(model)`` go into lm-eval's model info
under the entry's name. A subclass adds what its method needs of HFLM beyond that (its own
``loglikelihood`` or decoding loop: :mod:`.method_models`).

An entry with no class of its own (``lm_class`` None) is run by :class:`MethodLM` bound to it,
:data:`BOUND`\\ ``.<name>``: the attribute path its lazy lm-eval registry entry names
(:mod:`.registration`). So a new method is its module and its table entry.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from lm_eval.models.huggingface import HFLM

from lpes_harness.methods import METHODS
from lpes_harness.core.models import hflm_model_args


def install_arguments(name: str) -> list[inspect.Parameter]:
    """The keyword arguments of entry ``name``'s ``install``, after the model."""
    return list(inspect.signature(METHODS[name].load().install).parameters.values())[1:]


class MethodLM(HFLM):
    """HFLM with one method of the table installed on the model it loads."""

    method = ""  # the entry of METHODS this class runs

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.method and "__init__" not in vars(cls):
            cls.__init__ = _signed_init(cls.method)

    def __init__(self, pretrained: Any = None, gguf_file: str | None = None, device: str | None = None, **kwargs) -> None:
        entry = METHODS[self.method]
        module = entry.load()
        own = {p.name for p in install_arguments(self.method)}
        arguments = {name: kwargs.pop(name) for name in list(kwargs) if name in own}
        check = getattr(module, "check_arguments", None)
        if check is not None:
            check(**arguments)  # what needs no model, before the (slow) model load
        super().__init__(**hflm_model_args(pretrained, gguf_file, device, kwargs.get("dtype")), **kwargs)
        module.install(self.model, **{**entry.install_args, **arguments})

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        settings = getattr(METHODS[self.method].load(), "settings", None)
        if settings is not None:
            info[self.method] = settings(self.model)
        return info


def _signed_init(name: str):
    """``MethodLM.__init__`` whose signature names entry ``name``'s ``install`` arguments."""

    def __init__(self, *args, **kwargs) -> None:
        MethodLM.__init__(self, *args, **kwargs)

    base = list(inspect.signature(MethodLM.__init__).parameters.values())
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in install_arguments(name)]
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
