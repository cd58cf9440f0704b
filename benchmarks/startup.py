"""Start-up cost of the lm-eval registration hook.

The ``.pth`` file makes every Python start import ``lpes_harness.lmeval.startup``. This
measures, in one run:

- the wall time of ``python -c pass`` (median of N runs; target < 20 ms), and
- the hook's own import time, from ``python -X importtime -c pass``;
- that neither torch nor lm-eval is imported at start-up;
- the wall time of a fresh process that imports lpes-search's settings check
  (``lpes_harness.search.validate``), the check's whole cost before a search loads anything (it was
  under 1.5 s; tests/test_search_validate.py checks that it imports no model library).

    python benchmarks/startup.py [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def wall_time_ms(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append((time.perf_counter() - start) * 1000)
    return times


def search_check_ms(runs: int) -> list[float]:
    code = "import lpes_harness.search.validate"
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append((time.perf_counter() - start) * 1000)
    return times


def hook_import_us() -> int:
    """Cumulative import time of lpes_harness modules at start-up, in microseconds."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, check=True)
    total = 0
    for line in done.stderr.splitlines():
        # "import time:      self [us] |  cumulative | imported package"
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line.split(":", 1)[1].split("|"))
        if name.strip() == "lpes_harness.lmeval.startup" or name.strip() == "lpes_harness":
            total += int(cumulative)
    return total


def heavy_modules_at_start_up() -> list[str]:
    code = "import sys; print(','.join(m for m in ('torch', 'lm_eval', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in done.stdout.strip().split(",") if m]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    wall_time_ms(3)  # warm the file cache
    times = wall_time_ms(args.runs)
    hook = statistics.median(hook_import_us() for _ in range(5))
    heavy = heavy_modules_at_start_up()
    check = search_check_ms(max(3, args.runs // 3))
    print(f"python -c pass: median {statistics.median(times):.1f} ms (min {min(times):.1f}, max {max(times):.1f}, n={args.runs})")
    print(f"lpes_harness start-up hook import: {hook / 1000:.2f} ms")
    print(f"heavy modules imported at start-up: {heavy or 'none'}")
    print(f"lpes-search settings check, a fresh process: median {statistics.median(check):.0f} ms (n={len(check)})")
    print(f"startup: {statistics.median(times):.1f} ms hook: {hook / 1000:.2f} ms (target < 20 ms)")


if __name__ == "__main__":
    main()
