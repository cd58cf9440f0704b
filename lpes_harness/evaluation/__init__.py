"""The library under the commands: scoring methods on the same samples, and the analyses and pages made of it.

- ``representation_structure`` (``python -m lpes_harness.commands.rsm``): representational-structure
  deviation. A layer x layer similarity matrix of last-token hidden states, and its mean absolute
  difference from vanilla, for the searched (Bezier) scales against uniform, noisy, shuffled and
  random ones.
- ``middle_attention`` (``python -m lpes_harness.commands.attention``): the last token's attention
  mass on the middle third of the context, per layer, for several uniform scales; only that one
  query row is computed (from the layer's own q/k projections, via hooks), never full eager attention.

``inputs`` holds what both share: the model, the prompts, JSON and figure output.

- ``paired`` (``python -m lpes_harness.commands.paired``): vanilla, PI, searched curves and baseline
  models (``baseline_rows``) on the same held-out samples, with intervals and paired tests (``stats``);
  every scored block is kept by ``score_cache``.
- ``validity`` (``lpes-check``): does a position task measure retrieval on this model?
  (``wrong_answers``; ``calibration`` for ``--grid``.)
- ``report`` (``lpes-report``) writes ``report.md`` from what ``results_files``, ``report_tables``,
  ``search_history`` and ``logged_samples`` read and render.
- ``leaderboard`` (``python -m lpes_harness.commands.leaderboard``): ``docs/leaderboard.md``, from the
  committed records of ``leaderboard_boards`` read as ``leaderboard_rows``.
- ``poshidden_channels`` (``python -m lpes_harness.commands.poshidden_channel``): a model's positional
  hidden channels, chosen on a task's samples, for ``poshidden_hf``.
"""
