"""``[NAME=]PATH`` on a command line: the one parser for every argument that names a file.

``lpes-report vanilla=runs/vanilla``, ``--scales demo=results/demo/scales.json``: NAME is what
the tables and plots call that file; without it the caller picks a name (the folder's or the
file's). A path may itself hold '=' (``runs/lr=0.1/results.json``), so text whose part before
the first '=' is empty or holds a path separator is a path, not a name.
"""

from __future__ import annotations

import os


def split_named_path(text: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> ``(NAME, PATH)``; a plain ``PATH`` -> ``(None, PATH)``."""
    name, sep, path = text.partition("=")
    if not sep or not name or "/" in name or os.sep in name:
        return None, text
    return name, path


def require_named_path(
    text: str, argument: str, accepted: str = "NAME=FILE", error: type[ValueError] = ValueError
) -> tuple[str, str]:
    """``NAME=PATH`` -> ``(NAME, PATH)``; else ``error`` naming ``argument`` and what it accepts."""
    name, path = split_named_path(text)
    if name is None:
        raise error(f"{argument} {text!r}: expected {accepted}")
    return name, path
