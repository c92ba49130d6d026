"""Ridge regression with an unpenalised intercept on centred and scaled inputs.

Inputs are centred and scaled with the training rows' means and standard deviations
(a constant column keeps scale 1 and so contributes nothing); the intercept is then the
training mean of the target, and the slopes solve ``(Z'Z + alpha I) b = Z'(y - ybar)``.
This is the calibration model of the method's aggregate prediction (alpha = 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RidgeFit:
    """A fitted ridge model: ``y = intercept + ((x - centre) / scale) @ coef``."""

    intercept: float
    coef: np.ndarray  # [p] on the scaled inputs
    centre: np.ndarray  # [p]
    scale: np.ndarray  # [p]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predictions ``[n]`` for inputs ``[n, p]`` (scaled with the training statistics)."""
        Z = (np.asarray(X, dtype=np.float64) - self.centre) / self.scale
        return self.intercept + Z @ self.coef


def fit_ridge(X: np.ndarray, y: np.ndarray, alpha: float) -> RidgeFit:
    """Fit ridge on ``X [n, p]``, ``y [n]``; the intercept is not penalised."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],) or X.shape[0] == 0:
        raise ValueError(f"ridge needs X [n, p] and y [n] with n >= 1; got {X.shape}, {y.shape}")
    if not alpha >= 0:
        raise ValueError(f"ridge alpha must be >= 0; got {alpha}")
    centre = X.mean(axis=0)
    scale = X.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    Z = (X - centre) / scale
    ybar = float(y.mean())
    coef = np.linalg.solve(Z.T @ Z + alpha * np.eye(X.shape[1]), Z.T @ (y - ybar))
    return RidgeFit(intercept=ybar, coef=coef, centre=centre, scale=scale)
