"""The exact risk decomposition R = O_H + E_H * C_H and two-action contrasts
(docs/method.md sections 4-5).

Everything here works on samples: per-trajectory terms are averaged with optional
weights (documents as units, strata weighted equally), and the identities hold
exactly on those pooled empirical moments, not only in expectation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdrift.records.terms import TrajectoryTerms


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
    """``Delta R = Delta O + Delta E * Cbar + Delta C * Ebar`` of the contrast ``a - b``
    (``Delta``: ``a`` minus ``b``; bars: midpoints of ``a`` and ``b``)."""

    a: Decomposition
    b: Decomposition

    @property
    def dR(self) -> float:
        return self.a.R - self.b.R

    @property
    def dO(self) -> float:
        return self.a.O - self.b.O

    @property
    def dE(self) -> float:
        return self.a.E - self.b.E

    @property
    def dC(self) -> float:
        return self.a.C - self.b.C

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
