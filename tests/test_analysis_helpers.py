"""The analysis' small helpers by hand: ridge, stratum weights, bootstrap counts, weighted
means and percentile intervals, with their refusals."""

import warnings

import numpy as np
import pandas as pd
import pytest
from messages import whole

from kvdrift.analysis.bootstrap import (
    percentile_interval,
    stratified_counts,
    stratum_weights,
    weighted_means,
)
from kvdrift.analysis.ridge import fit_ridge


def test_ridge_with_alpha_zero_is_least_squares():
    X = np.array([[0, 1], [1, 0], [2, 2], [3, 1], [4, 5]])  # integers are read as floats
    y = np.array([1.0, 2.0, 2.5, 4.0, 7.0])
    fit = fit_ridge(X, y, 0.0)
    A = np.column_stack([np.ones(5), X])
    beta = np.linalg.lstsq(A, y, rcond=None)[0]
    X_new = np.array([[1, 1], [5, -2]])
    np.testing.assert_allclose(fit.predict(X_new), np.column_stack([np.ones(2), X_new]) @ beta,
                               rtol=1e-10)
    np.testing.assert_allclose(fit.centre, [2.0, 1.8])
    np.testing.assert_allclose(fit.scale, X.std(axis=0))
    const = fit_ridge(np.column_stack([X[:, 0], np.full(5, 3.0)]), y, 1.0)
    assert const.scale[1] == 1.0 and const.coef[1] == 0.0  # a constant column: scale 1


@pytest.mark.parametrize("X, y, alpha, message", [
    (np.zeros(3), np.zeros(3), 1.0, "ridge needs X [n, p] and y [n] with n >= 1; got (3,), (3,)"),
    (np.zeros((3, 2)), np.zeros(2), 1.0,
     "ridge needs X [n, p] and y [n] with n >= 1; got (3, 2), (2,)"),
    (np.zeros((0, 2)), np.zeros(0), 1.0,
     "ridge needs X [n, p] and y [n] with n >= 1; got (0, 2), (0,)"),
    (np.zeros((3, 2)), np.zeros(3), -0.5, "ridge alpha must be >= 0; got -0.5"),
    (np.zeros((3, 2)), np.zeros(3), float("nan"), "ridge alpha must be >= 0; got nan"),
])
def test_ridge_refusals(X, y, alpha, message):
    with pytest.raises(ValueError, match=whole(message)):
        fit_ridge(X, y, alpha)


def test_stratum_weights_by_hand():
    np.testing.assert_allclose(stratum_weights(pd.Series(["a", "a", "b", "a"])),
                               [1 / 6, 1 / 6, 1 / 2, 1 / 6])


def test_stratified_counts_by_seed_and_refusals():
    strata = np.array(["a", "b", "a", "a"])
    one = stratified_counts(strata, 1, seed=7)
    assert one.shape == (1, 4) and one[0, 1] == 1 and one[0, [0, 2, 3]].sum() == 3
    many = stratified_counts(strata, 500, seed=7)
    assert np.array_equal(many, stratified_counts(strata, 500, seed=7))
    assert not np.array_equal(many, stratified_counts(strata, 500, seed=8))
    # each member of stratum a is drawn 3 x 1/3 = 1 time on average (sd sqrt(2/3) per draw):
    # 500 draws put the mean within 0.2 of 1 with probability > 1 - 1e-7
    assert np.abs(many[:, [0, 2, 3]].mean(axis=0) - 1).max() < 0.2
    assert stratified_counts(strata, 0, seed=7).shape == (0, 4)  # point estimates only
    for draws in (True, 1.5, -1):
        with pytest.raises(ValueError, match=whole(
                f"bootstrap draws must be an integer >= 0; got {draws!r}")):
            stratified_counts(strata, draws, seed=0)


