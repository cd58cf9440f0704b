"""What a run pays before its first forward: the model load and lm-eval's task index, side by side.

    python benchmarks/model_load.py [--models smollm2,gemma3-270m] [--repeats 2]

For each packaged model that is installed, in one process, with a cache folder of its own:

- ``gguf``: ``from_pretrained(gguf_file=...)`` for the tokenizer and the model, as transformers
  reads a GGUF (every load parses and dequantizes the file);
- ``first load``: :func:`lpes_harness.core.models.load_causal_lm` with an empty cache, which converts
  the GGUF and saves the folder (:mod:`lpes_harness.core.gguf_cache`), once;
- ``cached``: ``load_causal_lm`` again, which reads the saved folder.

Then lm-eval's ``TaskManager`` as the position scorer builds it (our task folder only) and as
lm-eval's default (its ~14,000 task files and ours). Times are medians of ``--repeats`` runs
(the first load: one run); the ratios are printed beside them. Say which CPU the numbers come
from: the output's first line names it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def timed(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def model_rows(name: str, repeats: int) -> list[tuple[str, float]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lpes_harness.core.models import BundledModelMissing, load_causal_lm, resolve_pretrained

    try:
        directory, gguf_file = resolve_pretrained(name)
    except BundledModelMissing as err:
        print(f"{name}: skipped ({err})")
        return []

    def gguf():
        AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
        AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32)

    rows = [(f"{name}: gguf", timed(gguf, repeats))]
    rows.append((f"{name}: first load (converts)", timed(lambda: load_causal_lm(name), 1)))
    rows.append((f"{name}: cached", timed(lambda: load_causal_lm(name), repeats)))
    return rows


def task_index_rows(repeats: int) -> list[tuple[str, float]]:
    from lm_eval.tasks import TaskManager

    from lpes_harness.tasks import TASKS_DIR

    ours = timed(lambda: TaskManager(include_path=str(TASKS_DIR), include_defaults=False), repeats)
    everything = timed(lambda: TaskManager(), repeats)
    return [("TaskManager: lm-eval's default (its tasks and ours)", everything),
            ("TaskManager: our task folder only (the position scorer's)", ours)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2,gemma3-270m", help="packaged model names, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="lpes-load-bench-") as cache:
        os.environ["LPES_CACHE_DIR"] = cache  # an empty cache, so the first load converts
        import torch

        from lpes_harness.lmeval.startup import install
        from lpes_harness.core.models import machine_description

        install()  # our tasks in lm-eval's default index, as in a user's run (the .pth hook does the same)

        torch.set_num_threads(os.cpu_count() or 1)
        print(machine_description(), flush=True)
        rows = [row for name in args.models.split(",") for row in model_rows(name.strip(), args.repeats)]
        rows += task_index_rows(args.repeats)
    width = max(len(label) for label, _ in rows)
    for label, seconds in rows:
        print(f"{label:<{width}}  {seconds:7.2f} s")
    for name in args.models.split(","):
        found = dict(rows)
        if f"{name}: cached" in found:
            print(f"{name}: a cached load takes {found[f'{name}: cached'] / found[f'{name}: gguf']:.3f}x a GGUF load")
    ours, everything = rows[-1][1], rows[-2][1]
    print(f"TaskManager: our folder takes {ours / everything:.3f}x lm-eval's default index")
    return 0


if __name__ == "__main__":
    sys.exit(main())
