"""What a method changed on a model, and how :func:`remove` undoes it: the one piece of install /
remove bookkeeping every method of :mod:`lpes_harness.methods` uses.

A method keeps its state on the model, as one attribute (a :class:`Slot`): ``install`` asks the
slot whether the model is free (a second install is refused, naming the method and how to take the
first one off), records each change it makes on the state's :class:`Changes` (a hook, an attention
``forward`` replaced on one module, a submodule added), then attaches the state; ``remove`` undoes
the recorded changes, last first, and drops the attribute, which leaves the model exactly as it
was. ``get`` finds the state or says how to install the method.

LPES itself (:mod:`lpes_harness.core.rope`) keeps its own state: a core module, below the methods, whose
``install`` on an installed model updates the scales in place (what the search needs) instead of
refusing.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from lpes_harness.methods.arguments import MethodError


class Changes:
    """The changes one install made, each with its undo; :meth:`undo` runs them last first."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], Any]] = []

    def on_remove(self, undo: Callable[[], Any]) -> None:
        """Run ``undo`` at remove (a hook handle's ``remove``, a recorder's)."""
        self._undo.append(undo)

    def forward(self, module: nn.Module, forward: Callable) -> None:
        """Route ``module(...)`` to ``forward(module, ...)``, as an instance attribute that remove deletes."""
        module.forward = types.MethodType(forward, module)
        self._undo.append(lambda: module.__dict__.pop("forward", None))

    def submodule(self, parent: nn.Module, name: str, child: nn.Module) -> None:
        """Add ``child`` to ``parent`` as ``name`` (in its ``state_dict`` while installed)."""
        parent.add_module(name, child)
        self._undo.append(lambda: delattr(parent, name))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


@dataclass
class MethodState:
    """The base of every method's state: the changes its install made."""

    changes: Changes = field(default_factory=Changes, kw_only=True)


class Slot:
    """Where one method keeps its state on a model: the attribute ``attr``.

    ``who`` names the method in messages (``Ms-PoE``, ``string_hf``); ``module`` is the module whose
    ``install`` / ``remove`` the messages point to (``mspoe``).
    """

    def __init__(self, attr: str, who: str, module: str) -> None:
        self.attr, self.who, self.module = attr, who, module

    def free(self, model: nn.Module) -> None:
        """Refuse a model the method is already installed on."""
        if self.find(model) is not None:
            raise MethodError(f"{self.who} is already installed on this model; call {self.module}.remove(model) first")

    def attach(self, model: nn.Module, state: MethodState) -> nn.Module:
        setattr(model, self.attr, state)
        return model

    def find(self, model: nn.Module) -> Any:
        """The installed state, or None."""
        return getattr(model, self.attr, None)

    def get(self, model: nn.Module) -> Any:
        state = self.find(model)
        if state is None:
            raise MethodError(f"{self.who} is not installed on this model; call {self.module}.install(model) first")
        return state

    def remove(self, model: nn.Module) -> nn.Module:
        """Undo everything the install changed; a model without the method is returned as it is."""
        state = self.find(model)
        if state is not None:
            state.changes.undo()
            delattr(model, self.attr)
        return model
