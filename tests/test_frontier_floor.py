"""The mean-only fixed-sample test that ``benchmarks/frontier_floor.py`` sets beside the floors
(Bentkus 2004): exact values, the binomial tail it cannot beat, and its level on laws at the
null's edge (each at a false-alarm rate below 1e-4)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from frontier_floor import atom_floor, mean_only_p_values  # noqa: E402


@pytest.mark.parametrize("m", [0.1, 0.3])
def test_exact_values_on_one_and_two_values(m):
    # one value, sum 0: only h = 1, E (1 - B)_+ = 1 - m
    assert mean_only_p_values(np.array([0.0]), 1, m)[0] == pytest.approx(1 - m)
    # two values, sum 0: h = 1 gives P(B = 0) = (1 - m)^2, h = 2 gives 1 - m
    assert mean_only_p_values(np.array([0.0]), 2, m)[0] == pytest.approx((1 - m) ** 2)
    # a sum at its mean under the null, or at the top, is no evidence: E (h - B)_+ >= h - nm
    assert mean_only_p_values(np.array([2 * m, 2.0]), 2, m) == pytest.approx([1.0, 1.0])


def test_equals_the_ratio_minimised_over_every_h():
    """Against a direct computation: E (h - B)_+ summed over the binomial law, the least
    ratio over a fine grid of h past S and every integer past it, at sums where the best h is
    not the first integer past S."""
    n, m = 40, 0.1
    k = np.arange(n + 1)
    pmf = stats.binom.pmf(k, n, m)
    sums = np.array([0.0, 0.7, 1.5, 2.0, 3.25, 5.9])
    want = []
    for s in sums:
        h = np.concatenate([np.linspace(s + 1e-6, n, 40_001), np.arange(np.floor(s) + 1, n + 1)])
        expected = (np.clip(h[:, None] - k[None, :], 0, None) * pmf).sum(axis=1)
        want.append(min(1.0, float((expected / (h - s)).min())))
    assert mean_only_p_values(sums, n, m) == pytest.approx(want, rel=1e-9)


def test_never_below_the_binomial_tail_and_monotone():
    n, m = 60, 0.1
    sums = np.arange(0, 7, dtype=float)
    p = mean_only_p_values(sums, n, m)
    assert np.all(p >= stats.binom.cdf(sums, n, m) - 1e-12)  # Markov cannot beat the law
    assert np.all(np.diff(mean_only_p_values(np.linspace(0, 6, 61), n, m)) >= -1e-12)
    assert p[2] <= np.e * stats.binom.cdf(2, n, m)  # Bentkus: within a factor e here


@pytest.mark.parametrize("law", ["coin", "two-point", "uniform", "rare-large"])
def test_level_holds_at_the_null_edge(law):
    """Laws of mean exactly 0.1: rejections at 0.05 stay below the upper 1e-4 tail of
    Bin(4000, 0.05) (a false alarm in under 1 in 10,000 runs if the level held exactly)."""
    rng = np.random.default_rng(17)
    n, m, draws, level = 60, 0.1, 4000, 0.05
    u = rng.random((draws, n))
    x = {"coin": (u < m).astype(float),
         "two-point": np.where(u < 0.2, 0.5, 0.0),
         "uniform": 0.2 * u,
         "rare-large": np.where(u < 0.1 / 0.75, 0.5 + 0.5 * rng.random((draws, n)), 0.0)}[law]
    rejected = int(np.sum(mean_only_p_values(x.sum(axis=1), n, m) <= level))
    assert rejected <= stats.binom.ppf(1 - 1e-4, draws, level)


def test_the_atoms_floor():
    """Mean 0.05 against 0.1 at 0.05 / 3: (1 - q)^t <= 2a first at t = 63 with q = 0.05 /
    0.95; the fails side is the same reflected; and it never exceeds what the exact binomial
    test needs on coins (a valid test cannot beat a floor)."""
    level = 0.05 / 3
    assert atom_floor(0.05, 0.1, level, True) == 63
    assert atom_floor(0.95, 0.9, level, False) == 63
    q = 0.05 / 0.95
    assert (1 - q) ** 63 <= 2 * level < (1 - q) ** 62
    # coins of mean 0.05: the test that rejects when the count of ones is at most the median
    # of Bin(t, 0.05) has power at least one half, and is valid once Bin(t, 0.1) falls there
    # with probability at most the level
    t = next(t for t in range(1, 1000)
             if stats.binom.cdf(stats.binom.median(t, 0.05), t, 0.1) <= level)
    assert 63 <= t < 1000
