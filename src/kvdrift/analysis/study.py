"""A study's statistics: every quantity per action, contrasts, bounds and endpoints.

Documents are the unit and strata weigh equally
(:func:`kvdrift.analysis.bootstrap.stratum_weights`). Intervals come from the document
bootstrap, paired across actions (:mod:`kvdrift.analysis.bootstrap`): pointwise percentile
intervals for exploratory quantities, Bonferroni-adjusted ones (alpha / k over the k
prespecified endpoints, all models together) for endpoints. The result is a
:class:`~kvdrift.analysis.results.StudyAnalysis` (its ``to_json()`` is ``analysis.json``),
which the report renders.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvdrift import checks
from kvdrift.analysis.agreement import cohort_support, local_agreement_result
from kvdrift.analysis.bootstrap import stratified_counts, stratum_weights, weighted_means
from kvdrift.analysis.bounds import certified_order, hoeffding_enclosure, sharp_interval
from kvdrift.analysis.clocks import two_clock_entries
from kvdrift.analysis.endpoints import Endpoint, action_pairs, parse_endpoint
from kvdrift.analysis.eos import eos_contrast_entries, eos_split_entry
from kvdrift.analysis.features import DocFeatures, action_features, single_value
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.lags import LagWindows
from kvdrift.analysis.memory import compression_positions, memory_means
from kvdrift.analysis.options import CONFIRMATORY_DRAWS, EXPLORATORY_DRAWS, AnalysisOptions
from kvdrift.analysis.quantities import (
    action_scalars,
    contrast_result,
    curve,
    derive,
    interval,
)
from kvdrift.analysis.readings import reading_entries, reading_notes
from kvdrift.analysis.results import (
    ActionResult,
    Bound,
    CertifiedOrder,
    EndpointResult,
    StudyAnalysis,
    StudyMeta,
)
from kvdrift.analysis.strata import stratum_derived, stratum_results
from kvdrift.analysis.task import SWRB_REASON, task_outcomes
from kvdrift.records.schema import recorded_estimator

__all__ = ["CONFIRMATORY_DRAWS", "EXPLORATORY_DRAWS", "AnalysisOptions", "analyze"]


def _common_documents(features: dict[str, DocFeatures]) -> dict[str, DocFeatures]:
    shared = None
    for f in features.values():
        shared = set(f.doc_ids) if shared is None else shared & set(f.doc_ids)
    ids = np.array(sorted(shared or ()))
    if ids.size == 0:
        raise ValueError("no document has finished for every action of this model yet")
    return {a: f.subset(ids) for a, f in features.items()}


def _endpoint_value(e: Endpoint, derived: dict[str, dict[str, np.ndarray]]) -> np.ndarray:
    value = derived[e.action][e.stat]
    if e.minus is not None:
        value = value - derived[e.minus[1]][e.minus[0]]
    return value


@dataclass(frozen=True)
class ModelSample:
    """One model's sample, which every section reads: its records, the features of the
    documents every action finished (``features``), the document weights and bootstrap
    counts, and the weighted means and derived quantities of each action, at the point
    (``means``, ``point``) and on every draw (``boot_means``, ``boot``); ``by_stratum`` the
    same per stratum."""

    model: str
    replicates: pd.DataFrame
    actions: list[str]
    features: dict[str, DocFeatures]
    weights: np.ndarray
    counts: np.ndarray
    means: dict[str, dict[str, np.ndarray]]
    boot_means: dict[str, dict[str, np.ndarray]]
    point: dict[str, dict[str, np.ndarray]]
    boot: dict[str, dict[str, np.ndarray]]
    by_stratum: list

    @property
    def doc_ids(self) -> np.ndarray:
        return next(iter(self.features.values())).doc_ids

    @property
    def strata(self) -> np.ndarray:
        return next(iter(self.features.values())).strata

    @property
    def stratum_sizes(self) -> pd.Series:
        """Documents per stratum, strata sorted."""
        return pd.Series(self.strata).value_counts().sort_index()

    def action_replicates(self, action: str) -> pd.DataFrame:
        return self.replicates[self.replicates["action"] == action]


def model_sample(model: str, steps: pd.DataFrame, replicates: pd.DataFrame,
                 windows: LagWindows | None, options: AnalysisOptions) -> ModelSample:
    """The sample of ``model`` from the study's records."""
    reps = replicates[replicates["model"] == model]
    steps = steps[steps["model"] == model]
    actions = list(dict.fromkeys(reps["action"]))
    features = _common_documents({
        a: action_features(steps[steps["action"] == a], reps[reps["action"] == a], windows)
        for a in actions})
    strata = next(iter(features.values())).strata
    weights = stratum_weights(pd.Series(strata))
    counts = stratified_counts(strata, options.bootstrap, options.seed)
    means = {a: weighted_means(f.columns, weights) for a, f in features.items()}
    boot_means = {a: weighted_means(f.columns, weights, counts) for a, f in features.items()}
    return ModelSample(
        model, reps, actions, features, weights, counts, means, boot_means,
        point={a: derive(m, windows) for a, m in means.items()},
        boot={a: derive(m, windows) for a, m in boot_means.items()},
        by_stratum=stratum_derived(features, counts, windows))


