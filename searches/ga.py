#!/usr/bin/env python
"""Search per-layer RoPE scales (LPES) with the Bézier-constrained genetic algorithm.

A thin command line over ``lpes_harness.search``; run ``python searches/ga.py --help``.
"""

from lpes_harness.search.run import main

if __name__ == "__main__":
    main()
