"""Finding a model's positional hidden channels: the statistic and the selection behind ``poshidden_hf``'s setting file.

The authors' search (PositionalHidden/PositionalHidden, ``experiments/search_dimension/``):

1. :func:`mean_hidden_states`: every layer's output averaged per position over meaningless text
   (:func:`random_token_ids`: token ids drawn uniformly from the vocabulary, special tokens left
   out), ``(L, T, H)``;
2. :func:`monotone_layers`: a channel's layers (2 .. L-2) where its normalised curve from
   ``SKIP_FIT`` of the positions on, fitted by a cubic, only rises (or only falls);
   :func:`rank_channels` keeps the channels monotone in more than ``L // 4`` layers;
3. :func:`smoothness`: the summed squared second difference of the Savitzky-Golay-smoothed curve
   from ``SKIP_SMOOTH`` on; the smoothest channels are the candidates;
4. :func:`select` (the paper's "small retrieval set"): each candidate with each factor scored by
   the gold answer's mean log-probability on a position task's search split.

:func:`build_setting` makes the file's content (``format: lpes-poshidden/1``). The method itself
is :mod:`lpes_harness.methods.poshidden`; the command is
``python -m lpes_harness.commands.poshidden_channel``. The scoring in :func:`select` reads a task's
samples through lm-eval, which is why this lives in evaluation, not beside the method.
"""

from __future__ import annotations

import time

import numpy as np

from lpes_harness.methods import poshidden
from lpes_harness.methods.arguments import MethodError

SKIP_FIT, SKIP_SMOOTH = 0.3, 0.2  # the reference's 300 and 200 of 1000 positions
SMOOTH_WINDOW, SMOOTH_ORDER = 10, 3


def random_token_ids(vocab_size: int, samples: int, length: int, seed: int, exclude=()) -> np.ndarray:
    """``(samples, length)`` token ids drawn uniformly from the vocabulary without ``exclude``."""
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(sorted(set(exclude)), dtype=np.int64))
    return np.random.default_rng(seed).choice(allowed, size=(samples, length))


def mean_hidden_states(model, token_ids: np.ndarray, batch_size: int = 1, log=print) -> np.ndarray:
    """``(L, T, H)`` float64: each decoder layer's output averaged over the sequences, per position."""
    import torch

    total = None
    started = time.time()
    for start in range(0, len(token_ids), batch_size):
        ids = torch.as_tensor(token_ids[start : start + batch_size], device=model.device)
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
        summed = torch.stack(hidden[1:]).double().sum(dim=1).cpu().numpy()  # the embeddings left out
        total = summed if total is None else total + summed
        log(f"  hidden states: {min(start + batch_size, len(token_ids))}/{len(token_ids)} sequences "
            f"({time.time() - started:.0f} s)")
    return total / len(token_ids)


