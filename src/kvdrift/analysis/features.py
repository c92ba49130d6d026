"""Per-document features: replicate means whose weighted averages give every study quantity.

Every quantity in the report is a function of weighted means over documents of these
features (a ratio at most), so one matrix per action serves the point estimates and
every bootstrap draw alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvdrift.analysis.agreement import agreement_terms
from kvdrift.analysis.lags import LagWindows, lag_terms
from kvdrift.analysis.readings import reading_features
from kvdrift.divergence import diverged
from kvdrift.records.depths import depth_terms
from kvdrift.records.schema import TERM_COLUMNS, recorded_estimator
from kvdrift.records.terms import window_terms

#: The ladder of observation windows reported for a long generation: each ``L`` below ``H``
#: gives ``[R_L, R_L + B_L]``, what watching ``L`` steps from the divergence tells about the
#: whole generation. Rollouts' step records give them whether or not they were recorded.
LADDER = (64, 256, 1024)

EOS_CATEGORIES = ("pre-EOS", "first EOS", "one absorbed", "both absorbed")
SATURATION = 0.99


@dataclass(frozen=True)
class DepthFeatures:
    """Per-document replicate means of the window terms at each observation depth:
    ``observed[i]`` (-> R_L) and ``capacity[i]`` (-> B_L) at ``depths[i]``, each ``[n_docs]``.

    Kept apart from the other features because a depth's bound reads its own two columns
    only (``analysis/study.py``), so it does not depend on which other depths were recorded.
    """

    depths: tuple[int, ...]
    observed: np.ndarray
    capacity: np.ndarray

    def with_ladder(self, mismatch: np.ndarray) -> DepthFeatures:
        """These depths and every :data:`LADDER` window below ``H`` not among them, computed
        from complete rollouts' ``[n_docs, K, H]`` mismatches (:func:`window_terms`)."""
        n, K, H = mismatch.shape
        extra = [L for L in LADDER if L < H and L not in self.depths]
        if not extra:
            return self
        flat = mismatch.reshape(n * K, H).astype(bool)
        rows = {L: (self.observed[i], self.capacity[i]) for i, L in enumerate(self.depths)}
        for L in extra:
            w = window_terms(flat, L)
            rows[L] = (w.observed.reshape(n, K).mean(axis=1),
                       w.capacity.reshape(n, K).mean(axis=1))
        depths = tuple(sorted(rows))
        return DepthFeatures(depths, np.stack([rows[L][0] for L in depths]),
                             np.stack([rows[L][1] for L in depths]))

    def subset(self, pos: np.ndarray) -> DepthFeatures:
        """The documents at positions ``pos``; each depth's row stays contiguous (a strided
        row sums in another order in the matrix products of the bounds)."""
        return DepthFeatures(self.depths, np.ascontiguousarray(self.observed[:, pos]),
                             np.ascontiguousarray(self.capacity[:, pos]))


@dataclass(frozen=True)
class Measured:
    """What one action's records let the analysis compute, decided once where its features
    are made (the sections read this, never the feature names).

    ``branches``: both branches followed from t = 1 (rollouts): the curves, ``F``, the EOS
    split and the speculative readings (and, with lag windows, ``B``, local agreement and
    cohort support); ``forced``: the teacher-forced columns along X too.
    """

    branches: bool = False
    forced: bool = False


@dataclass(frozen=True)
class DocFeatures:
    """Feature matrices for one (model, action): each ``[n_docs, k]``, rows in ``doc_ids``
    order; ``depths`` the window terms at each observation depth; ``measured`` what the
    records hold."""

    doc_ids: np.ndarray
    strata: np.ndarray
    columns: dict[str, np.ndarray]
    depths: DepthFeatures
    measured: Measured = Measured()

    def subset(self, doc_ids: np.ndarray) -> DocFeatures:
        """The rows of the given documents, in that order."""
        pos = pd.Index(self.doc_ids).get_indexer(doc_ids)
        if (pos < 0).any():
            raise ValueError("some documents are missing for this action")
        return DocFeatures(self.doc_ids[pos], self.strata[pos],
                           {k: v[pos] for k, v in self.columns.items()},
                           self.depths.subset(pos), self.measured)


def single_value(records: pd.DataFrame, column: str) -> object:
    """The one value ``column`` takes in ``records`` (a study shares its horizon, estimator)."""
    values = records[column].unique()
    if len(values) != 1:
        raise ValueError(f"the records mix {column} values {sorted(map(str, values))}; analyse "
                         "runs with one each")
    return values[0]


def eos_categories(x_eos: np.ndarray, y_eos: np.ndarray) -> np.ndarray:
    """Category index per position (``[..., H]``), see :data:`EOS_CATEGORIES`.

    Both/one absorbed: EOS emitted by both/one branch before t; first EOS: neither before t
    and at least one emits EOS at t; pre-EOS: everything else.
    """
    x_before = np.concatenate([np.zeros_like(x_eos[..., :1]), x_eos[..., :-1]], axis=-1)
    y_before = np.concatenate([np.zeros_like(y_eos[..., :1]), y_eos[..., :-1]], axis=-1)
    cat = np.zeros(x_eos.shape, dtype=np.int8)
    cat[~x_before & ~y_before & (x_eos | y_eos)] = 1
    cat[x_before ^ y_before] = 2
    cat[x_before & y_before] = 3
    return cat


def _replicate_variance(values: np.ndarray) -> np.ndarray:
    """Per-document sample variance over replicates (``[n, K]`` -> ``[n, 1]``; NaN if K < 2)."""
    if values.shape[1] < 2:
        return np.full((values.shape[0], 1), np.nan)
    return values.var(axis=1, ddof=1)[:, None]


