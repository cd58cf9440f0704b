"""Control points -> per-layer RoPE scales (the paper's Bézier constraint and its ablations).

A curve is given by control points ``P_k = (x_k, y_k)``, ``k = 0..d``, with ``x`` in
layer units (``0 .. L-1``) and ``y`` a position scale. Layer ``h`` of ``L`` is placed at

    x_h = P_0x + (P_dx - P_0x) * h / (L - 1)

(evenly spaced from the first to the last control point), and its scale ``s_h`` is the
curve's height at ``x_h``. Three curves share that layout:

``bezier``
    The Bézier curve of degree ``d``: ``B(t) = sum_k C(d,k) t^k (1-t)^(d-k) P_k``. Because the
    ``x_k`` strictly increase, ``x(t)`` is strictly increasing on [0, 1]
    (``x'(t) = d * sum_k (x_{k+1} - x_k) B_{k,d-1}(t) > 0``), so ``t`` with ``x(t) = x_h`` is
    unique and found by bisection; then ``s_h = y(t)``. The first and last layers get
    exactly ``y_0`` and ``y_d`` (``t = 0`` and ``t = 1``).
``linear``
    Piecewise-linear interpolation through the control points.
``step``
    Piecewise constant: layer ``h`` takes the ``y`` of the last control point with
    ``x_k <= x_h`` (a right-continuous staircase). The last layer sits on ``P_d`` and so
    takes ``y_d``; the first takes ``y_0``.

Everything here is plain numpy: no torch, so the search and the CLI can use it cheaply.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np

ControlPoints = list[tuple[float, float]]

DEFAULT_BISECTION_TOL = 1e-9
# Rounding slack when comparing a layer's x to a control point's x in the step curve:
# x_h is computed in floating point, and a layer that sits on a control point must
# take that point's y rather than its predecessor's.
_STEP_SLACK = 1e-9

EXAMPLE_CONTROL_POINTS = "0:1.5;10:1.2;20:1.8;29:1.4"


# --------------------------------------------------------------------------- parsing


def parse_control_points(text: str) -> ControlPoints:
    """Parse ``"x0:y0;x1:y1;..."`` (e.g. ``"0:1.5;10:1.2;20:1.8;29:1.4"``) into ``[(x, y), ...]``.

    ``;`` separates points because lm-eval splits ``--model_args`` on commas. Whitespace
    around numbers and a trailing ``;`` are allowed. Only the syntax is checked here;
    :func:`validate_control_points` checks the geometry.
    """
    if not isinstance(text, str):
        raise TypeError(f"control points must be a string like {EXAMPLE_CONTROL_POINTS!r}, got {type(text).__name__}")
    chunks = [chunk.strip() for chunk in text.strip().split(";")]
    if chunks[-1] == "":
        chunks.pop()  # trailing ';'
    if not any(chunks):
        raise ValueError(f"no control points in {text!r}; expected 'x:y' pairs separated by ';', e.g. {EXAMPLE_CONTROL_POINTS!r}")
    points: ControlPoints = []
    for index, chunk in enumerate(chunks):
        parts = chunk.split(":")
        if len(parts) != 2:
            raise ValueError(
                f"control point {index} {chunk!r} in {text!r} is not of the form x:y; "
                f"expected 'x:y' pairs separated by ';', e.g. {EXAMPLE_CONTROL_POINTS!r}"
            )
        coords = []
        for axis, raw in zip("xy", parts):
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(
                    f"control point {index} {chunk!r} in {text!r}: {axis}={raw.strip()!r} is not a number; "
                    f"expected e.g. {EXAMPLE_CONTROL_POINTS!r}"
                ) from None
            if not math.isfinite(value):
                raise ValueError(f"control point {index} {chunk!r} in {text!r}: {axis} must be a finite number")
            coords.append(value)
        points.append((coords[0], coords[1]))
    return points


def format_control_points(points: Iterable[Sequence[float]]) -> str:
    """Inverse of :func:`parse_control_points`: ``[(0, 1.5), (29, 1.4)] -> "0:1.5;29:1.4"``."""
    return ";".join(f"{_short(x)}:{_short(y)}" for x, y in points)


def _short(value: float) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


# ------------------------------------------------------------------------ validation


def validate_control_points(
    points: Iterable[Sequence[float]],
    num_layers: int | None,
    y_bounds: tuple[float, float] | None = None,
) -> ControlPoints:
    """Check control points for a model with ``num_layers`` layers and return them as float pairs.

    Accepted: at least 2 points, finite numbers, ``x`` strictly increasing inside
    ``[0, num_layers - 1]``, and ``y`` inside ``y_bounds = (lo, hi)`` (inclusive), or ``y > 0``
    when no bounds are given (a scale must be positive). Errors name the offending point.
    ``num_layers=None`` checks all but the upper x bound (the model is not known yet).
    """
    if num_layers is not None and (
        isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or num_layers < 2
    ):
        raise ValueError(f"num_layers must be an integer >= 2, got {num_layers!r}")
    num_layers = None if num_layers is None else int(num_layers)
    if y_bounds is not None:
        lo, hi = (float(b) for b in y_bounds)
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
            raise ValueError(f"y_bounds must be finite with 0 < lo <= hi, got {tuple(y_bounds)!r}")
    if isinstance(points, str):
        raise TypeError(f"got the string {points!r}; parse it first with parse_control_points()")

    checked: ControlPoints = []
    for index, point in enumerate(points):
        try:
            x, y = (float(v) for v in point)
        except (TypeError, ValueError):
            raise ValueError(f"control point {index} {point!r} is not an (x, y) pair of numbers") from None
        if not (math.isfinite(x) and math.isfinite(y)):
            raise ValueError(f"control point {index} ({x}, {y}) is not finite; x and y must be finite numbers")
        if x < 0 and num_layers is None:
            raise ValueError(f"control point {index} ({_short(x)}, {_short(y)}): x={_short(x)} is negative; x is a layer index, 0 .. L-1")
        if num_layers is not None and not 0 <= x <= num_layers - 1:
            raise ValueError(
                f"control point {index} ({_short(x)}, {_short(y)}): x={_short(x)} is outside [0, {num_layers - 1}] "
                f"(x is a layer index of a {num_layers}-layer model)"
            )
        if checked and x <= checked[-1][0]:
            raise ValueError(
                f"control point {index} ({_short(x)}, {_short(y)}): x={_short(x)} is not greater than the previous "
                f"point's x={_short(checked[-1][0])}; x must be strictly increasing"
            )
        if y_bounds is None:
            if y <= 0:
                raise ValueError(f"control point {index} ({_short(x)}, {_short(y)}): y={_short(y)} must be > 0 (it is a scale)")
        elif not lo <= y <= hi:
            raise ValueError(
                f"control point {index} ({_short(x)}, {_short(y)}): y={_short(y)} is outside the allowed range [{lo}, {hi}]"
            )
        checked.append((x, y))
    if len(checked) < 2:
        raise ValueError(f"need at least 2 control points (the two ends of the curve), got {len(checked)}")
    return checked


# ---------------------------------------------------------------------------- curves


def layer_positions(points: Sequence[Sequence[float]], num_layers: int) -> np.ndarray:
    """x_h for every layer: evenly spaced from the first control point's x to the last's."""
    x_first, x_last = float(points[0][0]), float(points[-1][0])
    h = np.arange(num_layers, dtype=np.float64)
    # Multiply before dividing so integer layer positions come out exact (step curve).
    return x_first + (x_last - x_first) * h / (num_layers - 1)


def bezier_eval(points: Sequence[Sequence[float]], t: np.ndarray | float) -> np.ndarray:
    """Points B(t) of the Bézier curve, shape ``t.shape + (2,)``; de Casteljau (numerically stable)."""
    t = np.asarray(t, dtype=np.float64)
    ctrl = np.asarray(points, dtype=np.float64)  # (d+1, 2)
    tt = t[..., None, None]
    work = np.broadcast_to(ctrl, t.shape + ctrl.shape).copy()
    for _ in range(len(ctrl) - 1):
        work = (1.0 - tt) * work[..., :-1, :] + tt * work[..., 1:, :]
    return work[..., 0, :]


def bezier_t_for_x(
    points: Sequence[Sequence[float]],
    x_targets: np.ndarray,
    tol: float = DEFAULT_BISECTION_TOL,
    max_iter: int = 200,
) -> np.ndarray:
    """Solve ``x(t) = x_target`` for every target by vectorised bisection on [0, 1].

    Stops when every ``|x(t) - x_target| <= tol``. Needs strictly increasing control-point x
    (then ``x(t)`` is strictly increasing) and targets inside ``[x_0, x_d]``.
    """
    if not (tol > 0 and math.isfinite(tol)):
        raise ValueError(f"bisection tolerance must be a positive finite number, got {tol!r}")
    x_targets = np.asarray(x_targets, dtype=np.float64)
    lo = np.zeros_like(x_targets)
    hi = np.ones_like(x_targets)
    t = np.full_like(x_targets, 0.5)
    for _ in range(max_iter):
        t = 0.5 * (lo + hi)
        error = bezier_eval(points, t)[..., 0] - x_targets
        if np.all(np.abs(error) <= tol):
            return t
        too_far = error > 0
        hi = np.where(too_far, t, hi)
        lo = np.where(too_far, lo, t)
    raise RuntimeError(
        f"bisection did not reach |x(t) - x_h| <= {tol} in {max_iter} steps "
        f"(worst error {np.max(np.abs(error)):.3g}); use a larger tolerance"
    )


CurveFn = Callable[..., np.ndarray]
CURVES: dict[str, CurveFn] = {}


def register_curve(name: str) -> Callable[[CurveFn], CurveFn]:
    """Register ``fn(points: (d+1, 2) array, num_layers, **options) -> (L,) scales`` under ``name``."""

    def decorator(fn: CurveFn) -> CurveFn:
        if name in CURVES:
            raise ValueError(f"curve {name!r} is already registered")
        CURVES[name] = fn
        return fn

    return decorator


@register_curve("bezier")
def bezier_scales(points: np.ndarray, num_layers: int, tol: float = DEFAULT_BISECTION_TOL) -> np.ndarray:
    x_layers = layer_positions(points, num_layers)
    t = bezier_t_for_x(points, x_layers, tol=tol)
    # x(0) = x_0 and x(1) = x_d exactly, so the end layers sit on the end control points.
    t[0], t[-1] = 0.0, 1.0
    return bezier_eval(points, t)[:, 1]


@register_curve("linear")
def linear_scales(points: np.ndarray, num_layers: int) -> np.ndarray:
    return np.interp(layer_positions(points, num_layers), points[:, 0], points[:, 1])


@register_curve("step")
def step_scales(points: np.ndarray, num_layers: int) -> np.ndarray:
    x_layers = layer_positions(points, num_layers)
    index = np.searchsorted(points[:, 0], x_layers + _STEP_SLACK, side="right") - 1
    return points[np.clip(index, 0, len(points) - 1), 1]


def curve_scales(
    points: Iterable[Sequence[float]],
    num_layers: int,
    curve: str = "bezier",
    *,
    y_bounds: tuple[float, float] | None = None,
    tol: float = DEFAULT_BISECTION_TOL,
) -> list[float]:
    """Map control points to ``num_layers`` layer scales with the named curve (see module docstring).

    ``tol`` is the Bézier bisection tolerance on x; other curves ignore it.
    """
    if curve not in CURVES:
        raise ValueError(f"unknown curve {curve!r}; accepted: {', '.join(sorted(CURVES))}")
    checked = validate_control_points(points, num_layers, y_bounds)
    ctrl = np.asarray(checked, dtype=np.float64)
    options = {"tol": tol} if curve == "bezier" else {}
    return [float(s) for s in CURVES[curve](ctrl, int(num_layers), **options)]


# ------------------------------------------------------------------------ smoothness


def smoothness(scales: Sequence[float]) -> float:
    """S = mean over interior layers of |s_{l+1} - 2 s_l + s_{l-1}| (0 for any straight line).

    The paper tracks it in the brute-force ablation to show per-layer genes give jagged curves.
    """
    s = np.asarray(scales, dtype=np.float64)
    if s.ndim != 1 or len(s) < 3:
        raise ValueError(f"smoothness needs a flat list of at least 3 scales, got shape {s.shape}")
    return float(np.mean(np.abs(s[2:] - 2.0 * s[1:-1] + s[:-2])))
