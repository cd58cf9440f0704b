"""General-ability and long-context suites on local files: MMLU, C-Eval, L-Eval, ZeroSCROLLS.

- ``common``: where the data is (``data_path`` metadata, ``$LPES_DATA``, ``../shared/data``),
  the tokenizer used to truncate long documents, and the truncation itself.
- ``multiple_choice``: MMLU and C-Eval CSV loaders (lm-eval's ``mmlu`` / ``ceval-valid`` format).
- ``leval``: L-Eval's closed-ended tasks (Coursera, QuALITY, TOEFL/TPO, SFiction), prompts and metrics.
- ``zeroscrolls``: the 7 ZeroSCROLLS tasks with data, document truncation and ROUGE / F1 / accuracy.
- ``yaml_files``: writes the lm-eval YAML under the repository's ``tasks/suites/``.

Nothing here imports torch or a model: the only model-side object is a tokenizer, needed to
cut long documents to the paper's 3,584-token context.
"""
