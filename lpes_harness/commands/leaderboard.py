"""One leaderboard of every method: ``docs/leaderboard.md``, the ``lpes-compare`` boards (issue #97) and the committed
held-out tables (issue #45).

    python -m lpes_harness.commands.leaderboard --out docs/leaderboard.md
    python -m lpes_harness.commands.leaderboard --out docs/leaderboard.md --figure docs/images/positions_by_method.png

Nothing is scored. The page opens with each committed ``lpes-compare`` board
(:data:`~lpes_harness.evaluation.leaderboard_boards.COMPARES`), as that command wrote it, with its command. Then
each held-out board (:data:`~lpes_harness.evaluation.leaderboard_boards.BOARDS`, one per model)
reads the committed per-sample records of one held-out sample set
(:mod:`lpes_harness.evaluation.leaderboard_rows`) and :mod:`lpes_harness.evaluation.leaderboard` ranks
every row by its accuracy, with its 95 % interval, its paired difference to vanilla and to the best LPES
row on the same samples (:func:`~lpes_harness.evaluation.stats.compare_paired`: exact McNemar, interval of
the difference), the forwards a token costs (the table of methods) and the latency ratio to vanilla that
``benchmarks/latency.py`` committed for the board's model (``Board.latency``). A method of the table with
no row on a board gets a line saying so, with the command that would score it. The page says where LPES
is not first. ``--figure`` also draws accuracy by gold position of vanilla, the best LPES row and the best
rival on each board, one panel per model (:mod:`lpes_harness.evaluation.leaderboard_figure`), and writes
the numbers it draws beside it as JSON.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lpes_harness.commands import flags
from lpes_harness.evaluation.leaderboard import render


def main(argv: Sequence[str] | None = None) -> int:
    parser = flags.CommandParser(prog="python -m lpes_harness.commands.leaderboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="the page to write (default: print it)")
    parser.add_argument("--figure", default=None, metavar="PATH",
                        help="also draw accuracy by gold position (vanilla, best LPES row, best rival; one panel per "
                             "board) as this PNG, with its numbers beside it as JSON")
    parser.add_argument("--root", default=".", help="the folder the records' paths are relative to (default: here)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        parser.error(f"--root {args.root!r} is not a folder")
    if args.figure is not None and Path(args.figure).suffix.lower() != ".png":  # its JSON takes the same name
        parser.error(f"--figure {args.figure!r}: give a .png path; its numbers go beside it as .json")
    try:
        page = render(root=root)
    except ValueError as err:  # LeaderboardError, and a results file the report loader refuses
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write(page)
    else:
        from lpes_harness.core.files import atomic_write_text

        atomic_write_text(args.out, page)
        print(f"wrote {args.out}")
    if args.figure is not None:
        from lpes_harness.evaluation.leaderboard_figure import write_figure

        numbers = write_figure(Path(args.figure), root=root)
        # with no --out the page went to stdout, so the paths go to stderr
        print(f"wrote {args.figure} and {numbers}", file=sys.stdout if args.out else sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
