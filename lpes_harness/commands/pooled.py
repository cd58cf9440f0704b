"""Rows of several held-out tables pooled into one paired test: "does the curve help over all conditions?".

    python -m lpes_harness.commands.pooled results/robust_smollm2_heldout/{1x_length,16_needles,2x_length,180_sentences} \\
        --against vanilla --against 'uniform 1:0.75 (PI) robust-uniform' --row 'LPES robust'

Each argument is a folder (or its ``heldout.json``) written by ``commands.paired`` or
``commands.transfer``: one condition, every row scored on the same samples. A row is pooled over
every position of every table, sample by sample against another row of the same tables, so the
test stays paired (exact McNemar on all discordant samples, the Wald interval of the
difference). Tables of the same samples (same task, split and options) are refused: pooling
them would count a sample twice and shrink the interval for nothing. A row missing from a table
is refused too, rather than pooled over fewer conditions than the command names.
"""

from __future__ import annotations

import argparse
import sys
from lpes_harness.commands import flags
from lpes_harness.evaluation.pooled import as_json, format_results, load_table, pool, shared_rows


def main(argv=None) -> None:
    parser = flags.CommandParser(prog="python -m lpes_harness.commands.pooled", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="+", metavar="TABLE", help="a held-out table's folder or heldout.json")
    parser.add_argument("--against", action="append", metavar="ROW",
                        help="the row every other row is compared with; repeatable (default: vanilla)")
    parser.add_argument("--row", action="append", metavar="ROW",
                        help="a row to pool; repeatable (default: every row all tables share)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    try:
        tables = [load_table(path) for path in args.tables]
        rows = args.row or shared_rows(tables)
        results = pool(tables, rows, args.against or ["vanilla"])
    except ValueError as err:
        parser.error(str(err))
    print(format_results(results, tables))
    if args.json:
        from lpes_harness.core.files import atomic_write_json

        atomic_write_json(args.json, as_json(results, tables), indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
