"""Aggregate prediction of a full-horizon contrast from short observations (method, section 9).

Development and evaluation documents are disjoint. The target is each document's per-action
full-horizon risk: by default the rollout TV ``R_tv = (1/H) sum_t delta_t`` (``target="tv"``,
the paper's Table 4 "full-H rollout-TV gap"), or the token-mismatch fraction ``R``
(``target="tokens"``). For each observation type (:mod:`kvdrift.analysis.observations`),
six-fold cross-validation over development documents picks, among three predictors of the
target, the one with the lowest document-level mean squared error of the paired contrast
``R(a) - R(b)``:

- ``cell_mean``: the mean target of training documents in the same stratum and action
  (the action's mean where the stratum has no training document);
- ``flat``: the observation itself, uncalibrated (``F``, or the window's mean mismatch);
- ``ridge``: :func:`kvdrift.analysis.ridge.fit_ridge` (alpha = 10) on stratum x action cell
  indicators plus the observation's features, so that ridge holds the cell-mean predictor
  as a special case and can predict a contrast that differs by stratum (a stratum without
  training documents gets the average over training strata of its action's cells).

Each action's prediction is clipped to [0, 1] before the contrast. The selected predictor,
refitted on all development documents, predicts the evaluation documents; the error
``e = Delta R - predicted Delta R`` (strata weighted equally) gets a document-bootstrap
interval at level ``1 - alpha/k`` (k = models x observation types), an equivalence
decision against a margin, and the MAE and RMSE of the documents' errors, weighted as the
error estimate is (strata equally, documents equally within a stratum; ``mae``, ``rmse``)
and, beside them, with every document weighted equally (``mae_documents``,
``rmse_documents``; the two agree when strata have equal numbers of documents). The
supporting contrasts (the
full-horizon gap, the observed gap and their difference) are descriptive: pointwise
intervals at ``1 - alpha`` (the paper's Table 4: 95%).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvdrift import checks
from kvdrift.analysis.bootstrap import (
    percentile_interval,
    stratified_counts,
    stratum_weights,
    weighted_means,
)
from kvdrift.analysis.endpoints import parse_endpoint
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.observations import Observation, document_observations, observation_types
from kvdrift.analysis.results import interval_columns
from kvdrift.analysis.ridge import fit_ridge
from kvdrift.notebook import HtmlTable

PREDICTORS = ("cell_mean", "flat", "ridge")
FOLDS = 6
RIDGE_ALPHA = 10.0
TARGETS = {"tv": "R_tv", "tokens": "R"}
"""``--target``: the observation column each reads (rollout TV, the default, or mismatch)."""


def _with_level(iv: Interval) -> dict:
    return iv.to_json() | {"level": iv.level}


@dataclass(frozen=True)
class ActionContrast:
    """``R(a) - R(b)`` between two actions."""

    a: str
    b: str

    @property
    def text(self) -> str:
        return f"{self.a} - {self.b}"


def parse_contrast(text: str) -> ActionContrast:
    """Read ``"R(a) - R(b)"`` or its shorthand ``"a - b"`` (:func:`parse_endpoint`'s grammar)."""
    e = parse_endpoint(text)
    if e.minus is None or (e.stat, e.minus[0]) != ("R", "R"):
        raise ValueError(f"predict reads a contrast of risks; got {text.strip()!r}; write "
                         "'R(a) - R(b)' or 'a - b', e.g. 'snapkv-half - recent-half'")
    return ActionContrast(e.action, e.minus[1])


@dataclass(frozen=True)
class ObservationResult:
    """One model x observation type: the selected predictor and its evaluation error."""

    observation: str
    label: str
    selected: str
    cv_mse: Mapping[str, float]
    error: Interval
    decision: str
    mae: float  # strata weighted equally, as the error estimate
    rmse: float
    supporting: Mapping[str, Interval]
    mae_documents: float = float("nan")  # every document weighted equally
    rmse_documents: float = float("nan")

    def to_json(self) -> dict:
        return {"observation": self.observation, "label": self.label,
                "selected": self.selected, "cv_mse": dict(self.cv_mse),
                "error": _with_level(self.error), "decision": self.decision, "mae": self.mae,
                "rmse": self.rmse, "mae_documents": self.mae_documents,
                "rmse_documents": self.rmse_documents,
                "supporting": {k: _with_level(v) for k, v in self.supporting.items()}}


@dataclass(frozen=True)
class ModelPrediction:
    """One model's results, one per observation type, and notes."""

    model: str
    development_documents: int
    evaluation_documents: int
    observations: tuple[ObservationResult, ...]
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"model": self.model, "development_documents": self.development_documents,
                "evaluation_documents": self.evaluation_documents,
                "observations": [o.to_json() for o in self.observations],
                "notes": list(self.notes)}


