"""Local agreement within branches, and the branch cohort's support (docs/method.md section 8).

After the first divergence the two branches may emit the same token again. Among trajectories
in the branch cohort (``1 <= tau <= max_entry``, the lag profile's entry cohort: ``tau <= 64``
at ``H = 128``), with ``e = min(e_X, e_Y)`` the first EOS position of either branch:

- ``agree_run``: the fraction with at least ``run`` consecutive pre-EOS agreements
  (``X_t == Y_t`` for ``tau < t < e``); ``run`` is 16 at ``H = 128`` and scales like the lag
  windows (the early window's width, ``max(1, H // 8)``);
- ``relapse``: the fraction with a pre-EOS mismatch after an earlier post-divergence agreement
  (``tau < t1 < t2 < e``, ``X_t1 == Y_t1``, ``X_t2 != Y_t2``).

Both use the whole branch cohort as denominator and are ratios of weighted means of
per-document replicate means, like the lag profile; the cohort support counts the documents
and trajectories behind them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvdrift.analysis.lags import LagWindows
from kvdrift.analysis.quantities import interval
from kvdrift.analysis.registry import ratio
from kvdrift.analysis.results import CohortSupport, LocalAgreement
from kvdrift.divergence import diverged, first_true

AGREEMENT_COLUMNS = ("branch_cohort", "agree_run", "relapse")


def run_length(windows: LagWindows) -> int:
    """Consecutive agreements that count as local agreement: the early lag window's width."""
    return windows.early[1] - windows.early[0] + 1


def agreement_flags(
    mismatch: np.ndarray, tau: np.ndarray, x_eos: np.ndarray, y_eos: np.ndarray,
    windows: LagWindows,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per trajectory ``(in cohort, long agreement run, relapse)``, each ``[..., K]`` bool.

    ``mismatch``, ``x_eos``, ``y_eos`` are ``[..., K, H]`` (EOS flags true from a branch's first
    EOS on); ``tau`` is ``[..., K]`` (0 = never diverged). Outside the cohort both flags are
    False.
    """
    m = np.asarray(mismatch, dtype=bool)
    H = m.shape[-1]
    t = np.arange(1, H + 1)
    cohort = diverged(tau) & (tau <= windows.max_entry)
    eos_at = np.minimum(first_true(x_eos, H + 1), first_true(y_eos, H + 1))
    post = cohort[..., None] & (t > tau[..., None]) & (t < eos_at[..., None])
    agree = post & ~m
    run = longest = np.zeros(m.shape[:-1], dtype=np.int64)
    for i in range(H):
        run = np.where(agree[..., i], run + 1, 0)
        longest = np.maximum(longest, run)
    agreed_before = np.logical_or.accumulate(agree, axis=-1)
    agreed_before = np.concatenate([np.zeros_like(agree[..., :1]), agreed_before[..., :-1]],
                                   axis=-1)
    relapse = (post & m & agreed_before).any(axis=-1)
    return cohort, longest >= run_length(windows), relapse


def agreement_terms(
    mismatch: np.ndarray, tau: np.ndarray, x_eos: np.ndarray, y_eos: np.ndarray,
    windows: LagWindows,
) -> dict[str, np.ndarray]:
    """Replicate means (``[..., 1]``) of the cohort indicator and of the two flags within it."""
    flags = agreement_flags(mismatch, tau, x_eos, y_eos, windows)
    return {name: f.mean(axis=-1)[..., None] for name, f in zip(AGREEMENT_COLUMNS, flags,
                                                               strict=True)}


def local_agreement(means: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``agree_run`` and ``relapse`` fractions of the branch cohort from weighted means.

    NaN where the cohort is empty.
    """
    den = means["branch_cohort"][..., 0]
    return {k: ratio(means[k][..., 0], den) for k in ("agree_run", "relapse")}


def local_agreement_result(model: str, action: str, point: dict, draws: dict,
                           windows: LagWindows, alpha: float) -> LocalAgreement:
    """One action's fractions with intervals (``point``/``draws``: weighted feature means)."""
    pt, bt = local_agreement(point), local_agreement(draws)
    return LocalAgreement(model, action, run_length(windows), windows.max_entry,
                          *(interval(pt[k], bt[k], alpha) for k in ("agree_run", "relapse")))


def cohort_support(model: str, action: str, replicates: pd.DataFrame, doc_ids: np.ndarray,
                   windows: LagWindows) -> CohortSupport:
    """Documents and trajectories in the branch cohort ``1 <= tau <= max_entry``.

    ``replicates`` are ``(model, action)``'s replicate records; only ``doc_ids`` count.
    """
    reps = replicates[replicates["doc_id"].isin(doc_ids)]
    tau = reps["tau"].to_numpy()
    in_cohort = diverged(tau) & (tau <= windows.max_entry)
    return CohortSupport(model, action, windows.max_entry,
                         documents=int(reps.loc[in_cohort, "doc_id"].nunique()),
                         documents_total=int(reps["doc_id"].nunique()),
                         trajectories=int(in_cohort.sum()),
                         trajectories_total=int(len(reps)))
