"""Decomposition, contrasts and finite-window bounds on samples."""

import math

import numpy as np
import pytest

from kvdrift.analysis.bounds import (
    certainly_better,
    certified_order,
    contrast_interval,
    hoeffding_enclosure,
    sharp_interval,
)
from kvdrift.analysis.decompose import Contrast, Decomposition, decompose
from kvdrift.analysis.interval import Interval
from kvdrift.records.terms import trajectory_terms, window_terms

# Rows: never diverges; diverges at 2 and re-agrees; diverges at 1 and stays apart.
MISMATCH = np.array(
    [
        [0, 0, 0, 0],
        [0, 1, 0, 1],
        [1, 1, 1, 1],
    ],
    dtype=bool,
)


def test_trajectory_terms_exact_values():
    terms = trajectory_terms(MISMATCH)
    assert terms.occurrence.tolist() == [0, 0.25, 0.25]
    assert terms.exposure.tolist() == [0, 0.5, 0.75]
    assert terms.occupation.tolist() == [0, 0.25, 0.75]
    assert terms.mismatch_fraction.tolist() == [0, 0.5, 1.0]
    d = decompose(terms)
    assert d.R == pytest.approx(1.5 / 3)
    assert d.O == pytest.approx(0.5 / 3) and d.E == pytest.approx(1.25 / 3)
    assert d.C == pytest.approx(1.0 / 1.25)


def test_identity_holds_pathwise_and_on_weighted_moments():
    rng = np.random.default_rng(0)
    m = rng.random((200, 9)) < rng.random((200, 1))
    terms = trajectory_terms(m)
    np.testing.assert_allclose(terms.mismatch_fraction, terms.occurrence + terms.occupation)
    w = rng.random(200)
    d = decompose(terms, w)
    direct = float((terms.mismatch_fraction * w).sum() / w.sum())
    assert d.R == pytest.approx(direct, abs=1e-15)
    assert d.R == pytest.approx(d.O + d.E * d.C, abs=1e-15)


def test_contrast_identity_is_exact():
    rng = np.random.default_rng(1)
    for _ in range(20):
        a = decompose(trajectory_terms(rng.random((50, 6)) < 0.3))
        b = decompose(trajectory_terms(rng.random((50, 6)) < 0.6))
        c = Contrast(a, b)
        assert c.dR == pytest.approx(c.occurrence_term + c.exposure_term + c.rate_term, abs=1e-14)



def test_contrast_terms_hand_values():
    a = Decomposition.from_terms(O=0.2, E=0.6, Pi=0.45)  # R = 0.65, C = 0.75
    b = Decomposition.from_terms(O=0.1, E=0.4, Pi=0.2)  # R = 0.3, C = 0.5
    c = Contrast(a, b)  # a - b, minuend first
    assert (c.dR, c.dO, c.dE, c.dC) == pytest.approx((0.35, 0.1, 0.2, 0.25))
    assert Contrast(b, a).dR == pytest.approx(-0.35)
    assert c.exposure_term == pytest.approx(0.2 * 0.625)
    assert c.rate_term == pytest.approx(0.25 * 0.5)
    assert c.exposure_share == pytest.approx(0.125 / 0.35)
    assert math.isnan(Contrast(a, a).exposure_share)
    assert Decomposition.from_terms(O=0.0, E=0.0, Pi=0.0).C == 0.0


def test_window_terms_limits():
    H = MISMATCH.shape[1]
    full = window_terms(MISMATCH, H)
    np.testing.assert_allclose(full.observed, trajectory_terms(MISMATCH).mismatch_fraction)
    assert full.capacity.tolist() == [0, 0, 0]
    one = window_terms(MISMATCH, 1)
    np.testing.assert_allclose(one.observed, trajectory_terms(MISMATCH).occurrence)
    # tau = 2, L = 1 -> (4 - 2 - 1 + 1)/4; tau = 1 -> (4 - 1 - 1 + 1)/4
    assert one.capacity.tolist() == [0, 0.5, 0.75]
    two = window_terms(MISMATCH, 2)
    assert two.observed.tolist() == [0, 0.25, 0.5]
    with pytest.raises(ValueError, match="within 1..H"):
        window_terms(MISMATCH, 5)
    with pytest.raises(ValueError, match="within 1..H"):
        window_terms(MISMATCH, 0)