@dataclass(frozen=True, repr=False)  # HtmlTable's short repr
class PredictionResult(HtmlTable):
    """What :func:`predict_study` returns: settings and one :class:`ModelPrediction` per model."""

    contrast: str
    window: int
    margin: float
    alpha: float
    alpha_adjusted: float
    cells: int
    folds: int
    ridge_alpha: float
    bootstrap: int
    models: tuple[ModelPrediction, ...]
    target: str = "tv"

    def to_json(self) -> dict:
        """The structure ``kvdrift predict --json`` prints."""
        return {"contrast": self.contrast, "target": self.target, "window": self.window,
                "margin": self.margin,
                "alpha": self.alpha, "alpha_adjusted": self.alpha_adjusted,
                "cells": self.cells, "folds": self.folds, "ridge_alpha": self.ridge_alpha,
                "bootstrap": self.bootstrap, "models": [m.to_json() for m in self.models]}

    def to_frame(self) -> pd.DataFrame:
        """One row per model x observation type: ``model``, ``observation``, ``selected``,
        ``error`` with ``error_lo``/``error_hi``, ``decision``, ``mae``, ``rmse`` (strata
        weighted equally), ``mae_documents``, ``rmse_documents`` (documents equally), then the
        supporting contrasts with ``_lo``/``_hi``."""
        rows = []
        for m in self.models:
            for o in m.observations:
                rows.append({"model": m.model, "observation": o.observation,
                             "selected": o.selected}
                            | interval_columns({"error": o.error})
                            | {"decision": o.decision, "mae": o.mae, "rmse": o.rmse,
                               "mae_documents": o.mae_documents,
                               "rmse_documents": o.rmse_documents}
                            | interval_columns(o.supporting))
        return pd.DataFrame(rows)


def equivalence(lo: float, hi: float, margin: float) -> str:
    """Equivalent if ``[lo, hi]`` lies within ``[-margin, margin]``, Not equivalent if it lies
    wholly outside it, else Unresolved."""
    if -margin <= lo and hi <= margin:
        return "Equivalent"
    if hi < -margin or lo > margin:
        return "Not equivalent"
    return "Unresolved"


def assign_folds(doc_ids: np.ndarray, strata: np.ndarray, folds: int = FOLDS) -> np.ndarray:
    """Fold index per document: round-robin over documents sorted by (stratum, id), so each
    fold draws from every stratum in turn. Deterministic."""
    order = np.lexsort((np.asarray(doc_ids, dtype=str), np.asarray(strata, dtype=str)))
    fold = np.empty(len(doc_ids), dtype=int)
    fold[order] = np.arange(len(doc_ids)) % folds
    return fold


def _design(rows: pd.DataFrame, strata: list[str], actions: list[str],
            obs: Observation) -> np.ndarray:
    """Stratum x action cell indicators (stratum-major), then the observation's features.

    A row whose stratum is not in ``strata`` gets ``1 / len(strata)`` in each cell of its
    action: its prediction is the average over training strata (the model is affine).
    """
    known = rows["stratum"].isin(strata).to_numpy()
    ind = []
    for s in strata:
        for a in actions:
            is_action = (rows["action"] == a).to_numpy(float)
            ind.append(np.where(known, is_action * (rows["stratum"] == s).to_numpy(float),
                                is_action / len(strata)))
    return np.column_stack(ind + [rows[f].to_numpy(float) for f in obs.features])


def predict_rows(name: str, train: pd.DataFrame, test: pd.DataFrame,
                 obs: Observation) -> np.ndarray:
    """Predicted ``R`` for each row of ``test`` from predictor ``name`` fitted on ``train``."""
    checks.choice(name, "predictor", PREDICTORS)
    if name == "flat":
        return test[obs.flat].to_numpy(float)
    if name == "cell_mean":
        cell = train.groupby(["stratum", "action"])["R"].mean()
        action = train.groupby("action")["R"].mean()
        keys = pd.MultiIndex.from_frame(test[["stratum", "action"]])
        pred = cell.reindex(keys).to_numpy(float)
        fallback = action.reindex(test["action"]).to_numpy(float)
        return np.where(np.isnan(pred), fallback, pred)
    strata = sorted(train["stratum"].unique())  # ridge
    actions = sorted(train["action"].unique())
    fit = fit_ridge(_design(train, strata, actions, obs), train["R"].to_numpy(float),
                    RIDGE_ALPHA)
    return fit.predict(_design(test, strata, actions, obs))