def _normalised(curves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Min-max normalised ``(T, H)`` curves and which channels vary at all."""
    low, high = curves.min(axis=0), curves.max(axis=0)
    spread = high - low
    return (curves - low) / np.where(spread > 0, spread, 1.0), spread > 0


def monotone_layers(mean_hidden: np.ndarray, skip_fit: int) -> tuple[list[list[int]], list[str]]:
    """Per channel: its monotone layers (the larger of the rising and the falling set) and that direction."""
    n_layers, length, hidden = mean_hidden.shape
    x = np.linspace(0.0, 1.0, length - skip_fit)
    basis = np.vander(x, 4)
    rising = [[] for _ in range(hidden)]
    falling = [[] for _ in range(hidden)]
    for layer in range(2, n_layers - 1):  # the reference's range(2, L - 1)
        curves, varies = _normalised(mean_hidden[layer, skip_fit:])
        fitted = basis @ np.linalg.lstsq(basis, curves, rcond=None)[0]
        steps = np.diff(fitted, axis=0)
        for channel in np.flatnonzero(varies & np.all(steps >= 0, axis=0)):
            rising[channel].append(layer)
        for channel in np.flatnonzero(varies & np.all(steps <= 0, axis=0)):
            falling[channel].append(layer)
    layers = [r if len(r) > len(f) else f for r, f in zip(rising, falling)]
    return layers, ["rising" if len(r) > len(f) else "falling" for r, f in zip(rising, falling)]


def smoothness(curve: np.ndarray) -> float:
    """Summed squared second difference of the normalised, Savitzky-Golay-smoothed curve."""
    from scipy.signal import savgol_filter

    spread = curve.max() - curve.min()
    curve = (curve - curve.min()) / (spread if spread > 0 else 1.0)
    smoothed = savgol_filter(curve, window_length=SMOOTH_WINDOW, polyorder=SMOOTH_ORDER, axis=0)
    return float(np.square(np.diff(smoothed, n=2)).sum())


def rank_channels(mean_hidden: np.ndarray, top_k: int = 10, skip_fit: float = SKIP_FIT,
                  skip_smooth: float = SKIP_SMOOTH) -> list[dict]:
    """The candidate positional channels of ``(L, T, H)`` mean hidden states, the smoothest first."""
    n_layers, length, _ = mean_hidden.shape
    fit_from, smooth_from = int(skip_fit * length), int(skip_smooth * length)
    if length - max(fit_from, smooth_from) < SMOOTH_WINDOW:
        raise MethodError(f"sequences of {length} tokens are too short for the statistic; give --length >= 50")
    layers, directions = monotone_layers(mean_hidden, fit_from)
    kept = [c for c, found in enumerate(layers) if len(found) > n_layers // 4]
    ranked = []
    for channel in kept:
        score = min(smoothness(mean_hidden[layer, smooth_from:, channel]) for layer in layers[channel])
        ranked.append({"channel": int(channel), "direction": directions[channel], "monotone_layers": layers[channel],
                       "smoothness": score})
    ranked.sort(key=lambda c: (c["smoothness"], c["channel"]))
    return ranked[:top_k]


def select(lm, candidates: list[int], factors, task: str, samples: int, metadata=None, task_manager=None,
           log=print) -> dict:
    """Score each (channel, factor) by the gold answer's mean log-probability on ``task``'s search split.

    ``lm`` is a ``poshidden_hf`` (its installed state is changed in place and left at the best pair);
    ``task_manager``: lm-eval's, if one is at hand (its metadata must then say the split and sample count)."""
    from lpes_harness.lmeval.position_scorer import PositionScorer
    from lpes_harness.tasks.position import resolve_task

    percents = resolve_task(task).positions
    scorer = PositionScorer(lm, task, percents, metadata=metadata, split="search", num_samples=samples,
                            mode="logprob", scorer="lm-eval", task_manager=task_manager)
    state = poshidden.get_state(lm.model)

    def mean_score() -> float:
        scores = [s for p in percents for s in scorer.scores(p, list(range(samples)))]
        return float(np.mean(scores))

    rows = []
    state.factor = poshidden.FACTOR.identity  # the plain model, for reference
    plain = mean_score()
    for channel in candidates:
        for factor in factors:
            state.channels, state.factor = [channel], float(factor)
            rows.append({"channel": channel, "factor": float(factor), "mean_logprob": mean_score()})
            log(f"  channel {channel}, factor {factor:g}: mean log-prob {rows[-1]['mean_logprob']:.4f} (plain {plain:.4f})")
    best = max(rows, key=lambda r: r["mean_logprob"])
    state.channels, state.factor = [best["channel"]], best["factor"]
    if best["mean_logprob"] <= plain:  # the reference ranks the plain model among the candidates too
        log(f"  no candidate beats the plain model on these samples ({plain:.4f}); the best is written anyway")
    return {"task": task, "samples_per_position": samples, "positions": list(percents), "plain_mean_logprob": plain,
            "scores": rows, "best": best, "beats_plain": best["mean_logprob"] > plain}


def build_setting(ranked: list[dict], num_layers: int, hidden_size: int, settings: dict, selection=None) -> dict:
    if not ranked:
        raise MethodError(f"no channel is monotone in more than {num_layers // 4} of the layers; try more --samples "
                            f"or a longer --length")
    chosen = selection["best"] if selection else {"channel": ranked[0]["channel"], "factor": poshidden.FACTOR.default}
    return {
        "format": poshidden.SETTING_FORMAT, "channels": [chosen["channel"]], "factor": chosen["factor"],
        "layers": poshidden.default_layers(num_layers), "factor_candidates": list(poshidden.FACTOR_CANDIDATES),
        "hidden_size": hidden_size, "num_layers": num_layers, "candidates": ranked, "statistic": settings,
        "selection": selection,
    }
