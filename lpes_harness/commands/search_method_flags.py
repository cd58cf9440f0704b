"""``lpes-search``'s flags of the search methods other than the GA (``--search-method gradient`` and ``racing``), and
their checks: one line each before anything heavy loads. The stages themselves:
:mod:`lpes_harness.search.gradient_stage` and :mod:`lpes_harness.search.racing_stage`."""

from __future__ import annotations

import argparse

from lpes_harness.search.gradient_stage import FAMILIES

SEARCH_METHODS = ("ga", "gradient", "racing")
LOSSES = ("margin", "gold_logprob")  # lpes_harness.search.gradient.LOSSES, without importing torch here


def add_search_method_flags(parser) -> None:
    grad = parser.add_argument_group("gradient search (--search-method gradient) and racing (--search-method racing)")
    grad.add_argument("--search-method", default="ga", choices=SEARCH_METHODS,
                      help="ga (the paper's genetic search of the Bézier control points), gradient (Adam on the "
                           "factors' logarithms through a differentiable RoPE) or racing (random pairs of lines over "
                           "depth raced by successive halving), the last two on samples drawn over --draw-sentences "
                           "(docs/search_profiles.md). The sweep, uniform.json, the validation and the held-out table "
                           "are the same stages whichever runs")
    grad.add_argument("--family", default="lines", choices=FAMILIES,
                      help="what the gradient moves: lines (default: per axis a straight line over depth, two numbers) "
                           "or per-layer (every layer's factor); within --y-min/--y-max (and --base-y-*)")
    grad.add_argument("--loss", default="margin", choices=LOSSES,
                      help="margin (default): the gold answer's lead over the other needles' values at the first token "
                           "where they part; gold_logprob: minus the gold answer's log-probability")
    grad.add_argument("--lr", type=float, default=0.05, help="Adam's first step in log-factor units (0.05: about 5 %% a step); "
                      "full batch: halved after a step that raises the loss, x1.5 after one that lowers it")
    grad.add_argument("--gradient-samples", type=int, default=16,
                      help="samples a step (full batch), one per drawn condition, gold positions in turns")
    grad.add_argument("--gradient-forwards", type=int, default=384,
                      help="the stage's budget in forwards, a backward counted as two: a step costs 3 x "
                           "--gradient-samples (default 384: 8 steps of 16)")
    grad.add_argument("--draw-sentences", default="60:300", metavar="LOW:HIGH",
                      help="each sample's num_sentences drawn uniformly from LOW to HIGH with --seed (default 60:300); "
                           "'none': every sample at the task's own options (--metadata)")
    grad.add_argument("--draw-needles", default="none", metavar="LOW:HIGH",
                      help="each sample's num_needles drawn from LOW to HIGH too ('none', default: the task's)")
    grad.add_argument("--racing-draws", type=int, default=23,
                      help="racing: line pairs drawn (each axis's first and last factor, log-uniform within --y-min/"
                           "--y-max and --base-y-*, Latin-hypercube spread); the plain model races beside them")
    grad.add_argument("--racing-samples", type=int, default=48,
                      help="racing: the samples the finalists are scored on, one per drawn condition")
    grad.add_argument("--racing-first", type=int, default=8,
                      help="racing: every candidate's first samples; each later rung keeps the better half on twice as "
                           "many (greedy accuracy ranks, --loss breaks ties)")
    grad.add_argument("--every-item", action=argparse.BooleanOptionalAction, default=False,
                      help="racing: ask each sample's prompt about every item it holds (every needle of multi_needle), "
                           "all from one forward of the text they share, and rank by the share answered right: about "
                           "8 questions a forward, most of them about middle needles, where the plain model fails "
                           "(on in racing-smollm2; a task without ask_item is refused)")
    grad.add_argument("--uniform-share", type=float, default=1.0,
                      help="uniform.json is tuned on this share of the search's forwards (default 1: as many)")


def _range(text, flag: str) -> tuple[int, int] | None:
    """``LOW:HIGH`` -> (LOW, HIGH), integers with 1 <= LOW <= HIGH; 'none' -> None."""
    if text is None or str(text).strip().lower() in ("", "none", "off"):
        return None
    parts = str(text).split(":")
    try:
        low, high = (int(v) for v in parts)
    except ValueError:
        raise ValueError(f"--{flag} {text!r}: give LOW:HIGH, two whole numbers, e.g. 60:300, or 'none'") from None
    if not 1 <= low <= high:
        raise ValueError(f"--{flag} {text!r}: need 1 <= LOW <= HIGH")
    return low, high


def check_search_method_settings(args) -> None:
    """The gradient search's and the race's flags, one line each (they are read whatever --search-method says)."""
    args.draw_range = _range(args.draw_sentences, "draw-sentences")
    args.draw_needle_range = _range(args.draw_needles, "draw-needles")
    if args.draw_needle_range and not args.draw_range:
        raise ValueError("--draw-needles draws beside --draw-sentences; give both")
    if not (args.lr > 0 and args.gradient_samples >= 1 and args.gradient_forwards >= 1 and 0 < args.uniform_share <= 1):
        raise ValueError(f"--lr {args.lr} / --gradient-samples {args.gradient_samples} / --gradient-forwards "
                         f"{args.gradient_forwards} / --uniform-share {args.uniform_share}: need lr > 0, samples and "
                         "forwards >= 1, 0 < share <= 1")
    if not (args.racing_draws >= 1 and 1 <= args.racing_first <= args.racing_samples):
        raise ValueError(f"--racing-draws {args.racing_draws} / --racing-first {args.racing_first} / --racing-samples "
                         f"{args.racing_samples}: need draws >= 1 and 1 <= first <= samples")
    if args.every_item and args.search_method == "racing" and not task_asks_items(args.task):
        raise ValueError(f"--every-item: {args.task} cannot ask a prompt about its other items (no ask_item); "
                         "give --no-every-item")
    if args.search_method == "racing" and args.family != "lines":
        raise ValueError("--search-method racing draws lines; --family per-layer is the gradient search's")
    if args.search_method in ("gradient", "racing"):
        if args.brute_force:
            raise ValueError(f"--search-method {args.search_method} moves lines or factors; --brute-force is the GA's "
                             "genome")
        if args.draw_range is not None and "num_sentences" not in _task_options(args.task):
            raise ValueError(f"--draw-sentences: {args.task} has no num_sentences option; give --draw-sentences none")


def task_asks_items(task: str) -> bool:
    """Whether ``task`` can ask a prompt about its other items (``--every-item``)."""
    from lpes_harness.tasks.position import resolve_task

    return resolve_task(task).ask_item is not None


def _task_options(task: str) -> set[str]:
    from lpes_harness.tasks.position import resolve_task

    return set(resolve_task(task).options)
