"""Analyses of what LPES does inside the model, each a command with a plot.

- ``python -m lpes_harness.commands.rsm``: representational-structure deviation. A layer x
  layer similarity matrix of last-token hidden states, and its mean absolute difference from
  vanilla, for the searched (Bezier) scales against uniform, noisy, shuffled and random ones.
- ``python -m lpes_harness.commands.attention``: the last token's attention mass on the middle
  third of the context, per layer, for several uniform scales; only that one query row is
  computed (from the layer's own q/k projections, via hooks), never full eager attention.

``inputs`` holds what both share: the model, the prompts, JSON and figure output.

- ``python -m lpes_harness.commands.paired``: vanilla, PI, searched curves and baseline models
  (``baseline_rows``) on the same held-out samples, with intervals and paired tests (``stats``);
  every scored block is kept by ``score_cache``.
- ``validity`` (``lpes-check``): does a position task measure retrieval on this model?
- ``results_files``, ``report_tables``, ``search_history``, ``logged_samples``: what ``lpes-report``
  (:mod:`lpes_harness.commands.report`) reads and renders.
"""
