"""Control points -> layer scales: the Bézier constraint of the paper and its linear/step ablations."""

import math

import numpy as np
import pytest

from lpes_harness.core import curves
from lpes_harness.core.curves import (
    CURVES,
    bezier_eval,
    bezier_t_for_x,
    curve_scales,
    format_control_points,
    layer_positions,
    parse_control_points,
    smoothness,
    validate_control_points,
)

L = 30
PAPER_EXAMPLE = [(0.0, 1.5), (10.0, 1.2), (20.0, 1.8), (29.0, 1.4)]


def random_points(rng, degree, num_layers=L, y_range=(1.0, 2.0)):
    xs = np.sort(rng.choice(num_layers, size=degree + 1, replace=False)).astype(float)
    ys = rng.uniform(*y_range, size=degree + 1)
    return list(zip(xs.tolist(), ys.tolist()))


# ----------------------------------------------------------------------------- Bézier


@pytest.mark.parametrize("degree", [1, 2, 3, 4, 7])
def test_bezier_endpoints_are_the_end_control_points(degree):
    rng = np.random.default_rng(degree)
    for _ in range(20):
        points = random_points(rng, degree)
        scales = curve_scales(points, L, "bezier")
        assert len(scales) == L
        assert scales[0] == pytest.approx(points[0][1], abs=1e-12)
        assert scales[-1] == pytest.approx(points[-1][1], abs=1e-12)


def test_bezier_x_is_monotone_in_t_for_increasing_control_x():
    rng = np.random.default_rng(0)
    t = np.linspace(0.0, 1.0, 2001)
    for degree in range(1, 8):
        for _ in range(10):
            x = bezier_eval(random_points(rng, degree), t)[:, 0]
            assert np.all(np.diff(x) > 0)


def test_degree_one_bezier_is_the_straight_line_between_its_points():
    points = [(3.0, 1.1), (25.0, 1.9)]
    scales = np.array(curve_scales(points, L, "bezier"))
    expected = np.linspace(1.1, 1.9, L)  # layers evenly spaced from x=3 to x=25
    np.testing.assert_allclose(scales, expected, atol=1e-9)
    assert smoothness(scales) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("tol", [1e-3, 1e-6, 1e-10])
def test_bisection_meets_its_tolerance(tol):
    rng = np.random.default_rng(1)
    for degree in (2, 3, 5):
        points = random_points(rng, degree)
        targets = layer_positions(points, L)
        t = bezier_t_for_x(points, targets, tol=tol)
        assert np.all(np.abs(bezier_eval(points, t)[:, 0] - targets) <= tol)
        assert np.all((t >= 0) & (t <= 1))


def test_looser_tolerance_moves_scales_by_at_most_about_that_much():
    # The scale error is the x error times the curve's slope dy/dx, which is small here.
    fine = np.array(curve_scales(PAPER_EXAMPLE, L, tol=1e-12))
    coarse = np.array(curve_scales(PAPER_EXAMPLE, L, tol=1e-3))
    assert np.max(np.abs(fine - coarse)) < 1e-2
    assert np.max(np.abs(fine - coarse)) > 0  # the tolerance is really used


def test_bisection_rejects_a_bad_tolerance():
    with pytest.raises(ValueError, match="tolerance"):
        curve_scales(PAPER_EXAMPLE, L, tol=0.0)


def test_bezier_stays_inside_the_convex_hull_of_the_control_points():
    # So y bounds on control points bound every layer's scale.
    rng = np.random.default_rng(2)
    for _ in range(50):
        points = random_points(rng, int(rng.integers(1, 6)))
        scales = curve_scales(points, L)
        ys = [y for _, y in points]
        assert min(ys) - 1e-12 <= min(scales) and max(scales) <= max(ys) + 1e-12


def test_bezier_matches_the_bernstein_form():
    # An independent evaluation of B(t): sum_k C(d,k) t^k (1-t)^(d-k) P_k.
    points = np.array(PAPER_EXAMPLE)
    d = len(points) - 1
    t = np.linspace(0, 1, 17)
    bern = np.stack([math.comb(d, k) * t**k * (1 - t) ** (d - k) for k in range(d + 1)], axis=1)
    np.testing.assert_allclose(bezier_eval(points, t), bern @ points, atol=1e-12)


def test_layers_are_evenly_spaced_between_first_and_last_control_x():
    x = layer_positions([(4.0, 1.0), (10.0, 1.0), (22.0, 1.0)], 10)
    np.testing.assert_allclose(x, np.linspace(4, 22, 10))
    assert layer_positions(PAPER_EXAMPLE, L).tolist() == list(range(L))


# ----------------------------------------------------------------------- linear, step


def test_linear_curve_passes_through_control_points_and_is_straight_between():
    scales = curve_scales(PAPER_EXAMPLE, L, "linear")
    for x, y in PAPER_EXAMPLE:
        assert scales[int(x)] == pytest.approx(y)
    assert scales[5] == pytest.approx((1.5 + 1.2) / 2)
    # Zero second difference inside each segment.
    assert scales[3] - 2 * scales[4] + scales[5] == pytest.approx(0.0, abs=1e-12)


def test_step_curve_takes_the_last_control_point_at_or_left_of_the_layer():
    scales = curve_scales(PAPER_EXAMPLE, L, "step")
    assert scales[:10] == [1.5] * 10
    assert scales[10:20] == [1.2] * 10
    assert scales[20:29] == [1.8] * 9
    assert scales[29] == 1.4


