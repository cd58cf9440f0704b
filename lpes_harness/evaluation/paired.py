"""Methods side by side on the same held-out samples: accuracy by position, intervals, paired tests.

The command: :mod:`lpes_harness.commands.paired`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
from collections.abc import Mapping, Sequence

from lpes_harness.core.models import choose_dtype, default_device, positive_int
from lpes_harness.core.scaling import DEFAULT, SCALINGS, cache_scaling
from lpes_harness.methods.setup import MethodSetup


def lpes_methods(scales: Sequence[float], uniform: Sequence = (), held_layers: Sequence[int] = (),
                 scaling: str = DEFAULT, position_held_layers: Sequence[int] = ()) -> dict[str, MethodSetup]:
    """The comparison of a searched curve, as rows of factors for the loaded ``lpes_hf``: vanilla (first:
    the baseline), PI (its mean, uniform), the curve itself, and any extra uniform scales.

    ``held_layers`` (a search's ``--layer-type``: Gemma-3's sliding-window layers) stay at 1 in the
    PI and uniform rows too, which move the layers the curve could move, as the search's sweep
    did: PI is the curve's mean over those layers, not over the held 1s, which say nothing of it.

    ``scaling="both"``: ``scales`` is the flat 2L list (positions, then bases); PI puts each half's
    mean on its half, and each ``uniform`` entry is a ``(position, base)`` pair.
    ``position_held_layers`` (``both`` only, ``--position-layer-type``) stay at 1 in the position half
    alone: PI and uniform rows move each half's own layers.
    """
    kind = SCALINGS[scaling]
    curves = kind.halves(scales)
    n = len(curves[0])
    held = kind.held_per_half(held_layers, position_held_layers)
    moved = [[layer for layer in range(n) if layer not in half_held] for half_held in held]
    if not all(moved):
        raise ValueError(f"every layer is held at 1 (held layers {sorted(set().union(*held))}): nothing is left to scale")

    def uniform_row(values: Sequence[float]) -> list[float]:
        return [1.0 if layer in half_held else float(value)
                for value, half_held in zip(values, held) for layer in range(n)]

    pi = [sum(curve[layer] for layer in half_moved) / len(half_moved) for curve, half_moved in zip(curves, moved)]
    rows = {"vanilla": kind.identity(n), "PI": uniform_row(pi), "LPES": scales}
    rows.update({uniform_name(value, scaling): uniform_row(uniform_values(value, scaling)) for value in uniform})
    return {name: MethodSetup.of_scales(row) for name, row in rows.items()}


def uniform_values(value, scaling: str) -> tuple[float, ...]:
    """A uniform row's factor(s): one number, or under scaling both a ``(position, base)`` pair."""
    kind = SCALINGS[scaling]
    if not kind.paired:
        return (float(value),)
    if isinstance(value, (int, float, str)) or len(value) != kind.per_layer:
        raise ValueError(f"uniform {value!r}: a uniform row of scaling {scaling} is a ({', '.join(kind.axes)}) pair, "
                         "e.g. 1.2:1 or 1:2")
    return tuple(float(v) for v in value)


def uniform_name(value, scaling: str = DEFAULT) -> str:
    """The row name of a uniform factor: ``uniform 1.2``; under scaling base ``uniform base 2`` (a table may
    hold a position row beside it); under scaling both ``uniform 1.2:2`` (position:base)."""
    prefix = "" if SCALINGS[scaling].moves_positions else f"{scaling} "  # a position row is the plain "uniform"
    return f"uniform {prefix}" + ":".join(f"{v:g}" for v in uniform_values(value, scaling))


