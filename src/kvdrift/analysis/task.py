"""Task outcomes under the coupling (docs/method.md section 8): accuracy under P and Q, the paired
difference, flips, the variance gain of coupling, and accuracy by divergence time.

Each replicate of a scored document carries ``score_x`` (X, sampled from P) and ``score_y``
(Y, from Q), each in [0, 1] (:mod:`kvdrift.run.outcomes`). Per action, with documents as
the unit and strata weighing equally (as every study quantity):

- ``acc_p``, ``acc_q``: mean scores of X and Y; ``diff = acc_q - acc_p``.
- ``flips_lost``: mean of ``max(s_X - s_Y, 0)``, ``flips_gained``: mean of
  ``max(s_Y - s_X, 0)``. With 0/1 scores these are the fractions of replicates where P is
  right and Q wrong, and the reverse (Dutta et al. 2024's flips); always
  ``diff = flips_gained - flips_lost``.
- ``se_coupled``, ``se_uncoupled``: the standard error of ``diff`` under the study's design
  (documents drawn within strata, K replicates each) as measured, and as an uncoupled design
  with the same K (two independent sets of samples per document) would have it. With
  ``D_d`` a document's mean paired difference (``S`` strata of ``n_s`` documents), the
  coupled variance is the stratified ``sum_s var_s(D_d) / (S^2 n_s)``, which holds the
  between-document variance of the true differences plus the replicate part
  ``mean(v_d) / K`` (``v_d``: the replicate variance of ``s_Y - s_X``). Independent samples
  would replace ``v_d`` by ``var(s_X) + var(s_Y)``, larger by ``2 cov(s_X, s_Y)``, the
  covariance the coupling creates: the uncoupled variance adds
  ``mean(var(s_X) + var(s_Y) - v_d) / K`` in each stratum. Both estimates are unbiased; a
  stratum of one document has no spread, so its variance is taken as ``v_d / K`` alone.
  Both need K >= 2 (NaN otherwise).
- Accuracy by divergence time: ``E[s_Y - s_X | tau <= t]`` for ``t = 1..H``. Branches that
  never diverge within H generate the same text and score alike, so
  ``diff = P(tau <= H) * E[s_Y - s_X | tau <= H]``.

Intervals are document-bootstrap percentile intervals (within strata, one set of draws for
every action of a model, so actions are paired). Documents without an expected answer are left
out; SWRB records carry no scores (it does not sample both complete texts from the start).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvdrift.analysis.bootstrap import stratified_counts, stratum_weights, weighted_means
from kvdrift.analysis.quantities import curve, interval
from kvdrift.analysis.registry import ratio
from kvdrift.analysis.results import TASK_STATS, StratumResult, TaskDivergence, TaskResult
from kvdrift.divergence import diverged

SWRB_REASON = ("task outcomes are not measured under SWRB, which does not sample both "
               "complete texts from the start; run rollouts for them")


@dataclass(frozen=True)
class TaskFeatures:
    """Per-document task features of one action: ``[n, k]`` columns in ``doc_ids`` order."""

    doc_ids: np.ndarray
    strata: np.ndarray
    columns: dict[str, np.ndarray]
    replicates: int


def scored_documents(replicates: pd.DataFrame) -> np.ndarray:
    """Sorted ids of documents whose replicates carry both scores (none if unscored)."""
    if "score_x" not in replicates or "score_y" not in replicates:
        return np.array([], dtype=object)
    ok = replicates["score_x"].notna() & replicates["score_y"].notna()
    return np.array(sorted(set(replicates.loc[ok, "doc_id"])), dtype=object)


def task_features(replicates: pd.DataFrame, doc_ids: np.ndarray, horizon: int) -> TaskFeatures:
    """Features of one (model, action) over ``doc_ids`` (each scored, with K replicates)."""
    reps = replicates[replicates["doc_id"].isin(doc_ids)].sort_values(["doc_id", "replicate"])
    n = len(doc_ids)
    K = len(reps) // n if n else 0
    if n == 0 or len(reps) != n * K or (reps.groupby("doc_id").size() != K).any():
        raise ValueError("task scores are incomplete: every scored document needs K replicates")
    sx = reps["score_x"].to_numpy(dtype=np.float64).reshape(n, K)
    sy = reps["score_y"].to_numpy(dtype=np.float64).reshape(n, K)
    tau = reps["tau"].to_numpy().reshape(n, K)
    gap = sy - sx
    by_t = diverged(tau)[..., None] & (tau[..., None] <= np.arange(1, horizon + 1))  # [n, K, H]
    ddof = 1 if K > 1 else 0
    nan = np.full(n, np.nan)
    columns = {
        "acc_p": sx.mean(axis=1), "acc_q": sy.mean(axis=1),
        "flips_lost": np.maximum(-gap, 0).mean(axis=1),
        "flips_gained": np.maximum(gap, 0).mean(axis=1),
        "gap_var": gap.var(axis=1, ddof=ddof) if K > 1 else nan,
        "sum_var": (sx.var(axis=1, ddof=ddof) + sy.var(axis=1, ddof=ddof)) if K > 1 else nan,
    }
    columns = {k: v[:, None] for k, v in columns.items()}
    columns["by_t_num"] = (gap[..., None] * by_t).mean(axis=1)
    columns["by_t_den"] = by_t.mean(axis=1)
    strata = reps.groupby("doc_id")["stratum"].first().loc[list(doc_ids)].to_numpy()
    return TaskFeatures(np.asarray(doc_ids), strata, columns, K)


def standard_errors(
    gap_mean: np.ndarray, gap_var: np.ndarray, sum_var: np.ndarray, strata: np.ndarray,
    replicates: int, counts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``(se_coupled, se_uncoupled)`` of the stratified paired difference, one per row of
    ``counts`` (``[B, n]`` document counts, each stratum's summing to its size).

    ``gap_mean``: each document's mean ``s_Y - s_X``; ``gap_var``: its replicate variance;
    ``sum_var``: ``var(s_X) + var(s_Y)`` (see the module docstring for the formula).
    """
    labels = np.unique(strata)
    var_c = np.zeros(counts.shape[0])
    var_u = np.zeros(counts.shape[0])
    for label in labels:
        members = strata == label
        c, size = counts[:, members], int(members.sum())
        within_c = c @ gap_var[members] / size
        within_u = c @ sum_var[members] / size
        if size > 1:  # the documents' spread holds both variance components
            mean = c @ gap_mean[members] / size
            coupled = np.maximum(  # >= 0 up to rounding
                (c @ gap_mean[members] ** 2 - size * mean ** 2) / (size - 1), 0.0)
        else:  # one document: no between-document variation to measure
            coupled = within_c / replicates
        uncoupled = np.maximum(coupled + (within_u - within_c) / replicates, 0.0)
        scale = labels.size ** 2 * size
        var_c = var_c + coupled / scale
        var_u = var_u + uncoupled / scale
    return np.sqrt(var_c), np.sqrt(var_u)


