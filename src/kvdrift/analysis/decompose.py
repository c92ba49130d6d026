"""The exact risk decomposition R = O_H + E_H * C_H and two-action contrasts
(docs/method.md sections 4-5).

Everything here works on samples: per-trajectory terms are averaged with optional
weights (documents as units, strata weighted equally), and the identities hold
exactly on those pooled empirical moments, not only in expectation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
class Decomposition:
    """Risk and its parts: ``R = O + Pi = O + E * C`` (``C = Pi / E``, 0 when ``E = 0``)."""

    R: float
    O: float  # noqa: E741 - the method's name for the first-mismatch term
    E: float
    Pi: float

    @property
    def C(self) -> float:
        return self.Pi / self.E if self.E > 0 else 0.0

    @classmethod
    def from_terms(cls, O: float, E: float, Pi: float) -> Decomposition:  # noqa: E741
        """Build from the three moments; ``R`` is their exact sum ``O + Pi``."""
        return cls(R=O + Pi, O=O, E=E, Pi=Pi)


def weighted_mean(values: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Mean of ``values`` with non-negative ``weights`` (plain mean when None)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("cannot average an empty sample")
    if weights is None:
        return float(v.mean())
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != v.shape or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be non-negative, match the values' shape and not all be 0")
    return float((v * w).sum() / w.sum())


def decompose(terms: TrajectoryTerms, weights: np.ndarray | None = None) -> Decomposition:
    """Pooled empirical decomposition of trajectory terms (weights per trajectory)."""
    return Decomposition.from_terms(
        O=weighted_mean(terms.occurrence, weights),
        E=weighted_mean(terms.exposure, weights),
        Pi=weighted_mean(terms.occupation, weights),
    )


@dataclass(frozen=True)
class Contrast:
    """``Delta R = Delta O + Delta E * Cbar + Delta C * Ebar`` for actions a -> b (``b - a``)."""

    a: Decomposition
    b: Decomposition

    @property
    def dR(self) -> float:
        return self.b.R - self.a.R

    @property
    def dO(self) -> float:
        return self.b.O - self.a.O

    @property
    def dE(self) -> float:
        return self.b.E - self.a.E

    @property
    def dC(self) -> float:
        return self.b.C - self.a.C

    @property
    def occurrence_term(self) -> float:
        return self.dO

    @property
    def exposure_term(self) -> float:
        return self.dE * (self.a.C + self.b.C) / 2

    @property
    def rate_term(self) -> float:
        return self.dC * (self.a.E + self.b.E) / 2

    @property
    def exposure_share(self) -> float:
        """Share of ``Delta R`` carried by exposure; NaN when ``Delta R = 0``."""
        return self.exposure_term / self.dR if self.dR != 0 else float("nan")
