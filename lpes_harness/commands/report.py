"""``lpes-report``: lm-eval results JSON files (+ a search's ``history.jsonl``) -> ``report.md`` and PNGs.

    python -m lpes_harness.commands.report vanilla=runs/vanilla lpes=runs/lpes --history search/history.jsonl --out results/

Each positional argument is ``[METHOD=]PATH``: a results JSON written by ``lm_eval
--output_path`` or a folder searched for ``results*.json``. Several files of one method
(e.g. one per suite) are merged; a task run in parts over different documents (``lm_eval
--samples``, e.g. the rest of a ``--limit`` run) is joined from its logged samples. Without ``METHOD=`` the method is the given folder's name, or
the file's name.

Written into ``--out``:

- ``report.md``: the methods, each with its label and description from the table of methods
  (:data:`lpes_harness.methods.METHODS`) where lm-eval ran one of ours; paper-style tables (methods x tasks, in percent): position tasks by gold
  position, each cell with its 95 % Wilson interval (from lm-eval's sample counts) and, where
  the runs were made with ``--log_samples``, the difference from the baseline method (``vanilla``
  if given, else the first) with an exact McNemar p on the same samples; only a significant
  difference is bold. Then MMLU / C-Eval by category, L-Eval, ZeroSCROLLS (summaries scored by
  the geometric mean of ROUGE-1/2/L, as ZeroSCROLLS does; single-reference F1 marked with a
  dagger), and every other task's metrics; these are not tested, so nothing there is bold;
- ``position_<task>.png``: accuracy by gold position, one line per method;
- ``scales.png``: each method's layer scales (from ``config.lpes_scales`` in its results, the
  search's best individual, or ``--scales NAME=FILE``);
- ``search.png``: best and mean fitness and smoothness by generation (``--history``);
- with ``--keep-samples``, what a committed record needs to be re-checked without the run's
  output folder: each method's results file(s) as ``results_<method>[_<n>].json``, and
  ``per_sample.json`` (method -> subtask -> doc_id -> metrics, doc hash and answer; the prompts,
  which the tasks regenerate, left out).

Reading the results is :mod:`lpes_harness.evaluation.results_files`, the tables are
:mod:`lpes_harness.evaluation.report_tables`, writing the report is :mod:`lpes_harness.evaluation.report`;
this module is the command line.
"""

from __future__ import annotations

from collections.abc import Sequence

from lpes_harness.commands import flags
from lpes_harness.evaluation.report import write_report
from lpes_harness.evaluation.search_history import ReportError


def main(argv: Sequence[str] | None = None) -> int:
    parser = flags.CommandParser(prog="lpes-report", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="[METHOD=]PATH: an lm-eval results JSON file or a folder of them")
    parser.add_argument("--out", default="report", help="output folder (default: ./report)")
    parser.add_argument("--history", default=None, help="a search's history.jsonl: fitness and smoothness by generation")
    parser.add_argument("--scales", action="append", default=[], help="NAME=FILE: another scales curve to plot (repeatable)")
    parser.add_argument("--title", default="LPES report")
    parser.add_argument("--baseline", default=None, metavar="METHOD",
                        help="the method every other is tested against (default: vanilla if given, else the first), "
                             "e.g. a PI or tuned-baseline row to test a curve against it on the same samples")
    parser.add_argument("--keep-samples", action="store_true",
                        help="also copy each method's results file(s) and write per_sample.json (metrics, doc hash "
                             "and answer per logged sample) into --out, for a record that outlives the run's folder")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.results, args.out, args.history, args.scales, args.title, args.keep_samples, args.baseline)
    except (ReportError, OSError, ValueError) as err:  # ValueError: a malformed scales file
        parser.error(str(err))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