def test_mismatch_given_as_numbers_counts_as_flags():
    """Records read back from CSV or Parquet may hold 0/1 numbers: they are flags, not values."""
    as_float = MISMATCH.astype(np.float64)
    for L in (1, 2, 4):
        a, b = window_terms(as_float, L), window_terms(MISMATCH, L)
        assert a.observed.tolist() == b.observed.tolist()
        assert a.capacity.tolist() == b.capacity.tolist()
    got, want = trajectory_terms(as_float), trajectory_terms(MISMATCH)
    assert got.occupation.tolist() == want.occupation.tolist()
    assert got.exposure.tolist() == want.exposure.tolist()


def test_intervals_contrasts_and_ordering():
    a, b, c = sharp_interval(0.1, 0.05), sharp_interval(0.2, 0.1), sharp_interval(0.12, 0.2)
    assert (a.lo, a.hi, a.minimax, a.worst_error) == pytest.approx((0.1, 0.15, 0.125, 0.025))
    d = contrast_interval(a, b)
    assert (d.lo, d.hi, d.level) == pytest.approx((0.05, 0.2, 1))
    # two enclosures that hold at 0.95 and 0.9: both hold at once with probability >= 0.85
    h = contrast_interval(Interval.enclosing(0.1, 0.2, 0.95), Interval.enclosing(0.3, 0.4, 0.9))
    assert (h.lo, h.hi, h.level) == pytest.approx((0.1, 0.3, 0.85))
    assert certainly_better(a, b) and not certainly_better(b, a) and not certainly_better(a, c)
    assert certified_order({"a": a, "b": b, "c": c}) == [("a", "b")]
    with pytest.raises(ValueError, match="B_L must be >= 0"):
        sharp_interval(0.1, -0.1)
    with pytest.raises(ValueError, match="lo <= hi"):
        Interval(0.5, 1.0, 0.0, 0.95)


def test_hoeffding_enclosure_width_and_coverage():
    n, alpha = 40, 0.05
    eps = math.sqrt(math.log(4 / alpha) / (2 * n))
    lo = np.full(n, 0.3)
    iv = hoeffding_enclosure(lo, lo + 0.1, alpha)
    assert (iv.lo, iv.hi) == pytest.approx((0.3 - eps, 0.4 + eps))
    # Coverage at the edge: the tail is empty (upper = lower), so the true risk 0.4 equals
    # the mean of the lower values; Hoeffding bounds the miss rate by alpha / 2. Over
    # 2,000 experiments at a fixed seed the observed miss rate must stay under alpha.
    rng = np.random.default_rng(2)
    misses = 0
    for _ in range(2000):
        lower = rng.binomial(1, 0.4, n).astype(float)
        if not hoeffding_enclosure(lower, lower, alpha).contains(0.4):
            misses += 1
    assert misses / 2000 < alpha
    with pytest.raises(ValueError, match="alpha"):
        hoeffding_enclosure(lo, lo, 1.5)


def test_hoeffding_enclosure_weighs_in_float64():
    """float32 weights (e.g. from a GPU run's records) are normalised in float64."""
    rng = np.random.default_rng(3)
    lower = rng.uniform(0.0, 0.3, 1000)
    upper = lower + rng.uniform(0.0, 0.2, 1000)
    w32 = rng.uniform(0.5, 2.0, 1000).astype(np.float32)
    got = hoeffding_enclosure(lower, upper, 0.05, weights=w32)
    want = hoeffding_enclosure(lower, upper, 0.05, weights=w32.astype(np.float64))
    assert 0 < got.lo and got.hi < 1  # not clamped, so every digit is compared
    assert (got.lo, got.hi) == (want.lo, want.hi)
