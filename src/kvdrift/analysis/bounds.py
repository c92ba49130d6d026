"""Sharp bounds from a finite observation window (docs/method.md section 6).

Observing each divergent trajectory for only ``L`` positions from ``tau`` leaves the
full-horizon risk anywhere in ``[R_L, R_L + B_L]`` and nowhere else; these helpers
build that interval, its minimax point, contrasts, orderings and the Hoeffding
finite-sample enclosure.
"""

from __future__ import annotations

import math

import numpy as np

from kvdrift import checks
from kvdrift.analysis.interval import Interval

__all__ = ["certainly_better", "certified_order", "contrast_interval", "hoeffding_enclosure",
           "sharp_interval"]


def sharp_interval(R_L: float, B_L: float) -> Interval:
    """The exact set of full-horizon risks compatible with depth-L observation.

    Certain (level 1); its estimate is the minimax point ``R_L + B_L / 2``.
    """
    if B_L < 0:
        raise ValueError(f"unobserved capacity B_L must be >= 0; got {B_L}")
    return Interval.enclosing(R_L, R_L + B_L)


def contrast_interval(a: Interval, b: Interval) -> Interval:
    """Sharp set of ``R_b - R_a`` given each action's interval.

    Both must hold for it to hold: its level is ``a.level + b.level - 1`` (Bonferroni; 1 for
    two sharp sets).
    """
    return Interval.enclosing(b.lo - a.hi, b.hi - a.lo, a.level + b.level - 1)


def certainly_better(a: Interval, b: Interval) -> bool:
    """True iff action ``a`` has lower risk than ``b`` for every compatible kernel pair."""
    return a.hi < b.lo


def certified_order(intervals: dict[str, Interval]) -> list[tuple[str, str]]:
    """All pairs ``(a, b)`` of named actions where ``a`` is certainly better than ``b``."""
    return [
        (a, b)
        for a, ia in intervals.items()
        for b, ib in intervals.items()
        if a != b and certainly_better(ia, ib)
    ]


def hoeffding_enclosure(
    lower: np.ndarray, upper: np.ndarray, alpha: float = 0.05, weights: np.ndarray | None = None
) -> Interval:
    """Finite-sample enclosure of the full-horizon risk from per-document bounds.

    ``lower[i]`` and ``upper[i]`` are document ``i``'s replicate means of ``Z_L`` and
    ``Z_L + W_L`` (each in [0, 1]). With probability at least ``1 - alpha`` the risk lies
    in ``[max(0, r_- - eps), min(1, r_+ + eps)]``, ``eps = sqrt(log(4/alpha) / (2n))``.
    With ``weights`` (e.g. strata weighted equally) the means are weighted and ``1/n``
    becomes ``sum(w_i^2)`` for weights normalised to sum 1 (Hoeffding for weighted sums).
    The result's level is ``1 - alpha`` and its estimate the midpoint.
    """
    lo_v, hi_v = np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)
    if lo_v.shape != hi_v.shape or lo_v.ndim != 1 or lo_v.size == 0:
        raise ValueError("lower and upper must be non-empty 1-D arrays of equal length")
    checks.alpha(alpha)
    w = np.ones(lo_v.size) if weights is None else np.asarray(weights, float)
    if w.shape != lo_v.shape or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be non-negative, one per document, and not all 0")
    w = w / w.sum()
    eps = math.sqrt(math.log(4 / alpha) * float((w**2).sum()) / 2)
    r_lo, r_hi = float((w * lo_v).sum()), float((w * hi_v).sum())
    return Interval.enclosing(max(0.0, r_lo - eps), min(1.0, r_hi + eps), 1 - alpha)
