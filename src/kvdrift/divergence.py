"""The divergence time ``tau``: one convention for estimators, records and analyses.

``tau`` is the 1-based position of the first mismatch between the two branches, and
:data:`NEVER` (0) when they agree at every position of the horizon. Records store it so,
estimators produce it so, and every analysis helper reads it so.
"""

from __future__ import annotations

import numpy as np

NEVER = 0
"""Value of ``tau`` for a trajectory that never diverged within the horizon."""


def first_true(flags: np.ndarray, none: int = NEVER) -> np.ndarray:
    """1-based index of the first True along the last axis; ``none`` where there is none."""
    return np.where(flags.any(axis=-1), flags.argmax(axis=-1) + 1, none)


def divergence_time(mismatch: np.ndarray) -> np.ndarray:
    """``tau`` per row of a ``[..., H]`` boolean mismatch array (:data:`NEVER` if none)."""
    return first_true(np.asarray(mismatch, dtype=bool), NEVER)


def diverged(tau: np.ndarray) -> np.ndarray:
    """Whether each ``tau`` marks a divergence within the horizon."""
    return np.asarray(tau) != NEVER