def parse_uniform(text: str, scaling: str = DEFAULT) -> list:
    """``--uniform``: ``0.8,1.2``; under scaling both ``P:B`` pairs, e.g. ``1.2:1,1:2``. Each factor > 0."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    kind = SCALINGS[scaling]
    try:
        values = [tuple(float(v) for v in item.split(":")) if kind.paired else float(item) for item in items]
        for value in values:
            uniform_values(value, scaling)
    except ValueError as err:
        form = (f"{':'.join(a[0].upper() for a in kind.axes)} pairs ({':'.join(f'{a} factor' for a in kind.axes)}), "
                "e.g. 1.2:1,1:2") if kind.paired else "numbers, e.g. 0.8,1.2"
        raise ValueError(f"--uniform {text!r}: give {form} ({err})") from None
    if any(v <= 0 for value in values for v in uniform_values(value, scaling)):
        raise ValueError(f"--uniform {text!r}: every factor must be > 0")
    return values


def several_lpes_methods(curves: Mapping[str, Sequence[float]], with_pi: bool | Sequence[str] = True,
                         uniform: Sequence = (), held_layers: Sequence[int] = (),
                         scaling: str = DEFAULT, position_held_layers: Sequence[int] = ()) -> dict[str, MethodSetup]:
    """Vanilla, then each named curve as ``LPES <name>`` (and its ``PI <name>``): several searches on one sample set.

    ``with_pi``: every curve gets its PI row (True), none (False), or only the named curves.
    ``held_layers``: as in :func:`lpes_methods`, for every PI and uniform row; ``scaling`` and
    ``position_held_layers`` too.
    """
    pi_for = set(curves) if with_pi is True else set(with_pi or ())
    if pi_for - set(curves):
        raise ValueError(f"PI asked for unknown curves {sorted(pi_for - set(curves))}; the curves are {list(curves)}")
    size = len(next(iter(curves.values())))
    if any(len(c) != size for c in curves.values()):
        raise ValueError(f"the curves have different numbers of layers: { {k: len(c) for k, c in curves.items()} }")
    kind = SCALINGS[scaling]
    n = size // kind.per_layer
    if any(not 0 <= layer < n for layer in (*held_layers, *position_held_layers)):
        raise ValueError(f"held layers {sorted({*held_layers, *position_held_layers})} are not all among the "
                         f"curves' {n} layers")
    held = {"held_layers": held_layers, "scaling": scaling, "position_held_layers": position_held_layers}
    flat = {name: kind.uniform_factor(scales, held_layers, position_held_layers) for name, scales in curves.items()}
    if len(curves) == 1 and pi_for and flat[next(iter(curves))] is None:
        return lpes_methods(next(iter(curves.values())), uniform, **held)
    methods = {"vanilla": MethodSetup.of_scales(kind.identity(n))}
    for name, scales in curves.items():
        single = lpes_methods(scales, **held)
        suffix = "" if name == "LPES" else f" {name}"  # one unnamed curve: plain "LPES", not "LPES LPES"
        if flat[name] is not None:  # a search whose best was a uniform factor: that is PI, not LPES
            methods[f"{uniform_name(flat[name], scaling)} (PI){suffix}"] = MethodSetup.of_scales(scales)
            continue
        if name in pi_for:
            methods[f"PI{suffix}"] = single["PI"]
        methods[f"LPES{suffix}"] = MethodSetup.of_scales(scales)
    methods.update({name: row for name, row in lpes_methods(kind.identity(n), uniform, **held).items()
                    if name.startswith("uniform ")})
    return methods


CHUNK = 10  # samples scored between two cache writes: a killed run loses at most this many forwards
CACHE_FILE = "scores.cache.json"


def cache_identity(task: str, metadata, chat_template: str, pretrained: str | None, dtype: str,
                   scaling: str = DEFAULT) -> dict:
    """What held-out scores depend on, as a :class:`ScoreCache` records it. The search's own
    held-out table and this command build it alike, so either reuses the other's scores.

    Scores are keyed by scales, which mean other RoPEs under ``scaling="base"``: such a cache says so
    (and is refused by a position run); position caches keep their old identity, and share it with
    ``both`` runs, whose keys are the factors' canonical form (:meth:`lpes_harness.core.scaling.Scaling.canonical`:
    a both curve with base factors 1 is keyed as its position curve, the very same model)."""
    identity = {"task": task, "split": "heldout", "metadata": dict(metadata or {}), "chat_template": chat_template,
                "mode": "greedy", "pretrained": pretrained, "dtype": dtype}
    if cache_scaling(scaling):  # a both curve is keyed by its factors' canonical form, which position curves share
        identity["scaling"] = cache_scaling(scaling)
    return identity


@contextlib.contextmanager
def sample_bar(total: int, disable: bool | None = None):
    """A tqdm bar over scored samples; yields the ``progress`` callback of :func:`score_methods`."""
    import sys

    from tqdm.auto import tqdm

    # tqdm's own default (disable=None) goes silent when stderr is not a terminal, and a long run
    # sent to a log file then says nothing for an hour: there it writes a line a minute instead.
    logged = disable is None and not sys.stderr.isatty()
    # Cached samples count at once; the low smoothing lets the rate settle on the scored ones.
    bar = tqdm(total=total, desc="scoring", unit="sample", smoothing=0.05, disable=False if logged else disable,
               mininterval=60 if logged else 0.1)

    def progress(name, percent, count):
        bar.set_postfix_str(f"{name} @ {percent} %", refresh=False)
        bar.update(count)

    try:
        yield progress
    finally:
        bar.close()


def score_methods(lm, task: str, methods: Mapping[str, MethodSetup], *, num_samples: int, split: str = "heldout",
                  metadata=None, chat_template=None, mode: str = "greedy", progress=None, cache=None,
                  load_baseline=None, batch_size=1) -> dict:
    """Per-sample scores of each row at each gold position: {row name: {percent: [0/1, ...]}}, in
    the order of ``methods`` (row name -> :class:`~lpes_harness.methods.setup.MethodSetup`).

    ``cache`` (a :class:`ScoreCache`) keeps the scores every :data:`CHUNK` samples: a killed run
    resumes where it stopped, and a later run on the same samples reuses what it shares
    (vanilla, above all) instead of scoring it again. A run with more samples scores only the
    new ones: held-out samples are numbered, so 200 begin with the earlier 100.
    ``progress(name, percent, count)`` is told of every ``count`` samples done, cached ones included.

    A row of scales is set on ``lm`` (the loaded ``lpes_hf``), in place. A row of another lm-eval model
    (a baseline) is loaded by ``load_baseline(setup)``, one at a time, only when a block is missing. It is scored on the
    very same prompts (the scorer is shared, only its model changes) through lm-eval's own
    ``loglikelihood``: the path ``lm_eval --model mspoe_hf`` takes, which the fast shared-prefix
    scorer of ``lpes_hf`` is tested to agree with.
    """
    from lpes_harness.lmeval.position_scorer import PositionScorer
    from lpes_harness.tasks.position import resolve_task

    percents = list(resolve_task(task).positions)
    scorer = PositionScorer(lm, task, percents, metadata=metadata, split=split, num_samples=num_samples,
                            mode=mode, chat_template=chat_template, batch_size=batch_size)
    scores = score_rows(scorer, methods, num_samples, cache=cache, progress=progress, load_baseline=load_baseline)
    return {
        "task": task, "split": split, "num_samples": num_samples, "mode": mode,
        "chat_template": scorer.chat_template, "metadata": dict(metadata or {}),
        "methods": {name: setup.recorded for name, setup in methods.items()},
        "scores": scores,
    }  # fmt: skip


def score_rows(scorer, methods: Mapping[str, MethodSetup], count: int, *, cache=None, progress=None,
               load_baseline=None) -> dict[str, dict[int, list[float]]]:
    """:func:`score_methods`'s scores on a scorer already built (its task loaded once), for the first ``count``
    samples of each position of its split: a caller that scores many rows on growing counts (a race) builds
    the scorer once, for the most samples it will need."""
    lm, batch_size = scorer.lm, scorer.batch_size
    percents = list(scorer.docs)
    chunk = max(CHUNK, batch_size) if isinstance(batch_size, int) else CHUNK
    report = progress or (lambda name, percent, count: None)
    previous = list(lm.scales)
    scores: dict[str, dict[int, list[float]]] = {}
    try:
        for name, setup in methods.items():
            done = functools.partial(report, name)
            if not setup.is_scaled:
                with _scored_by(scorer, setup, percents, cache, load_baseline, count):
                    scores[name] = _fill(scorer, setup.spec, percents, cache, done, chunk, count)
                continue
            lm.set_scales(list(setup.scales))
            key = SCALINGS[lm.scaling].canonical(setup.scales)  # a both curve with base factors 1 is its position curve
            scores[name] = _fill(scorer, key, percents, cache, done, chunk, count)
    finally:
        lm.set_scales(previous)
    return scores


def _fill(scorer, method, percents, cache, report, chunk: int = CHUNK, count: int | None = None) -> dict[int, list[float]]:
    """Every sample's score at each of ``percents`` for ``method`` (scales or a baseline's spec).

    What the cache lacks is scored about ``chunk`` samples at a time, each chunk saved before the
    next. A chunk holds the same samples at every position: a sample's prompts are the same text
    but where the gold item sits, and the scorer runs the text they share once
    (:meth:`PositionScorer.scores_at`). ``report(percent, count)`` is told of every count done.
    ``count``: the first so many samples of each position (None: all the scorer has).
    """
    docs = {percent: scorer.docs[percent][:count] for percent in percents}
    known = {percent: cache.get(method, percent, docs[percent]) if cache is not None else [] for percent in percents}
    for percent in percents:
        report(percent, len(known[percent]))
    per_position = max(1, math.ceil(chunk / len(percents)))
    while any(len(known[p]) < len(docs[p]) for p in percents):
        todo = {p: list(range(len(known[p]), min(len(known[p]) + per_position, len(docs[p])))) for p in percents}
        new = scorer.scores_at({p: indices for p, indices in todo.items() if indices})
        for percent, scores in new.items():
            known[percent] = known[percent] + scores
            if cache is not None:
                cache.put(method, percent, docs[percent], known[percent])
            report(percent, len(scores))
    return known


@contextlib.contextmanager
def _scored_by(scorer, baseline: MethodSetup, percents, cache, load_baseline, count: int | None = None):
    """The shared scorer with ``baseline``'s model in place of the scaled one, through lm-eval's
    ``loglikelihood``; not loaded at all (25 s for the bundled model) when the cache has every block
    (of the first ``count`` samples of each position; None: all)."""
    if cache is not None and all(len(cache.get(baseline.spec, p, scorer.docs[p][:count])) >= len(scorer.docs[p][:count])
                                 for p in percents):
        yield
        return
    own_lm, own_scorer = scorer.lm, scorer.scorer
    scorer.lm, scorer.scorer = load_baseline(baseline), "lm-eval"
    try:
        yield
    finally:
        scorer.lm, scorer.scorer = own_lm, own_scorer


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


def batch_size_arg(text: str):
    """``--batch-size``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"a positive integer or 'auto', got {text!r}") from None


def held_layers_of(pretrained: str | None, layer_type: str | None, flag: str = "--layer-type") -> tuple[int, ...]:
    """The layers ``--layer-type`` (or ``flag``) keeps at 1 in the PI and uniform rows, from the model's
    config (no weights); none without it. A type the model lacks is a ValueError naming its types."""
    if not layer_type:
        return ()
    from lpes_harness.evaluation.layer_types import layers_not_of, model_layer_types

    return layers_not_of(model_layer_types(pretrained), layer_type, flag)


def run_dtype(requested: str | None, recorded) -> str:
    """The dtype this run scores in: ``--dtype``, else the first scales file's, else float32.
    ``auto`` is resolved here, so that the score cache records what actually ran and matches a
    search's cache (which records the resolved dtype) on the same machine."""
    dtype = requested or (recorded.get("dtype") if isinstance(recorded, dict) else None) or "float32"
    return choose_dtype(dtype, default_device())


def task_positions(task: str) -> list[int]:
    from lpes_harness.tasks.position import resolve_task

    return list(resolve_task(task).positions)
