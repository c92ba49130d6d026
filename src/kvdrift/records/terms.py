"""Per-trajectory terms: what one replicate row records from a ``[N, H]`` mismatch matrix.

Their means are the method's quantities (docs/method.md sections 4-6): the decomposition's
terms (``occurrence`` -> O_H, ``exposure`` -> E_H, ``occupation`` -> Pi_H,
``mismatch_fraction`` -> R) and each depth's window terms (``observed`` -> R_L,
``capacity`` -> B_L). ``run/records.py`` stores them; ``analysis/`` averages them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdrift import checks
from kvdrift.divergence import diverged, divergence_time


@dataclass(frozen=True)
class TrajectoryTerms:
    """Per-trajectory terms whose means are the population quantities (all ``[N]`` arrays).

    ``occurrence = 1{tau <= H}/H``, ``exposure = (H - tau)_+/H``,
    ``occupation = (1/H) sum_{t > tau} I_t`` and ``mismatch_fraction = D_H``.
    """

    occurrence: np.ndarray
    exposure: np.ndarray
    occupation: np.ndarray
    mismatch_fraction: np.ndarray


def trajectory_terms(mismatch: np.ndarray) -> TrajectoryTerms:
    """Terms from a ``[N, H]`` boolean mismatch matrix (one row per trajectory)."""
    m = np.asarray(mismatch, dtype=bool)
    if m.ndim != 2 or m.shape[1] < 1:
        raise ValueError(f"mismatch must be a [trajectories, H] array with H >= 1; got {m.shape}")
    H = m.shape[1]
    tau = divergence_time(m)
    hit = diverged(tau)
    after = hit[:, None] & (np.arange(1, H + 1)[None, :] > tau[:, None])
    return TrajectoryTerms(
        occurrence=hit / H,
        exposure=np.where(hit, H - tau, 0) / H,
        occupation=(m & after).sum(axis=1) / H,
        mismatch_fraction=m.sum(axis=1) / H,
    )


@dataclass(frozen=True)
class WindowTerms:
    """Per-trajectory window terms: ``observed`` (mean -> R_L) and ``capacity`` (mean -> B_L)."""

    observed: np.ndarray
    capacity: np.ndarray


def window_terms(mismatch: np.ndarray, L: int) -> WindowTerms:
    """From complete rollouts ``[N, H]``: ``(1/H) sum_{j<l} I_{tau+j}`` and ``(H-tau-L+1)_+/H``."""
    m = np.asarray(mismatch, dtype=bool)
    H = m.shape[1]
    L = checks.depth(L, H)
    tau = divergence_time(m)
    hit = diverged(tau)
    t = np.arange(1, H + 1)[None, :]
    window = hit[:, None] & (t >= tau[:, None]) & (t < tau[:, None] + L)
    capacity = np.where(hit, np.maximum(H - tau - L + 1, 0), 0) / H
    return WindowTerms(observed=(m & window).sum(axis=1) / H, capacity=capacity)
