#!/usr/bin/env python
"""Search per-layer RoPE scales (LPES) with the Bézier-constrained genetic algorithm.

A thin wrapper of the ``lpes-search`` command (``lpes_harness.commands.search:main``), for a checkout
without the package installed and for ``accelerate launch`` / ``torchrun``, which take a script;
run ``lpes-search --help`` (or ``python searches/ga.py --help``).
"""

from lpes_harness.commands.search import main

if __name__ == "__main__":
    main()
