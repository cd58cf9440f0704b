"""What a layer's factor s_h multiplies (``lpes_hf scaling=``, ``lpes-search --scaling``).

- ``position``, the paper's LPES: layer h reads position i as i / s_h;
- ``base``: layer h's RoPE base becomes s_h x theta (its layer type's theta), at the true positions.

:mod:`lpes_harness.rope` applies them; scales files record which (:mod:`lpes_harness.scales_file`).
A leaf: imports nothing, so torch-free modules and ``rope`` share it without an import cycle.
"""

SCALINGS = ("position", "base")