def test_weighted_means_by_hand():
    cols = {"x": np.array([[1.0], [3.0], [5.0]]), "y": np.array([[2.0], [np.nan], [4.0]])}
    w = np.array([0.5, 0.25, 0.25])
    point = weighted_means(cols, w)
    assert point["x"].shape == (1,) and point["x"][0] == pytest.approx(2.5)
    assert np.isnan(point["y"][0])  # a feature an estimator does not produce stays NaN
    counts = np.array([[2.0, 0.0, 1.0], [0.0, 0.0, 3.0]])
    draws = weighted_means(cols, w, counts)  # weights (1, 0, 0.25) and (0, 0, 0.75)
    np.testing.assert_allclose(draws["x"], [[(1 + 1.25) / 1.25], [5.0]])
    assert draws["y"].shape == (2, 1) and np.isnan(draws["y"]).all()


def test_percentile_interval_by_hand_and_all_nan_columns():
    samples = np.column_stack([np.arange(101.0), np.full(101, np.nan)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lo, hi = percentile_interval(samples, 0.1)
    assert (lo[0], hi[0]) == (5.0, 95.0) and np.isnan(lo[1]) and np.isnan(hi[1])
    # no draws (a point-estimate-only analysis): NaN ends of the curve's shape, never a width
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lo, hi = percentile_interval(np.empty((0, 3)), 0.1)
    assert lo.shape == hi.shape == (3,) and np.isnan(lo).all() and np.isnan(hi).all()
    for alpha in (0.0, 1.0):
        with pytest.raises(ValueError, match=whole(
                f"alpha must be within (0, 1); got {alpha}")):
            percentile_interval(samples, alpha)


def test_endpoint_refusals_whole():
    from kvdrift.analysis.endpoints import parse_endpoint

    with pytest.raises(ValueError, match=whole(
            "cannot read 'B snapkv'; write STAT(action), STAT(action) - STAT(action), or "
            "'a - b' for R(a) - R(b), e.g. 'B(snapkv-90) - B(recent-90)'")):
        parse_endpoint("B snapkv")
    with pytest.raises(ValueError, match=whole(
            "statistic in endpoint 'Q(a)' must be one of p_diverge, mean_entry_time, R, R_tv, O, "
            "E, Pi, C, F, R_minus_F, S99, B, B_strict; got 'Q'")):
        parse_endpoint("Q(a)")


def test_interval_edges():
    from kvdrift import checks
    from kvdrift.analysis.bounds import certainly_better
    from kvdrift.analysis.interval import Interval

    iv = Interval.enclosing(0.25, 0.5)
    assert iv.contains(0.25) and iv.contains(0.5) and not iv.contains(0.5625)
    assert iv.contains(0.5625, tol=0.0625) and iv.contains(0.1875, tol=0.0625)
    assert not iv.contains(0.125, tol=0.0625)
    assert not certainly_better(Interval.enclosing(0.0, 0.5),
                                Interval.enclosing(0.5, 1.0))  # touching: no order
    assert certainly_better(Interval.enclosing(0.0, 0.5), Interval.enclosing(0.5625, 1.0))
    with pytest.raises(ValueError, match=r"^depth L must be an integer within 1\.\.H = 1\.\.4; "
                                         r"got True$"):
        checks.depth(True, 4)
    assert checks.depth(np.int64(4), 4) == 4


def test_ratio_is_nan_where_undefined_without_warnings():
    from kvdrift.analysis.registry import ratio

    num, den = np.array([1.0, 2.0, 3.0]), np.array([2.0, 0.0, -1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ratio(num, den)  # default: defined where den > 0
        signed = ratio(num, den, den != 0)
    np.testing.assert_array_equal(got, [0.5, np.nan, np.nan])
    np.testing.assert_array_equal(signed, [0.5, np.nan, -3.0])
    assert ratio(np.ones((2, 3)), np.array([1.0, 2.0, 4.0])).tolist() == [[1, 0.5, 0.25]] * 2
    # either side may carry the extra axes (a point numerator over bootstrap denominators)
    assert ratio(np.array([1.0, 2.0]), np.array([[1.0, 2.0], [4.0, 0.0]])).tolist() == [
        [1.0, 1.0], [0.25, pytest.approx(np.nan, nan_ok=True)]]