def _stats(f: TaskFeatures, weights: np.ndarray, counts: np.ndarray) -> dict[str, np.ndarray]:
    """Every task stat (``[B]``) and the divergence-time curve (``[B, H]``) for ``counts``."""
    m = weighted_means(f.columns, weights, counts)
    out = {k: m[k][:, 0] for k in ("acc_p", "acc_q", "flips_lost", "flips_gained")}
    out["diff"] = out["acc_q"] - out["acc_p"]
    gap_mean = (f.columns["acc_q"] - f.columns["acc_p"])[:, 0]
    out["se_coupled"], out["se_uncoupled"] = standard_errors(
        gap_mean, f.columns["gap_var"][:, 0], f.columns["sum_var"][:, 0], f.strata,
        f.replicates, counts)
    out["by_t"] = ratio(m["by_t_num"], m["by_t_den"])
    out["p_diverged"] = m["by_t_den"]
    return out


def _result(model: str, action: str, f: TaskFeatures, counts: np.ndarray, alpha: float,
            weights: np.ndarray) -> tuple[TaskResult, dict, dict]:
    point = {k: v[0] for k, v in _stats(f, weights, np.ones((1, f.doc_ids.size))).items()}
    draws = _stats(f, weights, counts)
    stats = {k: interval(point[k], draws[k], alpha) for k in TASK_STATS}
    return TaskResult(model, action, int(f.doc_ids.size), stats), point, draws


@dataclass(frozen=True)
class TaskOutcomes:
    """One model's task results: per action, by divergence time, and per stratum."""

    actions: tuple[TaskResult, ...] = ()
    by_divergence: tuple[TaskDivergence, ...] = ()
    strata: dict[str, tuple[TaskResult, ...]] = dataclasses.field(default_factory=dict)
    documents: int = 0  # scored documents

    def attach(self, strata: Sequence[StratumResult]) -> list[StratumResult]:
        """``strata`` with each stratum's task results filled in."""
        return [dataclasses.replace(s, task=self.strata.get(s.stratum, ())) for s in strata]


def task_outcomes(
    model: str, replicates: pd.DataFrame, actions: Sequence[str], doc_ids: np.ndarray,
    horizon: int, draws: int, alpha: float, seed: int,
) -> TaskOutcomes:
    """Task outcomes of ``model``'s ``actions`` over the scored ones among ``doc_ids``.

    ``replicates`` are the model's replicate records (all actions). A document counts when it
    is scored under every action; none scored gives an empty result.
    """
    scored = set(doc_ids.tolist())
    for a in actions:
        scored &= set(scored_documents(replicates[replicates["action"] == a]).tolist())
    ids = np.array(sorted(scored), dtype=object)
    if ids.size == 0:
        return TaskOutcomes()
    feats = {a: task_features(replicates[replicates["action"] == a], ids, horizon)
             for a in actions}
    strata = next(iter(feats.values())).strata
    counts = stratified_counts(strata, draws, seed)
    weights = stratum_weights(pd.Series(strata))
    results, curves = [], []
    for a, f in feats.items():
        result, point, boot = _result(model, a, f, counts, alpha, weights)
        results.append(result)
        curves.append(TaskDivergence(model, a, curve(point["by_t"], boot["by_t"], alpha),
                                     tuple(point["p_diverged"].tolist())))
    per_stratum = {}
    for label in sorted(set(strata.tolist()), key=str):
        members = np.flatnonzero(strata == label)
        per_stratum[str(label)] = tuple(
            _result(model, a, _subset(f, members), counts[:, members], alpha,
                    np.full(members.size, 1.0 / members.size))[0]
            for a, f in feats.items())
    return TaskOutcomes(tuple(results), tuple(curves), per_stratum, int(ids.size))


def _subset(f: TaskFeatures, rows: np.ndarray) -> TaskFeatures:
    return TaskFeatures(f.doc_ids[rows], f.strata[rows],
                        {k: v[rows] for k, v in f.columns.items()}, f.replicates)