def lonely_strata_notes(s: ModelSample) -> list[str]:
    """A note when some stratum has a single document."""
    lonely = [str(k) for k, v in s.stratum_sizes.items() if v < 2]
    if not lonely:
        return []
    return [f"{s.model}: strata with a single document ({', '.join(lonely)}) contribute no "
            "between-document variation, so intervals understate uncertainty; use at "
            "least two documents per stratum."]


def bounds(s: ModelSample, alpha: float
           ) -> tuple[dict[str, tuple[Bound, ...]], dict[int, dict[str, Interval]]]:
    """Each action's bounds per recorded depth (the sharp interval and the Hoeffding
    enclosure), and the enclosures at ``alpha / actions`` that the certified order needs
    (every action's must hold at once)."""
    per_action: dict[str, tuple[Bound, ...]] = {}
    enclosures: dict[int, dict[str, Interval]] = {}
    for a, f in s.features.items():
        out = []
        for L, lower, capacity in zip(f.depths.depths, f.depths.observed, f.depths.capacity,
                                      strict=True):
            upper = np.minimum(lower + capacity, 1.0)
            point = weighted_means({"R_L": lower[:, None], "B_L": capacity[:, None]}, s.weights)
            sharp = sharp_interval(float(point["R_L"][0]), max(0.0, float(point["B_L"][0])))
            enc = hoeffding_enclosure(lower, upper, alpha, s.weights)
            enclosures.setdefault(L, {})[a] = hoeffding_enclosure(
                lower, upper, alpha / len(s.actions), s.weights)
            out.append(Bound(L, sharp, enc))
        per_action[a] = tuple(out)
    return per_action, enclosures


def action_section(s: ModelSample, action_bounds: dict[str, tuple[Bound, ...]],
                   alpha: float) -> dict[str, list]:
    """Every action's quantities, curves, EOS split, bounds and cache size."""
    out = []
    for a, f in s.features.items():
        p, b = s.point[a], s.boot[a]
        out.append(ActionResult(
            s.model, a, int(len(f.doc_ids)), action_scalars(p, b, alpha),
            {k: curve(p[k], b[k], alpha)
             for k in ("timing_cdf", "expected_delta", "lag_profile", "lag_profile_strict")
             if k in p},
            eos_split_entry(s.means[a], s.boot_means[a], alpha) if f.measured.branches
            else None,
            action_bounds[a],
            **memory_means(s.action_replicates(a), f.doc_ids, s.weights),
            compressions=compression_positions(s.action_replicates(a))))
    return {"actions": out}


def agreement_section(s: ModelSample, windows: LagWindows | None,
                      alpha: float) -> dict[str, list]:
    """Local agreement and cohort support of each action whose records have lag windows."""
    out: dict[str, list] = {"local_agreement": [], "cohort_support": []}
    for a, f in s.features.items():
        if windows is not None and f.measured.branches:
            out["local_agreement"].append(local_agreement_result(
                s.model, a, s.means[a], s.boot_means[a], windows, alpha))
            out["cohort_support"].append(cohort_support(
                s.model, a, s.action_replicates(a), f.doc_ids, windows))
    return out


def contrast_section(s: ModelSample, alpha: float, horizon: int) -> dict[str, list]:
    """Every pair of actions' decomposition contrast, and their EOS split when measured."""
    out = {"contrasts": [contrast_result(s.model, (a, b), (s.point[a], s.point[b]),
                                         (s.boot[a], s.boot[b]), alpha, horizon)
                         for a, b in action_pairs(s.actions)]}
    if all(f.measured.branches for f in s.features.values()):
        out["eos_contrasts"] = eos_contrast_entries(s.model, s.means, s.boot_means, alpha)
    return out


def task_section(s: ModelSample, horizon: int, windows: LagWindows | None,
                 options: AnalysisOptions) -> dict[str, list]:
    """Task outcomes overall, by divergence and (with every quantity) per stratum."""
    task = task_outcomes(s.model, s.replicates, s.actions, s.doc_ids, horizon,
                         options.bootstrap, options.alpha, options.seed)
    n = s.doc_ids.size
    notes = ([f"{s.model}: task outcomes are over the {task.documents} of {n} documents "
              "that have an expected answer."] if 0 < task.documents < n else [])
    return {"task": task.actions, "task_by_divergence": task.by_divergence, "notes": notes,
            "strata": task.attach(stratum_results(s.model, s.features, s.counts, windows,
                                                  horizon, options.alpha, s.by_stratum))}


