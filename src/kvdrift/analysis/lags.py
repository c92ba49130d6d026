"""The branch-aligned lag profile and its early/late windows (docs/method.md section 8).

``b_j = E[delta_{tau+j} | tau <= max_entry]``: how far apart the two branches' next-token
distributions are ``j`` steps after the first divergence. ``B(a) = mean(late) - mean(early)``
says whether branches keep drifting apart (B > 0) or heal (B < 0). The paper's H = 128
uses entry cohort tau <= 64, lags 1..64, early 1..16 and late 49..64; other horizons scale
the same way (half the horizon, quarter-width windows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdrift.divergence import diverged, first_true


@dataclass(frozen=True)
class LagWindows:
    """Entry cohort ``tau <= max_entry``, lags ``1..lags`` and inclusive early/late windows."""

    max_entry: int
    lags: int
    early: tuple[int, int]
    late: tuple[int, int]

    @classmethod
    def for_horizon(cls, horizon: int) -> LagWindows | None:
        """Scaled windows for horizon ``H``; None when ``H < 4`` (no room for two windows)."""
        if horizon < 4:
            return None
        half = horizon // 2
        width = max(1, half // 4)
        return cls(max_entry=half, lags=half, early=(1, width), late=(half - width + 1, half))

    def as_dict(self) -> dict:
        return {"max_entry": self.max_entry, "lags": list(range(1, self.lags + 1)),
                "early": list(self.early), "late": list(self.late)}

    def window_gap(self, num: np.ndarray, den: np.ndarray) -> np.ndarray:
        """``B = b_late - b_early`` with one ratio per window (paper, section 5.5).

        ``b_J = E[sum_{j in J} 1{cohort, valid} delta_{tau+j}] / E[sum_{j in J} 1{cohort,
        valid}]`` from the lag terms ``num``, ``den`` (``[..., lags]``, see :func:`lag_terms`).
        Where every lag of a window has the same support (the cohort without EOS truncation)
        this equals :meth:`gap` of the per-lag profile; under the strict pre-EOS variant the
        support shrinks with the lag and the mean of per-lag ratios would weigh a lag's few
        surviving trajectories like many.
        """
        def block(lo: int, hi: int) -> np.ndarray:
            n = np.asarray(num)[..., lo - 1:hi].sum(axis=-1)
            d = np.asarray(den)[..., lo - 1:hi].sum(axis=-1)
            out = np.full(np.broadcast_shapes(n.shape, d.shape), np.nan)
            return np.divide(n, d, out=out, where=d > 0)

        return block(*self.late) - block(*self.early)

    def gap(self, profile: np.ndarray) -> np.ndarray:
        """``B = mean(late) - mean(early)`` over the last axis of ``profile`` (``[..., lags]``)."""
        early = profile[..., self.early[0] - 1:self.early[1]]
        late = profile[..., self.late[0] - 1:self.late[1]]
        return late.mean(axis=-1) - early.mean(axis=-1)


def lag_terms(
    delta: np.ndarray, tau: np.ndarray, windows: LagWindows,
    eos: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Replicate means of ``delta_{tau+j} 1{cohort}`` and ``1{cohort}`` per lag j.

    Inputs are ``[..., K, H]`` (``tau`` is ``[..., K]``, 0 = never); outputs ``[..., lags]``.
    With ``eos = (x_eos, y_eos)``, the strict pre-EOS variant: only ``tau + j <
    min(EOS_X, EOS_Y)``, the first positions at which each branch emitted EOS.
    """
    H = delta.shape[-1]
    j = np.arange(1, windows.lags + 1)
    cohort = diverged(tau) & (tau <= windows.max_entry)  # [..., K]
    pos = tau[..., None] + j  # [..., K, lags], 1-based position tau + j (<= H by construction)
    valid = cohort[..., None] & (pos <= H)
    if eos is not None:
        eos_at = np.minimum(first_true(eos[0], H + 1), first_true(eos[1], H + 1))
        valid &= pos < eos_at[..., None]
    idx = np.minimum(pos - 1, H - 1)  # past H: masked by valid
    values = np.take_along_axis(delta, idx, axis=-1)
    num = np.where(valid, values, 0.0).mean(axis=-2)
    den = valid.mean(axis=-2)
    return num, den
