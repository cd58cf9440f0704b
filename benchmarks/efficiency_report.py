"""``benchmarks/search_efficiency.py``'s report: ``efficiency.md`` (per budget, each method's gain over
its seeds; each method against the demo's search, seed by seed, paired on the same held-out samples)
and ``efficiency.png`` (held-out gain against forwards used), from its ``efficiency.json`` record."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from efficiency_methods import DEFAULT_METHOD, METHODS  # this folder: on sys.path when run as a script


def points(value: float) -> str:
    return f"{100 * value:+.1f}"


def kept_uniform(run: dict) -> str | None:
    """``"uniform 0.8 (PI)"`` when a run's best is one scale on every layer (the start it kept, or
    another uniform scale): no per-layer curve, and its row must say so; else None."""
    scales = run["best"].get("scales") or []
    if scales and len(set(scales)) == 1:
        return f"uniform {scales[0]:g} (PI)"
    return None


def head_to_head(record: dict, cache_path: Path) -> list[dict]:
    """Each method's best against the demo's method's best (``DEFAULT_METHOD``) of the same seed and budget.

    All bests were scored on the same held-out samples (the cache under ``--output``), so two searches
    compare paired, sample by sample: which found the better curve, not only which gained more over
    vanilla. A pair whose scores are not all in the cache is left out."""
    from lpes_harness.evaluation.score_cache import ScoreCache
    from lpes_harness.evaluation.stats import compare_paired

    if not cache_path.is_file():
        return []
    # The file's own identity: the records it holds are read back, not checked against a model
    cache = ScoreCache(cache_path, json.loads(cache_path.read_text(encoding="utf-8"))["identity"])
    count = record["settings"]["heldout_samples"]
    percents = sorted(int(p) for p in cache.fingerprints)

    def scores(scales) -> list[float] | None:
        flat = []
        for percent in percents:
            block = cache.get(scales, percent)[:count]
            if len(block) < count:
                return None
            flat += block
        return flat or None

    runs = {(r["method"], r["seed"], r["budget"]): r for r in record["runs"]}
    rows = []
    for (method, seed, budget), run in runs.items():
        reference = runs.get((DEFAULT_METHOD, seed, budget))
        if method == DEFAULT_METHOD or reference is None:
            continue
        mine, theirs = scores(run["best"]["scales"]), scores(reference["best"]["scales"])
        if mine is None or theirs is None:
            continue
        compared = compare_paired(mine, theirs)
        rows.append({"method": method, "seed": seed, "budget": budget,
                     "same_curve": ScoreCache.key(run["best"]["scales"], 0) == ScoreCache.key(reference["best"]["scales"], 0),
                     **{k: compared[k] for k in ("difference", "difference_interval", "gained", "lost", "p")}})
    return sorted(rows, key=lambda r: (r["budget"], METHODS.index(r["method"]), r["seed"]))


def format_head_to_head(rows: list[dict]) -> list[str]:
    from lpes_harness.evaluation.stats import format_p

    if not rows:
        return []
    seeds = sorted({r["seed"] for r in rows})
    lines = ["", f"## Against the demo's search (`{DEFAULT_METHOD}`), seed by seed", "",
             f"Each method's best minus `{DEFAULT_METHOD}`'s best of the same seed and budget, on the same held-out "
             "samples: points [95 %], samples gained / lost, exact McNemar p. Negative: the demo's search found the "
             "better curve.", "",
             "| budget | method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
             "|---:|---|" + "---|" * len(seeds) + "---:|"]
    for budget, method in sorted({(r["budget"], r["method"]) for r in rows}, key=lambda k: (k[0], METHODS.index(k[1]))):
        mine = {r["seed"]: r for r in rows if r["budget"] == budget and r["method"] == method}
        cells = ["" if (r := mine.get(s)) is None else "the same curve" if r["same_curve"] else
                 f"{points(r['difference'])} [{points(r['difference_interval'][0])}, {points(r['difference_interval'][1])}], "
                 f"{r['gained']} / {r['lost']}, p = {format_p(r['p'])}" for s in seeds]
        mean = statistics.fmean(r["difference"] for r in mine.values())
        lines.append(f"| {budget:,} | {method} | " + " | ".join(cells) + f" | {points(mean)} |")
    return lines


def format_report(record: dict, versus: list[dict] | None = None) -> str:
    """``efficiency.md``: per budget, each method's mean gain over its seeds and each seed's; then, with
    ``versus`` (:func:`head_to_head`), each method against the demo's search seed by seed."""
    from lpes_harness.evaluation.stats import format_p

    settings, runs = record["settings"], record["runs"]
    start = record.get("start")
    lines = [
        "# Search efficiency: held-out gain against search forwards",
        "",
        f"`benchmarks/search_efficiency.py`: {settings['task']} ({json.dumps(settings['metadata'])}), model "
        f"{settings['pretrained'] or 'bundled SmolLM2-135M-Instruct'}, {settings['dtype']}; search fitness "
        f"{settings['fitness']} on {settings['num_samples']} samples per position; held-out: "
        f"{settings['heldout_samples']} samples per position, the same for every run. The uniform start is uniform "
        f"{start:g} (the sweep {settings['sweep']} with the search fitness)" + (" = vanilla." if start == 1 else ".")
        if start is not None else "",
        "",
        "Gains are held-out accuracy differences in points (paired, 95 % interval, exact McNemar p); "
        "the mean is over the seeds run at that budget (their number in `seeds`: a mean over fewer seeds "
        "is not comparable with one over more), [min, max] over the seeds. A seed whose best is one scale on every "
        "layer found no per-layer curve: its row is that uniform scale, PI, and is marked so.",
    ]
    for budget in sorted({r["budget"] for r in runs}):
        lines += ["", f"## Budget {budget:,} forwards", "",
                  "| method | seeds | forwards used (mean) | search fitness (mean) | held-out accuracy (mean) | "
                  "gain over vanilla: mean [min, max] | gain over the start: mean [min, max] | each seed: gain over vanilla [95 %], p |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        for method in METHODS:
            rows = sorted((r for r in runs if r["budget"] == budget and r["method"] == method), key=lambda r: r["seed"])
            if not rows:
                continue
            vs_v = [r["heldout"]["over_vanilla"]["difference"] for r in rows]
            vs_s = [r["heldout"]["over_start"]["difference"] for r in rows]
            seeds = "; ".join(
                f"{r['seed']}{', ' + kept_uniform(r) if kept_uniform(r) else ''}: "
                f"{points(r['heldout']['over_vanilla']['difference'])} "
                f"[{points(r['heldout']['over_vanilla']['difference_interval'][0])}, "
                f"{points(r['heldout']['over_vanilla']['difference_interval'][1])}], "
                f"p = {format_p(r['heldout']['over_vanilla']['p'])}" for r in rows)
            lines.append(
                f"| {method} | {len(rows)} | {statistics.fmean(r['forwards'] for r in rows):,.0f} | "
                f"{statistics.fmean(r['best']['fitness'] for r in rows):.3f} | "
                f"{statistics.fmean(r['heldout']['accuracy'] for r in rows):.3f} | "
                f"{points(statistics.fmean(vs_v))} [{points(min(vs_v))}, {points(max(vs_v))}] | "
                f"{points(statistics.fmean(vs_s))} [{points(min(vs_s))}, {points(max(vs_s))}] | {seeds} |")
    lines += format_head_to_head(versus or [])
    return "\n".join(lines) + "\n"


def plot_report(record: dict, path: Path) -> None:
    """Held-out gain against forwards used: per method its mean per budget, each marked with its number of
    seeds and joined by a line (dashed where the two means hold different seeds), and each seed as a point."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from lpes_harness.core.files import save_figure

    figure = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(figure)
    panels = figure.subplots(1, 2, sharey=True)
    colours = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:green", "tab:red")))
    for axes, key, title in zip(panels, ("over_vanilla", "over_start"), ("over vanilla", "over the uniform start")):
        for method in METHODS:
            rows = [r for r in record["runs"] if r["method"] == method]
            if not rows:
                continue
            axes.scatter([r["forwards"] for r in rows], [100 * r["heldout"][key]["difference"] for r in rows],
                         color=colours[method], alpha=0.45, s=18)
            by_budget = {b: [r for r in rows if r["budget"] == b] for b in sorted({r["budget"] for r in rows})}
            means = [(statistics.fmean(r["forwards"] for r in runs),
                      statistics.fmean(100 * r["heldout"][key]["difference"] for r in runs)) for runs in by_budget.values()]
            axes.plot(*zip(*means), marker="o", linestyle="none", color=colours[method], label=method)
            # A mean over other seeds than the next budget's is not the same searches' progress: the segment
            # between them is dashed, and each mean says how many seeds it holds.
            seed_sets = [{r["seed"] for r in runs} for runs in by_budget.values()]
            for i in range(len(means) - 1):
                same = seed_sets[i] == seed_sets[i + 1]
                axes.plot(*zip(means[i], means[i + 1]), color=colours[method], linestyle="-" if same else "--")
            for (x, y), seeds in zip(means, seed_sets):
                axes.annotate(f"n={len(seeds)}", (x, y), textcoords="offset points", xytext=(5, 4),
                              fontsize=7, color=colours[method])
        axes.axhline(0, color="grey", linewidth=0.8)
        axes.set_xlabel("search forwards used")
        axes.set_title(f"held-out gain {title}")
        axes.grid(alpha=0.3)
    panels[0].set_ylabel("points (mean over n seeds: big dots; seeds: dots)")
    panels[0].plot([], [], color="grey", linestyle="--", label="dashed: means over different seeds")
    panels[0].legend()
    save_figure(figure, path)
