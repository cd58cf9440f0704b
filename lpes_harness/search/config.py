"""The genetic search's settings (:class:`SearchConfig`); defaults are the paper's.

Each field has the name of its command-line flag (``--population``, ``--mx``, ...) and of its
key in a ``--config`` file: one name per setting. States saved before that used longer names
(:data:`FORMER_NAMES`); a resume reads them under the current ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from lpes_harness.search.operators import check_mutation

INITIAL_POPULATIONS = ("mutants", "random")
FORMER_NAMES = {"population_size": "population", "num_parents": "parents", "num_mutants": "mutants",
                "num_crossovers": "crossovers", "mutation_x": "mx", "mutation_y": "my"}


@dataclass(frozen=True)
class SearchConfig:
    """The GA's knobs; defaults are the paper's."""

    population: int = 32
    parents: int = 12
    mutants: int = 16
    crossovers: int = 4
    generations: int = 20
    mx: float = 2.0  # Mx, in layers
    my: float = 0.2  # My, in scale units
    crossover_tries: int = 4  # N_ct (the paper: at most 4 tries)
    seed: int = 0
    cache_decimals: int = 6
    mutation: str = "paper"  # "paper": Equation 4's intervals; "joint": the wider joint draw (operators.py)
    my_base: float | None = None  # scaling both: the base curve's My (None: as many steps as My)
    # Generation 0 beside the start: "mutants" of it (the paper's), or "random" valid genomes drawn
    # uniformly, which look far from the start (benchmarks/search_efficiency.py: random draws found a
    # per-layer curve in fewer forwards than the start's mutants; racing drops a wrecking draw in one chunk).
    initial: str = "mutants"

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{f.name} must be an integer, got {value!r}")
        for name in ("population", "parents", "crossover_tries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("mutants", "crossovers", "generations"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        next_size = self.parents + self.crossovers + self.mutants
        if next_size != self.population:
            raise ValueError(
                f"population ({self.population}) must equal parents + crossovers + mutants "
                f"({self.parents} + {self.crossovers} + {self.mutants} = {next_size}): "
                "each generation is parents + crossover children + mutants"
            )
        if self.crossovers and self.parents < 2:
            raise ValueError(f"crossover needs at least 2 parents, got parents={self.parents}")
        if not (self.mx >= 0 and self.my >= 0) or (self.my_base is not None and not self.my_base >= 0):
            raise ValueError(f"mutation steps must be >= 0, got Mx={self.mx}, My={self.my}, My_base={self.my_base}")
        check_mutation(self.mutation)
        if self.initial not in INITIAL_POPULATIONS:
            raise ValueError(f"initial must be one of {', '.join(INITIAL_POPULATIONS)}, got {self.initial!r}")

    def planned_individuals(self) -> int:
        """Upper bound on individuals the run processes (each crossover may evaluate 2 children)."""
        return self.population + self.generations * (2 * self.crossovers + self.mutants)

    def to_dict(self) -> dict:
        """As a checkpoint keeps it; ``my_base`` only when set and ``initial`` only when not the paper's
        (states saved before them still compare equal)."""
        values = asdict(self)
        if values["my_base"] is None:
            del values["my_base"]
        if values["initial"] == "mutants":
            del values["initial"]
        return values

    @classmethod
    def from_settings(cls, settings: Any) -> "SearchConfig":
        """The fields found in ``settings`` (the command line's namespace, or a mapping): same names."""
        values = settings if isinstance(settings, Mapping) else vars(settings)
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


def current_names(saved: Mapping[str, Any]) -> dict:
    """A saved config under today's names (see :data:`FORMER_NAMES`)."""
    return {FORMER_NAMES.get(name, name): value for name, value in saved.items()}
