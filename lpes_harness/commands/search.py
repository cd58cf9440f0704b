"""The search command (``lpes-search``, or ``python searches/ga.py``): parses, then runs the stages of :mod:`lpes_harness.search.run`.

The flags, profiles and input checks are in :mod:`lpes_harness.commands.search_cli`; the timing, estimate and
``--time-budget`` in :mod:`lpes_harness.search.timing`.

Everything a run makes goes to ``--output`` (default ``results/<run-name>/``):

- ``scales.json``       the best layer scales so far (``lpes_hf scales=<path>`` reads it);
- ``config.json``       every setting of the run, and the command line;
- ``history.jsonl``     every individual: genome, scales, per-position scores, fitness, time;
- ``generations.jsonl`` best / mean fitness and smoothness per generation;
- ``curve.png``          the best curve after each generation, and at the end the run's curve (the
                        validation's choice, which may be a uniform factor); ``fitness.png``;
- ``checkpoint.json``   the full search state at every generation's end, and ``checkpoint.jsonl``
                        one line per individual since (``--resume`` reads both);
- ``sweep.json``        the uniform sweep, and while it runs ``sweep.jsonl``, one line per point.

``config.json`` is written once the model is loaded, before the sweep: from then on the folder
holds a run that ``--resume --output DIR`` continues with the settings recorded there
(``"settings"``, :func:`lpes_harness.search.run_record.settings_record`) and checks against the
recorded fingerprint; nothing scored is lost to a kill (sweep points, individuals and held-out
blocks are each on disk as soon as they are scored).
"""

from __future__ import annotations

import os
import sys
from lpes_harness.commands.search_cli import parse_args
from lpes_harness.search.run_record import RUN_RECORD, fail, run_folder
from lpes_harness.search.run import run


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    if args.status:
        from lpes_harness.search.status import run_status

        try:
            print("\n".join(run_status(run_folder(args))))
        except ValueError as err:
            fail(str(err))
        return
    try:
        run(args)
    except KeyboardInterrupt:  # Ctrl-C on an hours-long run: say what is kept, not a traceback
        folder = run_folder(args)
        kept = (f"what was scored is kept: lpes-search --resume --output {folder} continues it"
                if (folder / RUN_RECORD).is_file() else f"nothing was written to {folder}")
        print(f"\nlpes-search: interrupted; {kept}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
