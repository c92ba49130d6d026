"""The one interval type of kvdrift: an estimate with ``[lo, hi]`` at a confidence level.

Two kinds of interval share it:

- *Confidence intervals* (bootstrap percentile intervals): ``estimate`` is the point
  estimate, ``[lo, hi]`` the interval at ``level = 1 - alpha``. The estimate need not lie
  inside ``[lo, hi]``.
- *Enclosures without a point estimate* (the sharp set ``[R_L, R_L + B_L]``, the Hoeffding
  enclosure), built with :meth:`Interval.enclosing`: by convention ``estimate`` is the
  midpoint, the minimax point, whose worst-case error is half the width. A sharp set holds
  with certainty, ``level = 1``; the Hoeffding enclosure at ``1 - alpha``.

NaN marks an end (or an estimate) that is undefined, e.g. a ratio whose denominator is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """``estimate`` with the interval ``[lo, hi]`` at confidence ``level`` (in (0, 1]).

    ``to_json()`` gives ``{"estimate", "lo", "hi"}``, the shape ``analysis.json`` stores.
    """

    estimate: float
    lo: float
    hi: float
    level: float

    def __post_init__(self) -> None:
        if self.lo > self.hi:  # False when either end is NaN (undefined)
            raise ValueError(f"interval needs lo <= hi; got [{self.lo}, {self.hi}]")
        if not 0 < self.level <= 1:
            raise ValueError(f"interval level must be within (0, 1]; got {self.level}")

    @classmethod
    def enclosing(cls, lo: float, hi: float, level: float = 1.0) -> Interval:
        """An enclosure ``[lo, hi]`` without a point estimate: the estimate is its midpoint."""
        return cls((lo + hi) / 2, lo, hi, level)

    @property
    def minimax(self) -> float:
        """The midpoint ``(lo + hi) / 2``: the point with the least worst-case error."""
        return (self.lo + self.hi) / 2

    @property
    def worst_error(self) -> float:
        """Half the width: the minimax point's largest possible error."""
        return (self.hi - self.lo) / 2

    def contains(self, value: float, tol: float = 0.0) -> bool:
        return self.lo - tol <= value <= self.hi + tol

    def excludes_zero(self) -> bool:
        """True if the interval lies wholly above or below 0 (False when an end is NaN)."""
        return self.lo > 0 or self.hi < 0

    @property
    def defined(self) -> bool:
        """True if the estimate is a finite number."""
        return math.isfinite(self.estimate)

    def to_json(self) -> dict[str, float]:
        return {"estimate": self.estimate, "lo": self.lo, "hi": self.hi}

    @classmethod
    def from_json(cls, data: dict, level: float) -> Interval:
        """Read ``{"estimate", "lo", "hi"}`` (None or absent: NaN) at ``level``."""
        return cls(*(_number(data.get(k)) for k in ("estimate", "lo", "hi")), level)


def _number(value) -> float:
    return math.nan if value is None else float(value)


def numbers(values) -> np.ndarray:
    """A list of numbers from JSON (None: NaN) as a float array."""
    return np.array([_number(v) for v in values], dtype=np.float64)