def _contrast_table(rows: pd.DataFrame, values: np.ndarray, c: ActionContrast) -> pd.Series:
    """Per-document ``value(a) - value(b)`` (indexed by doc_id)."""
    wide = rows.assign(value=values).pivot(index="doc_id", columns="action", values="value")
    return wide[c.a] - wide[c.b]


def predicted_contrast(name: str, train: pd.DataFrame, test: pd.DataFrame, obs: Observation,
                       c: ActionContrast) -> pd.Series:
    """Per-document predicted contrast, each action's prediction clipped to [0, 1] first."""
    pred = np.clip(predict_rows(name, train, test, obs), 0.0, 1.0)
    return _contrast_table(test, pred, c)


def cross_validate(rows: pd.DataFrame, obs: Observation, c: ActionContrast,
                   folds: int = FOLDS) -> dict[str, float]:
    """Document-level paired-contrast MSE of each predictor under ``folds``-fold CV."""
    docs = rows.drop_duplicates("doc_id")
    fold_of = pd.Series(assign_folds(docs["doc_id"].to_numpy(), docs["stratum"].to_numpy(),
                                     folds), index=docs["doc_id"].to_numpy())
    fold = rows["doc_id"].map(fold_of).to_numpy()
    actual = _contrast_table(rows, rows["R"].to_numpy(float), c)
    mse = {}
    for name in PREDICTORS:
        errors = []
        for k in range(folds):
            train, test = rows[fold != k], rows[fold == k]
            errors.append(actual.loc[test["doc_id"].unique()]
                          - predicted_contrast(name, train, test, obs, c))
        err = pd.concat(errors)
        mse[name] = float((err ** 2).mean())
    return mse


def select(mse: dict[str, float]) -> str:
    """The predictor with the lowest CV error (ties: the first in :data:`PREDICTORS`)."""
    return min(PREDICTORS, key=lambda name: (mse[name], PREDICTORS.index(name)))


