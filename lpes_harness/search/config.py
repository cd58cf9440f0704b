"""The genetic search's settings (:class:`SearchConfig`); defaults are the paper's."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from lpes_harness.search.operators import check_mutation


@dataclass(frozen=True)
class SearchConfig:
    """The GA's knobs; defaults are the paper's."""

    population_size: int = 32
    num_parents: int = 12
    num_mutants: int = 16
    num_crossovers: int = 4
    generations: int = 20
    mutation_x: float = 2.0  # Mx, in layers
    mutation_y: float = 0.2  # My, in scale units
    crossover_tries: int = 4  # N_ct (the paper: at most 4 tries)
    seed: int = 0
    cache_decimals: int = 6
    mutation: str = "paper"  # "paper": Equation 4's intervals; "joint": the wider joint draw (operators.py)

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{f.name} must be an integer, got {value!r}")
        for name in ("population_size", "num_parents", "crossover_tries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_mutants", "num_crossovers", "generations"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        next_size = self.num_parents + self.num_crossovers + self.num_mutants
        if next_size != self.population_size:
            raise ValueError(
                f"population_size ({self.population_size}) must equal num_parents + num_crossovers + num_mutants "
                f"({self.num_parents} + {self.num_crossovers} + {self.num_mutants} = {next_size}): "
                "each generation is parents + crossover children + mutants"
            )
        if self.num_crossovers and self.num_parents < 2:
            raise ValueError(f"crossover needs at least 2 parents, got num_parents={self.num_parents}")
        if not (self.mutation_x >= 0 and self.mutation_y >= 0):
            raise ValueError(f"mutation steps must be >= 0, got Mx={self.mutation_x}, My={self.mutation_y}")
        check_mutation(self.mutation)

    def planned_individuals(self) -> int:
        """Upper bound on individuals the run processes (each crossover may evaluate 2 children)."""
        return self.population_size + self.generations * (2 * self.num_crossovers + self.num_mutants)

    def to_dict(self) -> dict:
        return asdict(self)
