"""Values of ``--model_args`` as lm-eval hands them over, for every model of ours to parse alike.

lm-eval turns ``true`` into True and ``-1`` into -1.0 before a model sees them: :func:`shown`
writes a value back as the user typed it, for messages. :func:`parse_bool` and
:func:`number_list` are the one parser of booleans and of ``1.0;1.3;1.6`` lists (``lpes_hf``'s
scales, the baselines' ``bases`` and ``absolute_bases``), :func:`batch_size` of the fitness's
prompts per forward. A leaf: imports nothing.
"""

from __future__ import annotations

from typing import Any

TRUE, FALSE = {"true", "yes", "1"}, {"false", "no", "0"}


def shown(value: Any) -> str:
    """A value as the user wrote it (lm-eval turns ``true`` into True and ``-1`` into -1.0)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


def number_list(text: str, separators: str = ";") -> list[float]:
    """The numbers in ``text`` separated by any of ``separators`` (blank parts skipped).

    The one parser of ``1.0;1.3;1.6`` lists (``lpes_hf``'s scales, the baselines' ``bases``); raises
    ``ValueError`` on a part that is not a number, each caller words its own error.
    """
    for separator in separators[1:]:
        text = text.replace(separator, separators[0])
    return [float(part) for part in text.split(separators[0]) if part.strip()]


def parse_bool(name: str, value: Any, error: type[ValueError] = ValueError) -> bool:
    """``true``/``yes``/``1`` or ``false``/``no``/``0`` (any case), a bool, or 0/1; else ``error``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE | FALSE:
        return value.strip().lower() in TRUE
    raise error(f"{name}={shown(value)} is not allowed; give true or false")


def batch_size(value: Any) -> int | str:
    """Prompts per forward of the search's fitness: an integer >= 1 (or its digits) or ``"auto"``;
    else ``ValueError``. Not lm-eval's ``auto:N``: the fitness sizes its own batches, and the
    search's argument check refuses what the fitness would refuse, before a run writes anything."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"batch_size {value!r}: give an integer >= 1 (prompts per forward) or 'auto'")
