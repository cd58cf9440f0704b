"""The Bézier-constrained genetic search of per-layer RoPE scales (paper Algorithm 1) on DEAP.

``genome`` (where genes live), ``operators`` (mutate / mate / select on a DEAP toolbox),
``loop`` (the algorithm, its cache and resumable state; no files), ``callbacks``
(checkpoint, history, progress, plots). The lm-eval fitness lives in ``fitness``.
"""

from lpes_harness.search.genome import GenomeSpec, initial_genome, make_individual, random_brute_force_genome, random_genome
from lpes_harness.search.config import SearchConfig
from lpes_harness.search.loop import Callback, GeneticSearch, cache_key

__all__ = [
    "Callback",
    "GeneticSearch",
    "GenomeSpec",
    "SearchConfig",
    "cache_key",
    "initial_genome",
    "make_individual",
    "random_brute_force_genome",
    "random_genome",
]
