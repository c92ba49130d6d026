"""Short observations of a document and its full-horizon target, for aggregate prediction.

One row per (model, document, action), each a replicate mean: the full-horizon targets ``R``
(the mismatch fraction over all H positions) and ``R_tv`` (the rollout TV ``(1/H) sum_t
delta_t``, the paper's Table 4 target; NaN where the records hold no ``delta``), and what
cheaper observations see of them. Two
observation types, as in the method's calibration study:

- fixed history: ``F``, the fixed-history risk over the full horizon;
- positions 1..W: ``mismatch_W = (1/H) sum_{t<=W} I_t``, ``diverged_W = 1{tau <= W}``,
  ``eos_x_W = 1{e_X <= W}``, ``eos_y_W = 1{e_Y <= W}``; its uncalibrated (flat) reading
  is the mean mismatch over the window, ``flat_W = (1/W) sum_{t<=W} I_t``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvdrift import checks


@dataclass(frozen=True)
class Observation:
    """An observation type: its feature columns and its uncalibrated (flat) predictor."""

    name: str
    label: str
    features: tuple[str, ...]
    flat: str


def observation_types(window: int) -> tuple[Observation, ...]:
    """The two observation types, the window one for positions ``1..window``."""
    return (
        Observation("fixed_history", "fixed history (F)", ("F",), "F"),
        Observation("positions", f"positions 1..{window}",
                    ("mismatch_W", "diverged_W", "eos_x_W", "eos_y_W"), "flat_W"),
    )


def document_observations(
    steps: pd.DataFrame, replicates: pd.DataFrame, window: int
) -> pd.DataFrame:
    """Rows ``(model, doc_id, stratum, action)`` with ``R``, ``R_tv`` and every observation's
    columns.

    Needs complete coupled rollouts (SWRB follows no fixed-history path and branches late).
    """
    estimators = set(replicates["estimator"])
    if estimators != {"rollout"}:
        raise ValueError("prediction needs complete coupled rollouts (estimator = rollout); "
                         f"this run used {', '.join(sorted(estimators))}")
    H = int(replicates["horizon"].max())
    checks.within_horizon(window, "window", H)
    keys = ["model", "doc_id", "stratum", "action", "replicate"]
    early = steps[steps["t"] <= window]
    per_rep = early.groupby(keys).agg(
        mismatch_sum=("mismatch", "sum"), eos_x_W=("x_eos", "any"), eos_y_W=("y_eos", "any"))
    reps = replicates.set_index(keys)[["risk", "fixed_risk", "tau"]]
    per_rep = per_rep.join(reps, how="inner")
    if "delta" in steps:
        tv = steps.groupby(keys)["delta"].sum() / H
    elif "risk_tv" in replicates:
        tv = replicates.set_index(keys)["risk_tv"]
    else:
        tv = pd.Series(np.nan, index=per_rep.index)
    per_rep = per_rep.join(tv.rename("risk_tv"), how="left")
    out = pd.DataFrame({
        "R": per_rep["risk"],
        "R_tv": per_rep["risk_tv"],
        "F": per_rep["fixed_risk"],
        "mismatch_W": per_rep["mismatch_sum"] / H,
        "diverged_W": (per_rep["tau"] >= 1) & (per_rep["tau"] <= window),
        "eos_x_W": per_rep["eos_x_W"],
        "eos_y_W": per_rep["eos_y_W"],
        "flat_W": per_rep["mismatch_sum"] / window,
    })
    return out.groupby(keys[:-1]).mean().reset_index()  # replicate means (bools: fractions)