def _docs(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.drop_duplicates("doc_id").set_index("doc_id").sort_index()


def _intervals(columns: dict[str, pd.Series], docs: pd.DataFrame, alpha: float, draws: int,
               seed: int) -> dict[str, Interval]:
    """Stratum-weighted means of per-document columns with document-bootstrap intervals."""
    cols = {k: v.loc[docs.index].to_numpy(float)[:, None] for k, v in columns.items()}
    weights = stratum_weights(docs["stratum"].reset_index(drop=True))
    counts = stratified_counts(docs["stratum"].to_numpy(), draws, seed)
    point, boot = weighted_means(cols, weights), weighted_means(cols, weights, counts)
    out = {}
    for k in cols:
        lo, hi = percentile_interval(boot[k][:, 0], alpha)
        out[k] = Interval(float(point[k][0]), float(lo), float(hi), 1 - alpha)
    return out


def evaluate(dev: pd.DataFrame, ev: pd.DataFrame, obs: Observation, c: ActionContrast, *,
             margin: float, alpha: float, draws: int, seed: int,
             folds: int = FOLDS, support_alpha: float | None = None) -> ObservationResult:
    """CV selection on ``dev``, then the selected predictor's error on ``ev`` (one model).

    The error interval is at ``1 - alpha`` (the caller's family-adjusted level); the
    supporting contrasts at ``1 - support_alpha`` (pointwise; default: ``alpha``).
    """
    mse = cross_validate(dev, obs, c, folds)
    chosen = select(mse)
    actual = _contrast_table(ev, ev["R"].to_numpy(float), c)
    error = actual - predicted_contrast(chosen, dev, ev, obs, c)
    observed = _contrast_table(ev, ev[obs.flat].to_numpy(float), c)
    gap = "fixed_history_gap" if obs.name == "fixed_history" else "flat_extrapolation_gap"
    minus = "full_minus_fixed" if obs.name == "fixed_history" else "full_minus_flat"
    docs = _docs(ev)
    err = _intervals({"error": error}, docs, alpha, draws, seed)["error"]
    stats = _intervals({"full_horizon_gap": actual, gap: observed, minus: actual - observed},
                       docs, alpha if support_alpha is None else support_alpha, draws, seed)
    weights = stratum_weights(docs["stratum"].reset_index(drop=True))
    e = error.loc[docs.index].to_numpy(float)
    return ObservationResult(
        obs.name, obs.label, chosen, mse, err, equivalence(err.lo, err.hi, margin),
        float(weights @ np.abs(e)), float(np.sqrt(weights @ e ** 2)), stats,
        float(np.abs(e).mean()), float(np.sqrt((e ** 2).mean())))


def _check_cohorts(dev: pd.DataFrame, ev: pd.DataFrame, c: ActionContrast, folds: int) -> None:
    for what in ("model", "action"):
        a, b = sorted(dev[what].unique()), sorted(ev[what].unique())
        if a != b:
            raise ValueError(f"the cohorts differ in {what}s: development has {', '.join(a)}; "
                             f"evaluation has {', '.join(b)}")
    actions = sorted(dev["action"].unique())
    for name in (c.a, c.b):
        checks.named_action(name, f"contrast {c.text!r}", "the cohorts", actions)
    shared = sorted(set(dev["doc_id"]) & set(ev["doc_id"]))
    if shared:
        raise ValueError(f"development and evaluation documents must be disjoint; both have "
                         f"{len(shared)} (e.g. {shared[0]!r})")
    for model, rows in dev.groupby("model"):
        n = rows["doc_id"].nunique()
        if n < folds:
            raise ValueError(f"{folds}-fold cross-validation needs at least {folds} development "
                             f"documents; model {model!r} has {n}")


def _complete(rows: pd.DataFrame) -> pd.DataFrame:
    """Documents finished for every action of their model (the paired contrast needs all)."""
    n_actions = rows.groupby("model")["action"].transform("nunique")
    per_doc = rows.groupby(["model", "doc_id"])["action"].transform("nunique")
    return rows[per_doc == n_actions]


def predict_study(
    dev_records: tuple[pd.DataFrame, pd.DataFrame],
    eval_records: tuple[pd.DataFrame, pd.DataFrame],
    contrast: str,
    *,
    window: int = 32,
    margin: float = 0.02,
    alpha: float = 0.05,
    draws: int = 10000,
    seed: int = 0,
    folds: int = FOLDS,
    on_cell: Callable[[str, str], None] | None = None,
    temperatures: tuple[float | None, float | None] = (None, None),
    target: str = "tv",
) -> PredictionResult:
    """The whole prediction analysis; records are (steps, replicates).

    ``target``: ``"tv"`` (rollout TV, the paper's, default) or ``"tokens"`` (mismatch
    fraction); ``draws`` defaults to the paper's confirmatory 10,000.

    ``temperatures`` are the development and evaluation runs' sampling temperatures (from
    their run metadata; None: unknown); cohorts at different temperatures are refused.
    """
    c = parse_contrast(contrast)
    checks.number(margin, "margin", 0, open_lo=True)
    if None not in temperatures and temperatures[0] != temperatures[1]:
        raise ValueError(f"the cohorts were sampled at different temperatures: development "
                         f"{temperatures[0]:g}, evaluation {temperatures[1]:g}; run both at "
                         "one temperature")
    checks.alpha(alpha)
    checks.choice(target, "target", TARGETS)
    dev = _complete(document_observations(*dev_records, window))
    ev = _complete(document_observations(*eval_records, window))
    column = TARGETS[target]
    for rows, role in ((dev, "development"), (ev, "evaluation")):
        if rows[column].isna().any():
            raise ValueError(f"the {role} records hold no per-step delta, which the rollout-"
                             "TV target needs; pass target 'tokens' (--target tokens)")
    dev, ev = dev.assign(R=dev[column]), ev.assign(R=ev[column])
    horizons = {int(dev_records[1]["horizon"].max()), int(eval_records[1]["horizon"].max())}
    if len(horizons) != 1:
        raise ValueError(f"the cohorts have different horizons H: {sorted(horizons)}")
    _check_cohorts(dev, ev, c, folds)
    models = list(dict.fromkeys(dev["model"]))
    obs_types = observation_types(window)
    k = len(models) * len(obs_types)
    level = alpha / k
    results = []
    for model in models:
        d, e = dev[dev["model"] == model], ev[ev["model"] == model]
        sizes = _docs(e)["stratum"].value_counts()
        lonely = sorted(str(k) for k, v in sizes.items() if v < 2)
        notes = []
        if lonely:
            notes.append(
                f"evaluation strata with a single document ({', '.join(lonely)}) contribute no "
                "between-document variation, so intervals understate uncertainty")
        observations = []
        for obs in obs_types:
            if on_cell:
                on_cell(model, obs.label)
            observations.append(
                evaluate(d, e, obs, c, margin=margin, alpha=level, draws=draws, seed=seed,
                         folds=folds, support_alpha=alpha))
        results.append(ModelPrediction(model, int(d["doc_id"].nunique()),
                                       int(e["doc_id"].nunique()), tuple(observations),
                                       tuple(notes)))
    return PredictionResult(c.text, window, margin, alpha, level, k, folds, RIDGE_ALPHA, draws,
                            tuple(results), target)
