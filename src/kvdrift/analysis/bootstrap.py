"""The document bootstrap: resample documents within strata, paired across actions.

A draw is a matrix of counts (how often each document is taken); the same counts are
applied to every action of a model, which pairs the actions. Statistics are computed
from count-weighted means of per-document features, so a draw costs one matrix product.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from kvdrift import checks, limits


def stratum_weights(strata: pd.Series) -> np.ndarray:
    """Weights that give each stratum equal total weight and each document within it too."""
    counts = strata.map(strata.value_counts())
    n_strata = strata.nunique()
    return (1.0 / (n_strata * counts)).to_numpy(dtype=np.float64)


def stratified_counts(strata: np.ndarray, draws: int, seed: int) -> np.ndarray:
    """``[draws, n]`` resampling counts: within each stratum, as many documents as it has
    (``draws = 0``: no resample, a ``[0, n]`` matrix)."""
    limits.bootstrap(draws)
    strata = np.asarray(strata)
    limits.bootstrap_matrix(draws, strata.size)
    rng = np.random.default_rng(seed)
    counts = np.zeros((draws, strata.size), dtype=np.float64)
    for label in np.unique(strata):
        members = np.flatnonzero(strata == label)
        counts[:, members] = rng.multinomial(members.size, np.full(members.size, 1 / members.size),
                                             size=draws)
    return counts


def weighted_means(
    columns: dict[str, np.ndarray], weights: np.ndarray, counts: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Weighted means of ``[n, k]`` feature columns: ``[k]`` (no counts) or ``[draws, k]``.

    NaN features (quantities an estimator does not produce) stay NaN.
    """
    w = weights[None, :] if counts is None else counts * weights[None, :]  # [B, n]
    total = w.sum(axis=1, keepdims=True)
    out = {name: (w @ np.asarray(col, dtype=np.float64)) / total for name, col in columns.items()}
    return {k: v[0] for k, v in out.items()} if counts is None else out


def percentile_interval(samples: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise ``(lo, hi)`` percentile interval over the first axis at level ``1 - alpha``;
    NaN ends without draws (a point-estimate-only analysis has no interval)."""
    checks.alpha(alpha)
    samples = np.asarray(samples, dtype=np.float64)
    if samples.shape[0] == 0:
        nan = np.full(samples.shape[1:], np.nan)
        return nan, nan.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns stay NaN
        lo = np.nanpercentile(samples, 100 * alpha / 2, axis=0)
        hi = np.nanpercentile(samples, 100 * (1 - alpha / 2), axis=0)
    return lo, hi
