"""The ``--model_args`` of the lm-eval run in progress: what registration sets and the task glue reads.

A leaf (imports nothing of ours): :mod:`.registration` publishes the args while its
``simple_evaluate`` wrapper runs, :mod:`.tasks` reads them; neither imports the other for it.
"""

from __future__ import annotations

import contextvars

# The model args of the simple_evaluate call in progress (a dict), None outside one.
# lm-eval 0.4.13 merges --model_args into every task's metadata; the task glue reads this to
# tell the user's task keys from model keys.
MODEL_ARGS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("lpes_model_args", default=None)


def parse_model_args(model_args) -> dict:
    """``--model_args`` as a dict (lm-eval's own parser for the string form)."""
    if isinstance(model_args, str):
        from lm_eval.utils import simple_parse_args_string

        return simple_parse_args_string(model_args)
    return dict(model_args) if isinstance(model_args, dict) else {}


def model_arg_names() -> set[str]:
    """The keys of ``--model_args`` of the ``simple_evaluate`` call in progress (empty outside one)."""
    return set(MODEL_ARGS.get() or {})