def test_step_curve_with_layers_between_integer_positions():
    # Layers at x = 1, 1.75, 2.5, 3.25, 4: the x=2.5 control point starts at the layer on it.
    scales = curve_scales([(1, 1.0), (2.5, 2.0), (4, 3.0)], 5, "step")
    assert scales == [1.0, 1.0, 2.0, 2.0, 3.0]


@pytest.mark.parametrize("curve", sorted(CURVES))
def test_every_curve_reproduces_a_uniform_scale(curve):
    assert curve_scales([(0, 1.7), (12, 1.7), (29, 1.7)], L, curve) == pytest.approx([1.7] * L)


def test_unknown_curve_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"unknown curve 'spline'.*bezier, linear, step"):
        curve_scales(PAPER_EXAMPLE, L, "spline")


def test_curve_registry_accepts_new_curves():
    try:
        curves.register_curve("first")(lambda pts, n: np.full(n, pts[0, 1]))
        assert curve_scales(PAPER_EXAMPLE, L, "first") == [1.5] * L
        with pytest.raises(ValueError, match="already registered"):
            curves.register_curve("first")(lambda pts, n: None)
    finally:
        CURVES.pop("first", None)


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "points, message",
    [
        ([(0, 1.5)], "at least 2 control points"),
        ([], "at least 2 control points"),
        ([(0, 1.5), (0, 1.2)], r"control point 1 \(0, 1.2\).*strictly increasing"),
        ([(0, 1.5), (20, 1.2), (10, 1.3)], r"control point 2 \(10, 1.3\).*strictly increasing"),
        ([(-1, 1.5), (29, 1.2)], r"control point 0 \(-1, 1.5\).*outside \[0, 29\]"),
        ([(0, 1.5), (30, 1.2)], r"control point 1 \(30, 1.2\).*outside \[0, 29\]"),
        ([(0, 1.5), (29, 2.5)], r"control point 1 \(29, 2.5\).*outside the allowed range \[1.0, 2.0\]"),
        ([(0, 0.5), (29, 1.5)], r"control point 0 \(0, 0.5\).*outside the allowed range"),
        ([(0, float("nan")), (29, 1.5)], "control point 0.*finite"),
        ([(0, 1.5), (float("inf"), 1.5)], "control point 1.*finite"),
        ([(0, 1.5), (29,)], r"control point 1 \(29,\) is not an \(x, y\) pair"),
        ([(0, 1.5), ("a", 1.0)], "control point 1.*not an"),
    ],
)
def test_invalid_control_points_are_rejected_naming_the_point(points, message):
    with pytest.raises(ValueError, match=message):
        validate_control_points(points, L, y_bounds=(1.0, 2.0))


def test_without_bounds_y_must_be_a_positive_scale():
    assert validate_control_points([(0, 0.3), (29, 5.0)], L) == [(0.0, 0.3), (29.0, 5.0)]
    with pytest.raises(ValueError, match=r"control point 1 \(29, 0\).*> 0"):
        validate_control_points([(0, 1.0), (29, 0.0)], L)


def test_validation_rejects_bad_layer_count_and_bounds():
    with pytest.raises(ValueError, match="num_layers"):
        validate_control_points(PAPER_EXAMPLE, 1)
    with pytest.raises(ValueError, match="y_bounds"):
        validate_control_points(PAPER_EXAMPLE, L, y_bounds=(2.0, 1.0))
    with pytest.raises(TypeError, match="parse_control_points"):
        validate_control_points("0:1;29:1", L)


def test_curve_scales_validates_with_the_given_bounds():
    with pytest.raises(ValueError, match="outside the allowed range"):
        curve_scales(PAPER_EXAMPLE, L, y_bounds=(1.0, 1.6))
    with pytest.raises(ValueError, match=r"outside \[0, 19\]"):
        curve_scales(PAPER_EXAMPLE, 20)


# ---------------------------------------------------------------------------- parsing


def test_parse_control_points_round_trip():
    text = "0:1.5;10:1.2;20:1.8;29:1.4"
    assert parse_control_points(text) == PAPER_EXAMPLE
    assert format_control_points(parse_control_points(text)) == text
    assert parse_control_points(" 0 : 1.5 ; 29:1.4; ") == [(0.0, 1.5), (29.0, 1.4)]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no control points"),
        (";", "no control points"),
        ("0:1.5;10", r"control point 1 '10' .* not of the form x:y"),
        ("0:1.5;10:1:2", r"control point 1 '10:1:2'"),
        ("0:1.5;;29:1", r"control point 1 ''"),
        ("0:abc;29:1", r"control point 0 '0:abc'.*y='abc' is not a number"),
        ("0,1.5;29:1", r"control point 0 '0,1.5'"),
        ("0:nan;29:1", "finite"),
    ],
)
def test_parse_rejects_malformed_text(text, message):
    with pytest.raises(ValueError, match=message):
        parse_control_points(text)


# ------------------------------------------------------------------------- smoothness


def test_smoothness_is_mean_absolute_second_difference():
    assert smoothness([1.0, 2.0, 3.0, 4.0]) == 0.0
    assert smoothness([1.0, 2.0, 1.0, 2.0]) == pytest.approx(2.0)  # second differences -2, +2
    assert smoothness([1.0, 1.0, 2.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 3"):
        smoothness([1.0, 2.0])


def test_bezier_is_smoother_than_step_and_random_per_layer_scales():
    # The paper's motivation for the Bézier constraint.
    rng = np.random.default_rng(3)
    bez = smoothness(curve_scales(PAPER_EXAMPLE, L, "bezier"))
    step = smoothness(curve_scales(PAPER_EXAMPLE, L, "step"))
    random = smoothness(rng.uniform(1.0, 2.0, size=L))
    assert bez < step < random
