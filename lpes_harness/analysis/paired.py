"""Methods side by side on the same held-out samples: accuracy by position, intervals, paired tests.

    table = compare_methods(lm, "multi_needle", {"vanilla": [1.0] * 30, "PI": pi, "LPES": scales},
                            num_samples=200)
    print(format_table(table)); plot_table(table, "positions.png")

Every method is scored on exactly the same samples (one :class:`PositionScorer`, the scales
changed in place between methods), so each one is compared with the baseline (the first
method, vanilla) per sample: exact McNemar per position, and over all positions pooled for
the average. A difference is marked significant only when p < ``alpha``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.analysis.stats import accuracy_with_interval, compare_paired, format_p

ALPHA = 0.05


def lpes_methods(scales: Sequence[float], uniform: Sequence[float] = ()) -> dict[str, list[float]]:
    """The comparison of a searched curve: vanilla (first: the baseline), PI (its mean, uniform),
    the curve itself, and any extra uniform scales."""
    n = len(scales)
    methods = {"vanilla": [1.0] * n, "PI": [sum(scales) / n] * n, "LPES": list(scales)}
    methods.update({f"uniform {v:g}": [float(v)] * n for v in uniform})
    return methods


def score_methods(lm, task: str, methods: Mapping[str, Sequence[float]], *, num_samples: int, split: str = "heldout",
                  metadata=None, chat_template=None, mode: str = "greedy", progress=None) -> dict:
    """Per-sample scores of each method at each gold position: {method: {percent: [0/1, ...]}}."""
    from lpes_harness.search.fitness import PositionScorer
    from lpes_harness.tasks.position import resolve_task

    percents = list(resolve_task(task).positions)
    scorer = PositionScorer(lm, task, percents, metadata=metadata, split=split, num_samples=num_samples,
                            mode=mode, chat_template=chat_template)
    previous = list(lm.scales)
    scores: dict[str, dict[int, list[float]]] = {}
    try:
        for name, scales in methods.items():
            lm.set_scales(list(scales))
            scores[name] = {}
            for percent in percents:
                indices = list(range(len(scorer.docs[percent])))
                scores[name][percent] = scorer.scores(percent, indices)
                if progress is not None:
                    progress(name, percent)
    finally:
        lm.set_scales(previous)
    return {
        "task": task, "split": split, "num_samples": num_samples, "mode": mode,
        "chat_template": scorer.chat_template, "metadata": dict(metadata or {}),
        "methods": {name: list(s) for name, s in methods.items()}, "scores": scores,
    }  # fmt: skip


def paired_table(scored: Mapping, baseline: str | None = None, alpha: float = ALPHA) -> dict:
    """Accuracy with 95 % intervals per method and position, and paired tests against ``baseline``."""
    scores = {name: {int(p): list(v) for p, v in by_pos.items()} for name, by_pos in scored["scores"].items()}
    names = list(scores)
    baseline = baseline or names[0]
    if baseline not in scores:
        raise ValueError(f"baseline {baseline!r} is not among the methods {names}")
    percents = sorted(scores[baseline])
    rows = {}
    for name in names:
        row = {}
        for percent in percents + ["average"]:
            if percent == "average":  # equal samples per position: the pooled mean is the average
                mine = [v for p in percents for v in scores[name][p]]
                base = [v for p in percents for v in scores[baseline][p]]
            else:
                mine, base = scores[name][percent], scores[baseline][percent]
            cell = accuracy_with_interval(mine)
            if name != baseline:
                test = compare_paired(mine, base)
                cell.update({k: test[k] for k in ("difference", "gained", "lost", "p")})
                cell["significant"] = test["p"] < alpha
            row[str(percent)] = cell
        worst = min(percents, key=lambda p: row[str(p)]["accuracy"])
        row["worst"] = {"position": worst, "accuracy": row[str(worst)]["accuracy"]}
        rows[name] = row
    return {"baseline": baseline, "positions": percents, "alpha": alpha, "rows": rows,
            **{k: scored[k] for k in ("task", "split", "num_samples", "mode", "chat_template") if k in scored}}


def format_table(table: Mapping) -> str:
    """Markdown: accuracy [95 % interval] by position; Δ vs the baseline with gains/losses and p."""
    positions = [str(p) for p in table["positions"]] + ["average"]
    head = "| method | " + " | ".join(f"{p} %" if p != "average" else "average" for p in positions) + " | worst |"
    lines = [head, "|---|" + "---:|" * (len(positions) + 1)]
    for name, row in table["rows"].items():
        cells = []
        for p in positions:
            cell = row[p]
            low, high = cell["interval"]
            text = f"{cell['accuracy']:.3f} [{low:.2f}, {high:.2f}]"
            if "p" in cell:
                sign = "+" if cell["difference"] >= 0 else "−"
                text += f"<br>{sign}{abs(cell['difference']) * 100:.1f} pts, +{cell['gained']}/−{cell['lost']}, p={format_p(cell['p'])}"
                if cell["significant"]:
                    text = f"**{text}**"
            cells.append(text)
        worst = row["worst"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {worst['accuracy']:.3f} ({worst['position']} %) |")
    lines.append("")
    lines.append(
        f"{table.get('task', '')} {table.get('split', '')} split, {table.get('num_samples', '?')} samples per position, "
        f"the same samples for every method. [..]: 95 % Wilson interval. Second line: difference from "
        f"{table['baseline']}, samples gained/lost, exact McNemar p; bold: p < {table['alpha']}."
    )
    return "\n".join(lines)


def format_plain(table: Mapping) -> str:
    """A compact terminal table (what ``make demo`` and the end of a search print)."""
    positions = [str(p) for p in table["positions"]] + ["average"]
    width = max(10, *(len(name) for name in table["rows"]))
    lines = [f"{'method':<{width}} " + " ".join(f"{p + ('%' if p != 'average' else ''):>21}" for p in positions)]
    for name, row in table["rows"].items():
        cells = []
        for p in positions:
            cell = row[p]
            low, high = cell["interval"]
            cells.append(f"{cell['accuracy']:.2f} [{low:.2f},{high:.2f}]".rjust(21))
        lines.append(f"{name:<{width}} " + " ".join(cells))
        if any("p" in row[p] for p in positions):
            tests = []
            for p in positions:
                cell = row[p]
                mark = "*" if cell["significant"] else " "
                tests.append(f"{cell['difference'] * 100:+.1f} p={format_p(cell['p'])}{mark}".rjust(21))
            lines.append(f"{'  vs ' + table['baseline']:<{width}} " + " ".join(tests))
    lines.append(f"[..] 95 % Wilson interval; vs {table['baseline']}: difference in points and exact McNemar p "
                 f"on the same samples (* p < {table['alpha']})")
    return "\n".join(lines)


def plot_table(table: Mapping, path: str | Path) -> Path:
    """Accuracy by gold position with 95 % intervals, one line per method (:func:`lpes_harness.plots.plot_paired`)."""
    from lpes_harness.plots import plot_paired

    path = Path(path)
    plot_paired(table, path)
    return path


def write_comparison(table: Mapping, scored: Mapping, directory: str | Path, stem: str = "heldout") -> dict:
    """``<stem>.json`` (per-sample scores and the table), ``<stem>.md`` and ``<stem>.png``."""
    from lpes_harness.files import atomic_write_json

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_json(directory / f"{stem}.json", {"table": table, "scored": scored})
    (directory / f"{stem}.md").write_text(format_table(table) + "\n", encoding="utf-8")
    plot_table(table, directory / f"{stem}.png")
    return {"json": directory / f"{stem}.json", "md": directory / f"{stem}.md", "png": directory / f"{stem}.png"}


def scores_from_lm_eval(results: Mapping, task: str) -> dict[int, list[float]]:
    """Per-sample scores by gold position from lm-eval results run with ``log_samples=True``.

    Ordered by ``doc_id``, so two runs over the same split pair up sample by sample.
    """
    from lpes_harness.tasks.position import resolve_task

    position_task = resolve_task(task)
    samples = results.get("samples") or {}
    by_position = {}
    for percent in position_task.positions:
        name = position_task.subtask_name(percent)
        if name not in samples:
            raise ValueError(f"no logged samples for {name}: run lm-eval with log_samples=True (--log_samples)")
        logged = sorted(samples[name], key=lambda s: s["doc_id"])
        by_position[percent] = [float(s[position_task.metric_name]) for s in logged]
    return by_position


def load_comparison(path: str | Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def main(argv=None) -> None:
    """``python -m lpes_harness.analysis.paired --scales run/scales.json``: re-evaluate searched scales."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m lpes_harness.analysis.paired",
        description="Vanilla, PI and searched scales (and any uniform scales) on the same held-out samples of a "
                    "position task: accuracy by position with 95 %% intervals, exact McNemar p against vanilla.",
    )
    parser.add_argument("--scales", required=True, help="a scales file written by a search (scales.json)")
    parser.add_argument("--task", default="multi_needle", help="a registered position task (default multi_needle)")
    parser.add_argument("--num-samples", type=int, default=200, help="held-out samples per position (default 200)")
    parser.add_argument("--metadata", default="{}", help="task options as JSON; a new 'seed' gives fresh samples")
    parser.add_argument("--uniform", default="", help="extra uniform scales to compare, e.g. 0.8,1.2")
    parser.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--pretrained", default=None, help="HF id, local dir or .gguf (default: bundled SmolLM2)")
    parser.add_argument("--dtype", default=None, help="default: the dtype recorded in the scales file, else float32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", required=True, help="directory for heldout.{json,md,png}")
    args = parser.parse_args(argv)

    from lpes_harness.scales_file import read_scales_file

    try:
        metadata = json.loads(args.metadata)
        scales = read_scales_file(args.scales)
        uniform = [float(v) for v in args.uniform.split(",") if v.strip()]
    except (ValueError, OSError) as err:
        parser.error(str(err))
    if not isinstance(metadata, dict) or args.num_samples < 1 or any(v <= 0 for v in uniform):
        parser.error("--metadata must be a JSON object, --num-samples >= 1 and --uniform scales > 0")
    recorded = json.loads(Path(args.scales).read_text()) if Path(args.scales).is_file() else {}
    dtype = args.dtype or (recorded.get("dtype") if isinstance(recorded, dict) else None) or "float32"
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from lpes_harness.lm import LPESLM

    lm = LPESLM(pretrained=args.pretrained, dtype=dtype)
    methods = lpes_methods(scales, uniform)
    chat = {"auto": None, "on": True, "off": False}[args.chat_template]
    scored = score_methods(lm, args.task, methods, num_samples=args.num_samples, metadata=metadata,
                           chat_template=chat)
    scored.update({"scales_file": str(args.scales), "dtype": dtype})
    table = paired_table(scored)
    files = write_comparison(table, scored, args.output)
    print(format_plain(table))
    print(f"written: {files['md']}, {files['json']}, {files['png']}")


if __name__ == "__main__":
    main()
