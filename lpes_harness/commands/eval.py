"""Registration with lm-eval, and the ``lpes-eval`` console script.

``lpes-eval`` takes exactly the arguments of ``lm_eval``. It exists for environments
where the start-up ``.pth`` hook is not active (e.g. ``python -S``, or an install
that skipped the .pth file): it registers our models explicitly and installs the same
early checks (task options, and ``lpes_hf``'s scale arguments: exit code 2 and one line
before any model loads), then runs lm-eval's own command line.
"""

from __future__ import annotations

import sys
from lpes_harness.lmeval.plugin import harness_help, register


def main(argv: list[str] | None = None) -> None:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    register()
    from lm_eval.__main__ import cli_evaluate

    if sys.argv[1:] not in ([], ["-h"], ["--help"]):
        cli_evaluate()
        return
    try:
        cli_evaluate()  # lm-eval's help, then its exit
    finally:
        print(harness_help())


if __name__ == "__main__":
    main()
