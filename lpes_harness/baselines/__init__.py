"""The paper's baselines as lm-eval models on the same harness as ``lpes_hf``.

- ``mspoe_hf``   -> :class:`lpes_harness.baselines.mspoe.MsPoELM` (per-head position ratios)
- ``buckets_hf`` -> :class:`lpes_harness.baselines.buckets.BucketsLM` (K RoPE bases in parallel)
- ``moice_hf``   -> :class:`lpes_harness.baselines.moice.MoICELM` (routed mixture of RoPE bases;
  routers trained by ``python -m lpes_harness.baselines.train_moice``)

PI is ``lpes_hf`` with one uniform scale (``scales=1.4``, or ``scales=<file>,pi=true``).
Each module also offers ``install(model, ...)`` / ``remove(model)`` on a loaded model.
Nothing heavy is imported here: lm-eval registration is lazy (see ``lpes_harness._startup``).
"""
