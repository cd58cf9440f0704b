"""Write the lm-eval YAML of the suites into the repository's ``tasks/suites/``.

    python -m lpes_harness.commands.suites_yaml [--out tasks/suites] [--data /path/to/data]

MMLU and C-Eval subject lists and categories are read from each suite's ``mapping.json``,
so regenerating needs the data; the written files are committed and need none.
Values are written as JSON, which is valid YAML flow style. The files' text is
:mod:`lpes_harness.tasks.suites.yaml_files`'s.
"""

from __future__ import annotations

from lpes_harness.commands import flags
from lpes_harness.tasks.suites.yaml_files import SUITES_DIR, write_all


def main(argv: list[str] | None = None) -> None:
    parser = flags.CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(SUITES_DIR), help="folder to write (default: the repository's tasks/suites)")
    parser.add_argument("--data", default=None, help="data root holding mmlu/ and ceval/ (default: $LPES_DATA or ../shared/data)")
    args = parser.parse_args(argv)
    print(f"wrote {len(write_all(args.out, args.data))} files under {args.out}")


if __name__ == "__main__":
    main()