def _cube(steps: pd.DataFrame, column: str, n_docs: int, K: int, H: int) -> np.ndarray:
    return steps[column].to_numpy().reshape(n_docs, K, H)


def _short_units(sizes: pd.Series, want: int, reps: pd.DataFrame) -> str:
    """``"; short: model · document · action (rows of want)"``, naming the damaged units, and
    how to repair them (a rerun of the run or study recomputes damaged units)."""
    short = sizes[sizes != want]
    if short.empty:
        return ""
    model, action = reps["model"].iloc[0], reps["action"].iloc[0]
    named = ", ".join(f"{model} · {d} · {action} ({int(k)} of {want} rows)"
                      for d, k in short.items())
    return f"; short: {named}; rerun the run or study to recompute them"


def _depth_features(reps: pd.DataFrame) -> DepthFeatures:
    """Per-document means of each depth's window terms (documents sorted, as ``groupby``)."""
    terms = depth_terms(reps)
    doc_ids = reps["doc_id"].to_numpy()

    def means(values: np.ndarray) -> np.ndarray:  # [rows, depths] -> [depths, n_docs]
        return np.ascontiguousarray(pd.DataFrame(values).groupby(doc_ids).mean().to_numpy().T)

    return DepthFeatures(terms.depths, means(terms.observed), means(terms.capacity))


def action_features(
    steps: pd.DataFrame, replicates: pd.DataFrame, windows: LagWindows | None
) -> DocFeatures:
    """Features of one (model, action) from its step and replicate records."""
    reps = replicates.sort_values(["doc_id", "replicate"])
    keep = [c for c in reps.columns if c in TERM_COLUMNS]
    doc = reps.groupby("doc_id")  # sorted by doc_id
    means = doc[keep].mean()
    doc_ids = means.index.to_numpy()
    strata = doc["stratum"].first().loc[doc_ids].to_numpy()
    cols = {c: means[c].to_numpy()[:, None] for c in keep}
    depths = _depth_features(reps)

    steps = steps.sort_values(["doc_id", "replicate", "t"])
    n, K, H = len(doc_ids), int(reps["replicate"].nunique()), int(steps["t"].max())
    if len(steps) != n * K * H:
        raise ValueError("step records are incomplete: every document needs K x H steps"
                         + _short_units(steps.groupby("doc_id").size(), K * H, reps))
    if len(reps) != n * K:
        raise ValueError("replicate records are incomplete: every document needs K replicates"
                         + _short_units(doc.size(), K, reps))
    if not recorded_estimator(str(single_value(steps, "estimator"))).complete_branches:
        weight = _cube(steps, "weight", n, K, H)
        cols["timing"] = weight.cumsum(axis=-1).mean(axis=1)
        return DocFeatures(doc_ids, strata, cols, depths)

    delta = _cube(steps, "delta", n, K, H)
    f = _cube(steps, "f", n, K, H)
    x_eos = _cube(steps, "x_eos", n, K, H).astype(bool)
    y_eos = _cube(steps, "y_eos", n, K, H).astype(bool)
    tau = reps["tau"].to_numpy().reshape(n, K)
    t = np.arange(1, H + 1)
    cols["expected_delta"] = delta.mean(axis=1)
    # Rollout TV per replicate, (1/H) sum_t delta_t (the records' risk_tv, recomputed here so
    # that stores written before that column read the same): E = R, and as E[D_H | deltas]
    # it never has the larger variance. Within-document (replicate) variances of both.
    risk_tv = delta.mean(axis=2)  # [n, K]
    risk = reps["risk"].to_numpy(dtype=np.float64).reshape(n, K)
    cols["risk_tv"] = risk_tv.mean(axis=1)[:, None]
    cols["risk_var"] = _replicate_variance(risk)
    cols["risk_tv_var"] = _replicate_variance(risk_tv)
    cols["timing"] = (diverged(tau)[..., None] & (tau[..., None] <= t)).mean(axis=1)
    cols["saturation"] = (delta > SATURATION).mean(axis=(1, 2))[:, None]
    cat = eos_categories(x_eos, y_eos)
    cols["eos_R"] = np.stack([np.where(cat == c, delta, 0).sum(axis=2).mean(axis=1) / H
                              for c in range(len(EOS_CATEGORIES))], axis=1)
    forced = None
    if {"logp_x", "logq_x", "kl", "top1"} <= set(steps.columns) \
            and steps["logp_x"].notna().any():
        forced = {k: _cube(steps, k, n, K, H).astype(np.float64)
                  for k in ("logp_x", "logq_x", "kl", "top1")}
    cols |= reading_features(x_eos, f, tau, forced)
    cols["eos_F"] = np.stack([np.where(cat == c, f, 0).sum(axis=2).mean(axis=1) / H
                              for c in range(len(EOS_CATEGORIES))], axis=1)
    mismatch = _cube(steps, "mismatch", n, K, H)
    depths = depths.with_ladder(mismatch)
    if windows is not None:
        cols["lag_num"], cols["lag_den"] = lag_terms(delta, tau, windows)
        cols["lag_num_strict"], cols["lag_den_strict"] = lag_terms(delta, tau, windows,
                                                                   (x_eos, y_eos))
        cols |= agreement_terms(mismatch, tau, x_eos, y_eos, windows)
    measured = Measured(branches=True, forced=forced is not None)
    return DocFeatures(doc_ids, strata, cols, depths, measured)
