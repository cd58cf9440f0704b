"""A method set-up: what one row of a comparison runs, the one thing the scorers pass around.

A method (an entry of :data:`lpes_harness.methods.METHODS`) at given settings is either

- factors for the ``lpes_hf`` model already loaded (LPES, LPES base/both, PI, a uniform row, and
  vanilla, the identity): set in place between rows, never reloaded; or
- another lm-eval model with its ``--model_args`` (``mspoe_hf``, ``head_mapping=rank``; a tuner's
  candidate; ``hf``), loaded only when the score cache lacks one of its blocks.

The scorers (:func:`lpes_harness.evaluation.paired.score_methods`, the search's held-out table and
validation, the baseline tuner) take rows as ``{row name: MethodSetup}``: the row's name is the
table's, the set-up is what runs. Its cache key is the factors (read under the loaded model's
scaling) or :attr:`MethodSetup.spec`, as score caches have always keyed them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The lm-eval model whose factors a set-up of scales changes in place (the table's LPES and PI entries).
SCALED_MODEL = "lpes_hf"


@dataclass(frozen=True)
class MethodSetup:
    """A method as it runs: ``scales`` for the loaded ``lpes_hf``, or an lm-eval ``model`` with ``args``
    (``key=value,...``). Build one with :meth:`of_scales` or ``MethodSetup(model, args)``."""

    model: str
    args: str = ""
    scales: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.scales is None:
            return
        if self.model != SCALED_MODEL or self.args:
            raise ValueError(f"scales are set on the loaded {SCALED_MODEL}, not on {self.spec}")
        object.__setattr__(self, "scales", tuple(float(s) for s in self.scales))

    @classmethod
    def of_scales(cls, scales: Sequence[float]) -> MethodSetup:
        """Factors for the loaded ``lpes_hf`` (one per layer; 2L under scaling both)."""
        return cls(SCALED_MODEL, scales=tuple(scales))

    @property
    def is_scaled(self) -> bool:
        """Factors on the loaded model (True), or a model of its own to load (False)."""
        return self.scales is not None

    @property
    def spec(self) -> str:
        """``MODEL[:ARGS]``: how ``--baseline`` names it, and a model's score-cache key."""
        return f"{self.model}:{self.args}" if self.args else self.model

    @property
    def recorded(self) -> list[float] | str:
        """What a scored table records of it (its ``methods``): the factors, or the spec."""
        return list(self.scales) if self.is_scaled else self.spec
