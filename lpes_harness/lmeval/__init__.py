"""The one place that knows lm-eval's internals.

- :mod:`.registration`: lazy model entries, our task folder in every ``TaskManager``, and the
  early checks wrapped around ``simple_evaluate`` and the command line; shared by the ``.pth``
  start-up hook (:mod:`lpes_harness.lmeval.startup`) and ``lpes-eval`` (:mod:`lpes_harness.lmeval.plugin`).
- :mod:`.model_args`: the ``--model_args`` of the run in progress, which registration sets and
  the task glue reads (a leaf, so that neither imports the other).
- :mod:`.tasks`: position tasks as lm-eval tasks (``custom_dataset``, ``process_results``,
  in-memory groups, YAML files and their generator, the precheck, results reading).
- :mod:`.requests`: lm-eval requests and its tokenisation of a (context, answer) pair.
- :mod:`.position_scorer`: a position task's samples scored one by one, as lm-eval prompts them
  (the search's fitness, the held-out tables and ``lpes-check`` all score through it).
- :mod:`.answer_logits`: the fast one-pass scorer behind it (logits only at the answer tokens).
- :mod:`.prefix_generation`: greedy ``generate_until`` whose prompts share their common prefixes on
  one KV cache (``lpes_hf prefix_cache=true``; L-Eval's questions of one document).
- :mod:`.hflm`: what our HFLM subclasses override of HFLM (and `loglikelihood` with logits only at the answers).
- :mod:`.method_lm`: a method of the table (:data:`lpes_harness.methods.METHODS`) as an lm-eval
  model, HFLM then the method's ``install``: ``MethodLM``, the one class every lm-eval model of ours
  subclasses; :mod:`.lpes_lm` (``lpes_hf``: LPES and PI) and :mod:`.method_models` (the methods
  that need more of HFLM) are its subclasses.
- :mod:`.contract`: the lm-eval internals all of the above assume, checked by
  ``tests/test_lmeval_contract.py`` against the pinned version.

Cheap to import: nothing here imports lm-eval, torch or transformers at module level, but the
lm-eval model classes (:mod:`.method_lm`, :mod:`.lpes_lm`, :mod:`.method_models`), which lm-eval loads
lazily by name.
"""

# The lm-eval version these modules were written against (pyproject pins it).
LM_EVAL_VERSION = "0.4.13"
