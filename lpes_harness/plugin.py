"""Registration with lm-eval, and the ``lpes-eval`` console script.

``lpes-eval`` takes exactly the arguments of ``lm_eval``. It exists for environments
where the start-up ``.pth`` hook is not active (e.g. ``python -S``, or an install
that skipped the .pth file): it registers our models explicitly and installs the same
early checks (task options, and ``lpes_hf``'s scale arguments: exit code 2 and one line
before any model loads), then runs lm-eval's own command line.
"""

from __future__ import annotations

import sys


def register() -> None:
    """Register our lm-eval models (lazily: nothing heavy is imported here) and tasks, and
    install the early checks: what the start-up hook does, now for the lm-eval modules
    already imported and on import for the others (lm-eval's task index is not built here)."""
    from lpes_harness import _startup

    _startup.install()


def main(argv: list[str] | None = None) -> None:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    register()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