def clock_section(s: ModelSample, alpha: float, horizon: int) -> dict[str, list]:
    """The two clocks over all documents, then per stratum."""
    out = two_clock_entries(s.model, "all", s.point, s.boot, alpha, horizon)
    for d in s.by_stratum:
        out += two_clock_entries(s.model, d.label, d.point, d.draws, alpha, horizon)
    return {"two_clocks": out}


def reading_section(s: ModelSample, rollouts: bool, alpha: float) -> dict[str, list]:
    """Teacher-forced and speculative readings; ``unforced`` names a rollout model whose
    records lack the teacher-forced columns."""
    out = reading_entries(s.model, s.features, s.weights, s.counts, alpha)
    forced = any(f.model == s.model for f in out.get("teacher_forced", ()))
    return out | {"unforced": [s.model] if rollouts and not forced else []}


def endpoint_section(s: ModelSample, endpoints: list[Endpoint], level: float
                     ) -> dict[str, list]:
    """The prespecified endpoints at the family's level."""
    out = []
    for e in endpoints:
        for name in e.actions:
            checks.named_action(name, f"endpoint {e.text!r}", f"model {s.model!r}", s.actions)
        iv = interval(_endpoint_value(e, s.point), _endpoint_value(e, s.boot), level)
        out.append(EndpointResult(s.model, e.text, iv, level))
    return {"endpoints": out}


def order_section(s: ModelSample, enclosures: dict[int, dict[str, Interval]]
                  ) -> dict[str, list]:
    """The certified order of actions at each depth."""
    return {"certified_order": [CertifiedOrder(s.model, L, better, worse)
                                for L, encs in sorted(enclosures.items())
                                for better, worse in certified_order(encs)]}


RESULT_KEYS = (
    "actions", "contrasts", "endpoints", "certified_order", "strata", "eos_contrasts",
    "local_agreement", "cohort_support", "task", "task_by_divergence", "teacher_forced",
    "speculative", "teacher_forced_contrasts", "speculative_contrasts", "two_clocks")
"""The lists of a :class:`StudyAnalysis`, each filled by one section."""


def analyze(
    steps: pd.DataFrame, replicates: pd.DataFrame, options: AnalysisOptions,
    meta: dict | None = None,
) -> StudyAnalysis:
    """The full study analysis; ``meta`` (config, versions, temperature) is kept in its meta.

    Per model, a :class:`ModelSample`, then the sections over it (actions, agreement,
    contrasts, task and strata, clocks, readings, endpoints, order), whose lists are
    assembled by keyword."""
    if replicates.empty:
        raise ValueError("no finished units to analyze")
    H = int(single_value(replicates, "horizon"))
    estimator = recorded_estimator(str(single_value(replicates, "estimator")))
    rollouts = estimator.complete_branches
    windows = LagWindows.for_horizon(H) if rollouts else None
    endpoints = [parse_endpoint(t) for t in options.endpoints]
    models = list(dict.fromkeys(replicates["model"]))
    level = options.alpha / max(1, len(endpoints) * len(models))
    out: dict[str, list] = {k: [] for k in (*RESULT_KEYS, "notes", "unforced")}
    documents: dict[str, int] = {}
    for model in models:
        s = model_sample(model, steps, replicates, windows, options)
        documents = {str(k): int(v) for k, v in s.stratum_sizes.items()}  # the last model's
        action_bounds, enclosures = bounds(s, options.alpha)
        for section in (
                {"notes": lonely_strata_notes(s)},
                agreement_section(s, windows, options.alpha),
                action_section(s, action_bounds, options.alpha),
                contrast_section(s, options.alpha, H),
                task_section(s, H, windows, options),
                clock_section(s, options.alpha, H),
                reading_section(s, rollouts, options.alpha),
                endpoint_section(s, endpoints, level),
                order_section(s, enclosures)):
            for key, entries in section.items():
                out[key] += entries
    notes = out.pop("notes")
    if not rollouts:
        notes.append(SWRB_REASON[0].upper() + SWRB_REASON[1:] + ".")
    notes += reading_notes(estimator, out.pop("unforced"))
    study_meta = StudyMeta(
        estimator=estimator.name, horizon=H,
        replicates=int(replicates.groupby(["model", "action", "doc_id"]).size().max()),
        bootstrap=options.bootstrap, alpha=options.alpha, documents=documents,
        notes=tuple(notes), run=dict(meta or {}))
    return StudyAnalysis(study_meta, windows, **{k: tuple(v) for k, v in out.items()})
