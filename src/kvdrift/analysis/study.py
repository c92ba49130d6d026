"""A study's statistics: every quantity per action, contrasts, bounds and endpoints.

Documents are the unit and strata weigh equally (:mod:`kvdrift.analysis.summary`).
Intervals come from the document bootstrap, paired across actions
(:mod:`kvdrift.analysis.bootstrap`): pointwise percentile intervals for exploratory
quantities, Bonferroni-adjusted ones (alpha / k over the k prespecified endpoints, all
models together) for endpoints. The result is a :class:`~kvdrift.analysis.results.StudyAnalysis`
(its ``to_json()`` is ``analysis.json``), which the report renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvdrift import checks
from kvdrift.analysis.agreement import cohort_support, local_agreement_result
from kvdrift.analysis.bootstrap import stratified_counts, stratum_weights, weighted_means
from kvdrift.analysis.bounds import certified_order, hoeffding_enclosure, sharp_interval
from kvdrift.analysis.clocks import two_clock_entries
from kvdrift.analysis.endpoints import Endpoint, parse_endpoint
from kvdrift.analysis.eos import eos_contrast_entries, eos_split_entry
from kvdrift.analysis.features import DocFeatures, action_features, single_value
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.lags import LagWindows
from kvdrift.analysis.memory import memory_means
from kvdrift.analysis.quantities import (
    action_pairs,
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
from kvdrift.records.schema import depth_columns, record_depths

__all__ = ["CONFIRMATORY_DRAWS", "EXPLORATORY_DRAWS", "AnalysisOptions", "analyze"]


EXPLORATORY_DRAWS = 2000
CONFIRMATORY_DRAWS = 10000
"""The paper's bootstrap draws: 2,000 exploratory, 10,000 confirmatory (a study with
prespecified endpoints, and ``predict``)."""


@dataclass(frozen=True)
class AnalysisOptions:
    """How to turn records into conclusions.

    ``bootstrap`` left None takes the paper's default: :data:`CONFIRMATORY_DRAWS` when the
    study prespecifies endpoints, else :data:`EXPLORATORY_DRAWS`.
    """

    bootstrap: int | None = None
    alpha: float = 0.05
    endpoints: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.bootstrap is None:
            object.__setattr__(self, "bootstrap", CONFIRMATORY_DRAWS if self.endpoints
                               else EXPLORATORY_DRAWS)
        if isinstance(self.bootstrap, bool) or not isinstance(self.bootstrap, int) \
                or self.bootstrap < 1:
            raise ValueError(f"bootstrap draws must be an integer >= 1; got {self.bootstrap!r}")
        checks.alpha(self.alpha)
        for text in self.endpoints:
            parse_endpoint(text)

    @classmethod
    def from_table(cls, table: Mapping[str, object]) -> AnalysisOptions:
        """The options of an ``[analysis]`` table (a study file's, or the one a study
        directory recorded); its keys are checked by the caller."""
        return cls(**(dict(table) | {"endpoints": tuple(table.get("endpoints", ()))}))


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


def analyze(
    steps: pd.DataFrame, replicates: pd.DataFrame, options: AnalysisOptions,
    meta: dict | None = None,
) -> StudyAnalysis:
    """The full study analysis; ``meta`` (config, versions, temperature) is kept in its meta."""
    if replicates.empty:
        raise ValueError("no finished units to analyze")
    H = int(single_value(replicates, "horizon"))
    estimator = str(single_value(replicates, "estimator"))
    windows = LagWindows.for_horizon(H) if estimator == "rollout" else None
    endpoints = [parse_endpoint(t) for t in options.endpoints]
    models = list(dict.fromkeys(replicates["model"]))
    family = max(1, len(endpoints) * len(models))
    out: dict[str, list] = {k: [] for k in (
        "actions", "contrasts", "endpoints", "certified_order", "strata", "eos_contrasts",
        "local_agreement", "cohort_support", "task", "task_by_divergence", "teacher_forced",
        "speculative", "teacher_forced_contrasts", "speculative_contrasts", "two_clocks")}
    documents: dict[str, int] = {}
    notes: list[str] = []
    unforced: list[str] = []  # rollout models whose records lack the teacher-forced columns
    for model in models:
        reps_m = replicates[replicates["model"] == model]
        steps_m = steps[steps["model"] == model]
        actions = list(dict.fromkeys(reps_m["action"]))
        feats = _common_documents({
            a: action_features(steps_m[steps_m["action"] == a], reps_m[reps_m["action"] == a],
                               windows)
            for a in actions})
        strata = next(iter(feats.values())).strata
        weights = stratum_weights(pd.Series(strata))
        counts = stratified_counts(strata, options.bootstrap, options.seed)
        means = {a: weighted_means(f.columns, weights) for a, f in feats.items()}
        boot_means = {a: weighted_means(f.columns, weights, counts) for a, f in feats.items()}
        point = {a: derive(m, windows) for a, m in means.items()}
        boot = {a: derive(m, windows) for a, m in boot_means.items()}
        sizes = pd.Series(strata).value_counts().sort_index()
        documents = {str(k): int(v) for k, v in sizes.items()}  # the last model's counts
        lonely = [str(k) for k, v in sizes.items() if v < 2]
        if lonely:
            notes.append(
                f"{model}: strata with a single document ({', '.join(lonely)}) contribute no "
                "between-document variation, so intervals understate uncertainty; use at "
                "least two documents per stratum.")
        enclosures: dict[int, dict[str, Interval]] = {}
        for a, f in feats.items():
            p, b = point[a], boot[a]
            bounds = []
            if "branch_cohort" in f.columns:  # rollouts with lag windows
                out["local_agreement"].append(local_agreement_result(
                    model, a, means[a], boot_means[a], windows, options.alpha))
                out["cohort_support"].append(cohort_support(
                    model, a, reps_m[reps_m["action"] == a], f.doc_ids, windows))
            for L in record_depths(f.columns):
                observed, capacity = depth_columns(L)
                lower = f.columns[observed][:, 0]
                upper = lower + f.columns[capacity][:, 0]
                sharp = sharp_interval(float(p[observed]), max(0.0, float(p[capacity])))
                upper = np.minimum(upper, 1.0)
                enc = hoeffding_enclosure(lower, upper, options.alpha, weights)
                # For ordering, every action's enclosure must hold at once: alpha / actions.
                enclosures.setdefault(L, {})[a] = hoeffding_enclosure(
                    lower, upper, options.alpha / len(actions), weights)
                bounds.append(Bound(L, sharp, enc))
            out["actions"].append(ActionResult(
                model, a, int(len(f.doc_ids)), action_scalars(p, b, options.alpha),
                {k: curve(p[k], b[k], options.alpha)
                 for k in ("timing_cdf", "expected_delta", "lag_profile",
                           "lag_profile_strict") if k in p},
                eos_split_entry(means[a], boot_means[a], options.alpha)
                if "eos_R" in f.columns else None,
                tuple(bounds),
                **memory_means(reps_m[reps_m["action"] == a], f.doc_ids, weights)))
        for a, b_name in action_pairs(actions):
            out["contrasts"].append(contrast_result(
                model, (a, b_name), (point[a], point[b_name]), (boot[a], boot[b_name]),
                options.alpha, H))
        if all("eos_R" in f.columns for f in feats.values()):
            out["eos_contrasts"].extend(
                eos_contrast_entries(model, means, boot_means, options.alpha))
        doc_ids = next(iter(feats.values())).doc_ids
        task = task_outcomes(model, reps_m, actions, doc_ids, H, options.bootstrap,
                             options.alpha, options.seed)
        out["task"] += task.actions
        out["task_by_divergence"] += task.by_divergence
        if 0 < task.documents < doc_ids.size:
            notes.append(f"{model}: task outcomes are over the {task.documents} of "
                         f"{doc_ids.size} documents that have an expected answer.")
        by_stratum = stratum_derived(feats, counts, windows)
        out["strata"].extend(task.attach(
            stratum_results(model, feats, counts, windows, H, options.alpha, by_stratum)))
        out["two_clocks"] += two_clock_entries(model, "all", point, boot, options.alpha, H)
        for d in by_stratum:
            out["two_clocks"] += two_clock_entries(model, d.label, d.point, d.draws,
                                                   options.alpha, H)
        for key, entries in reading_entries(model, feats, weights, counts,
                                            options.alpha).items():
            out[key].extend(entries)
        if estimator == "rollout" and not any(f.model == model for f in out["teacher_forced"]):
            unforced.append(model)
        for e in endpoints:
            missing = [x for x in e.actions if x not in point]
            if missing:
                raise ValueError(f"endpoint {e.text!r} names action {missing[0]!r}, which model "
                                 f"{model!r} did not run; actions: {', '.join(actions)}")
            level = options.alpha / family
            iv = interval(_endpoint_value(e, point), _endpoint_value(e, boot), level)
            out["endpoints"].append(EndpointResult(model, e.text, iv, level))
        for L, encs in sorted(enclosures.items()):
            out["certified_order"] += [CertifiedOrder(model, L, better, worse)
                                       for better, worse in certified_order(encs)]
    if estimator == "swrb":
        notes.append(SWRB_REASON[0].upper() + SWRB_REASON[1:] + ".")
    notes += reading_notes(estimator, unforced)
    study_meta = StudyMeta(
        estimator=estimator, horizon=H,
        replicates=int(replicates.groupby(["model", "action", "doc_id"]).size().max()),
        bootstrap=options.bootstrap, alpha=options.alpha, documents=documents,
        notes=tuple(notes), run=dict(meta or {}))
    return StudyAnalysis(study_meta, windows, **{k: tuple(v) for k, v in out.items()})
