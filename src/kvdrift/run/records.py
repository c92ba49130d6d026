"""Estimator results as flat tables: one row per step, one row per replicate.

Both estimators produce the same step columns (declared, with their types and meaning, in
:mod:`kvdrift.records.schema`) so that stores and analyses read either; columns that an
estimator cannot fill hold NaN or -1. The teacher-forced columns
:data:`~kvdrift.records.schema.FORCED_COLUMNS` (see :mod:`kvdrift.estimate.forced`) are null
(NaN when read into pandas) after X's EOS and throughout SWRB records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kvdrift.divergence import diverged
from kvdrift.records.depths import DepthTerms, depth_arrays
from kvdrift.records.schema import FORCED_COLUMNS
from kvdrift.records.terms import trajectory_terms, window_terms

if TYPE_CHECKING:  # annotations only: reading a store needs no torch
    from kvdrift.estimate import RolloutResult, SWRBResult


def _forced_columns(result: RolloutResult | None, n: int) -> dict[str, pa.Array]:
    """The teacher-forced step columns, float64, null where not computed (read back as NaN)."""
    out = {}
    for name in FORCED_COLUMNS:
        value = None if result is None else getattr(result, name)
        values = np.full(n, np.nan) if value is None else value.numpy().ravel()
        out[name] = pa.array(values.astype(np.float64), pa.float64(), from_pandas=True)
    return out


@dataclass(frozen=True)
class UnitKey:
    """One unit of work: a (model, document, action) triple."""

    model: str
    doc_id: str
    action: str
    stratum: str = "default"


def _key_columns(key: UnitKey, n: int) -> dict[str, pa.Array]:
    return {
        "model": pa.array([key.model] * n, pa.string()),
        "doc_id": pa.array([key.doc_id] * n, pa.string()),
        "stratum": pa.array([key.stratum] * n, pa.string()),
        "action": pa.array([key.action] * n, pa.string()),
    }


def rollout_tables(
    key: UnitKey, result: RolloutResult, depths: tuple[int, ...] = ()
) -> tuple[pa.Table, pa.Table]:
    """Step and replicate tables of complete coupled rollouts (window terms per depth L)."""
    K, H = result.replicates, result.horizon
    rep = np.repeat(np.arange(K), H)
    t = np.tile(np.arange(1, H + 1), K)
    tau = result.tau.numpy()
    steps = pa.table(_key_columns(key, K * H) | {
        "estimator": pa.array(["rollout"] * (K * H)),
        "replicate": rep.astype(np.int32),
        "t": t.astype(np.int32),
        "x_token": result.x.numpy().ravel().astype(np.int64),
        "y_token": result.y.numpy().ravel().astype(np.int64),
        "mismatch": result.mismatch.numpy().ravel(),
        "delta": result.delta.numpy().ravel(),
        "f": result.f.numpy().ravel(),
        "tau": np.repeat(tau, H).astype(np.int32),
        "x_eos": result.x_eos.numpy().ravel(),
        "y_eos": result.y_eos.numpy().ravel(),
    } | _forced_columns(result, K * H))
    m = result.mismatch.numpy()
    terms = trajectory_terms(m)
    cols = _key_columns(key, K) | {
        "estimator": pa.array(["rollout"] * K),
        "replicate": np.arange(K, dtype=np.int32),
        "horizon": np.full(K, H, dtype=np.int32),
        "tau": tau.astype(np.int32),
        "risk": terms.mismatch_fraction,
        "risk_tv": result.delta.numpy().mean(axis=1),  # rollout TV (1/H) sum_t delta_t
        "occurrence": terms.occurrence,
        "exposure": terms.exposure,
        "occupation": terms.occupation,
        "fixed_risk": result.f.numpy().mean(axis=1),
        "evaluations": np.full(K, H, dtype=np.int64),
        "divergence_mass": diverged(tau).astype(np.float64),
        "entry_time_mass": tau.astype(np.float64),
    }
    windows = [window_terms(m, L) for L in depths]
    cols |= depth_arrays(DepthTerms(
        tuple(depths), np.array([w.observed for w in windows]).reshape(len(depths), K).T,
        np.array([w.capacity for w in windows]).reshape(len(depths), K).T))
    return steps, pa.table(cols)


def swrb_tables(key: UnitKey, result: SWRBResult) -> tuple[pa.Table, pa.Table]:
    """Step and replicate tables of SWRB: the scan and the continuation share each row.

    Step columns: ``shared_token``/``scan_tv``/``weight`` describe the scan at position t;
    ``x_token``/``y_token``/``mismatch`` the continuation (from ``J`` on; -1 before);
    ``tau`` holds ``J``; ``delta`` and ``f`` are NaN (SWRB does not follow both branches
    from the start).
    """
    K, H = result.replicates, result.horizon
    n = K * H
    J = result.J.numpy()
    steps = pa.table(_key_columns(key, n) | {
        "estimator": pa.array(["swrb"] * n),
        "replicate": np.repeat(np.arange(K), H).astype(np.int32),
        "t": np.tile(np.arange(1, H + 1), K).astype(np.int32),
        "x_token": result.x.numpy().ravel().astype(np.int64),
        "y_token": result.y.numpy().ravel().astype(np.int64),
        "mismatch": result.mismatch.numpy().ravel(),
        "delta": np.full(n, np.nan),
        "f": np.full(n, np.nan),
        "tau": np.repeat(J, H).astype(np.int32),
        "x_eos": np.zeros(n, dtype=bool),
        "y_eos": np.zeros(n, dtype=bool),
        "shared_token": result.shared.numpy().ravel().astype(np.int64),
        "scan_tv": result.overlap_tv.numpy().ravel(),
        "weight": result.weights.numpy().ravel(),
    } | _forced_columns(None, n))
    w = result.weights.numpy()
    s = np.arange(1, H + 1)
    cols = _key_columns(key, K) | {
        "estimator": pa.array(["swrb"] * K),
        "replicate": np.arange(K, dtype=np.int32),
        "horizon": np.full(K, H, dtype=np.int32),
        "tau": J.astype(np.int32),
        "risk": result.z_R.numpy(),
        "risk_tv": np.full(K, np.nan),  # SWRB follows no complete branch pair
        "occurrence": result.z_O.numpy(),
        "exposure": (w * (H - s)).sum(axis=1) / H,  # unbiased for E_H (= B_1)
        "occupation": result.z_Pi.numpy(),
        "fixed_risk": np.full(K, np.nan),
        "evaluations": result.evaluations.numpy().astype(np.int64),
        "divergence_mass": result.M.numpy(),
        "entry_time_mass": (w * s).sum(axis=1),  # E[.] = sum_s s p_s
    }
    cols |= depth_arrays(DepthTerms(result.depths, result.z_L.numpy(), result.w_L.numpy()))
    return steps, pa.table(cols)
