"""Sizing a study from a development run: documents per stratum and K for a target half-width.

A document-level quantity (or a paired contrast of two actions) estimated with ``n``
documents in each of ``S`` equally weighted strata and ``K`` replicates per document has
variance ``(sigma_b^2 + sigma_w^2 / K) / (S n)``: ``sigma_w^2`` is the within-document
(replicate) variance and ``sigma_b^2`` the between-document variance of the documents'
true means within strata, both averaged over strata. From a development run with ``K0``
replicates, ``sigma_w^2`` is the mean within-document sample variance and ``sigma_b^2``
the within-stratum variance of document means minus ``sigma_w^2 / K0`` (floored at 0).
A study costs ``S n (c_doc + K c_rep)`` seconds (``c_doc``: prefill and eviction of a
document, ``c_rep``: one replicate, both measured by the runner); the plan is the
cheapest ``(n, K)`` whose expected half-width ``z sqrt(variance)`` meets the target.

Targets are document-level means of one value per replicate (docs/method.md, section 9),
including the saturation ``S99``: per replicate ``(1/H) sum_t 1{delta_t > 0.99}``, read from
the step records (its replicate mean estimates the document's ``S_.99``, so the same
components apply). With ``endpoints = k`` the target is one of ``k`` prespecified endpoints
and its interval is Bonferroni-adjusted as the study's are: ``z`` at ``1 - alpha / (2k)``.

Rollouts against SWRB: a development run measures one estimator. The other is costed by
its kernel-pair evaluations per replicate (SWRB: the H-step scan plus a continuation of
``H - J`` steps, ``J`` distributed like the first mismatch given divergence; rollouts: H),
with the same variance as the measured one, an assumption that favours rollouts, since
SWRB's risk estimate never has a larger variance (``Var(naive) - Var(Z^R) >= 0``). The
plan also reports the break-even ratio: how many times smaller SWRB's within-document
variance must be for SWRB to be the cheaper plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from kvdrift import checks, limits
from kvdrift.analysis import registry
from kvdrift.analysis.endpoints import parse_endpoint
from kvdrift.analysis.features import SATURATION, single_value
from kvdrift.divergence import diverged
from kvdrift.notebook import HtmlTable
from kvdrift.records.schema import recorded_estimator

STEP_COLUMNS = ["model", "action", "doc_id", "replicate", "delta"]
MIN_DOCUMENTS = 2  # per stratum: fewer carries no between-document variation
MAX_REPLICATES = 4096


@dataclass(frozen=True)
class VarianceComponents:
    """Between- and within-document variance of one quantity, averaged over strata."""

    between: float
    within: float
    strata: int
    documents: int
    replicates: int


@dataclass(frozen=True)
class Design:
    """A study design and what it is expected to give."""

    documents_per_stratum: int
    replicates: int
    halfwidth: float
    seconds: float


@dataclass(frozen=True)
class CurrentDesign:
    """The development run's own design and the half-width it is expected to give."""

    documents_per_stratum: float
    replicates: int
    halfwidth: float


@dataclass(frozen=True)
class EstimatorComparison:
    """Rollouts against SWRB for a target.

    ``reason`` is set (and the rest None) when only rollouts can measure the target;
    otherwise ``assumption``, the kernel-pair evaluations per replicate, each estimator's
    plan under equal variance, and the break-even variance ratio (None: SWRB never wins).
    """

    cheaper: str
    assumption: str | None
    reason: str | None = None
    evaluations_per_replicate: Mapping[str, float] | None = None
    plans: Mapping[str, Design] | None = None
    break_even_variance_ratio: float | None = None

    def to_json(self) -> dict:
        if self.reason is not None:
            return {"cheaper": self.cheaper, "assumption": self.assumption,
                    "reason": self.reason}
        return {"cheaper": self.cheaper, "assumption": self.assumption,
                "evaluations_per_replicate": dict(self.evaluations_per_replicate or {}),
                "plans": {k: asdict(d) for k, d in (self.plans or {}).items()},
                "break_even_variance_ratio": self.break_even_variance_ratio}


@dataclass(frozen=True)
class ModelPlan:
    """One model's plan: measured variance and cost, the recommended and the current design."""

    model: str
    estimator: str
    variance: VarianceComponents
    setup_seconds: float
    replicate_seconds: float
    recommended: Design
    current: CurrentDesign
    notes: tuple[str, ...]
    comparison: EstimatorComparison

    def to_json(self) -> dict:
        return {"model": self.model, "estimator": self.estimator,
                "variance": asdict(self.variance), "setup_seconds": self.setup_seconds,
                "replicate_seconds": self.replicate_seconds,
                "recommended": asdict(self.recommended), "current": asdict(self.current),
                "notes": list(self.notes), "comparison": self.comparison.to_json()}

    def row(self) -> dict:
        v, now, rec = self.variance, self.current, self.recommended
        return {"model": self.model, "estimator": self.estimator, "strata": v.strata,
                "between": v.between, "within": v.within,
                "setup_seconds": self.setup_seconds,
                "replicate_seconds": self.replicate_seconds,
                "current_documents_per_stratum": now.documents_per_stratum,
                "current_replicates": now.replicates, "current_halfwidth": now.halfwidth,
                "documents_per_stratum": rec.documents_per_stratum,
                "replicates": rec.replicates, "halfwidth": rec.halfwidth,
                "seconds": rec.seconds, "cheaper": self.comparison.cheaper}


@dataclass(frozen=True, repr=False)  # HtmlTable's short repr
class PlanResult(HtmlTable):
    """What :func:`plan_study` returns: the target and one plan per model."""

    target: str
    halfwidth: float
    alpha: float
    z: float
    models: tuple[ModelPlan, ...]
    endpoints: int = 1  # Bonferroni: the interval is at 1 - alpha / endpoints

    @property
    def level(self) -> float:
        """The target's interval level, ``1 - alpha / endpoints``."""
        return 1 - self.alpha / self.endpoints

    def to_json(self) -> dict:
        """The structure ``kvdrift plan --json`` prints."""
        return {"target": self.target, "halfwidth": self.halfwidth, "alpha": self.alpha,
                "endpoints": self.endpoints, "level": self.level, "z": self.z,
                "models": [m.to_json() for m in self.models]}

    def to_frame(self) -> pd.DataFrame:
        """One row per model: variance, cost, current and recommended design, cheaper."""
        return pd.DataFrame([m.row() for m in self.models])


def variance_components(values: np.ndarray, strata: np.ndarray) -> VarianceComponents:
    """Components from replicate values ``[n_docs, K]`` and each document's stratum."""
    values = np.asarray(values)
    strata = np.asarray(strata)
    n, K = values.shape
    if K < 2:
        raise ValueError("planning needs at least 2 replicates per document in the "
                         "development run (within-document variance)")
    labels = np.unique(strata)
    within = np.mean([values[strata == s].var(axis=1, ddof=1).mean() for s in labels])
    spread = [values[strata == s].mean(axis=1).var(ddof=1) for s in labels
              if (strata == s).sum() >= 2]
    if not spread:
        raise ValueError("planning needs a stratum with at least 2 documents in the "
                         "development run (between-document variance)")
    between = max(0.0, float(np.mean(spread)) - within / K)
    return VarianceComponents(between=between, within=float(within), strata=len(labels),
                              documents=n, replicates=K)


def halfwidth(v: VarianceComponents, n: int, K: int, z: float) -> float:
    """Expected interval half-width with ``n`` documents per stratum and ``K`` replicates."""
    return z * math.sqrt((v.between + v.within / K) / (v.strata * n))


def recommend(v: VarianceComponents, target: float, setup_seconds: float,
              replicate_seconds: float, z: float,
              max_replicates: int = MAX_REPLICATES) -> Design:
    """The cheapest ``(n, K)`` reaching half-width ``target`` (ties: fewer replicates)."""
    limits.plan_halfwidth(target)
    best = None
    for K in range(1, max_replicates + 1):
        need = z * z * (v.between + v.within / K) / (v.strata * target * target)
        n = max(MIN_DOCUMENTS, math.ceil(need - 1e-12))
        cost = v.strata * n * (setup_seconds + K * replicate_seconds)
        if best is None or cost < best.seconds:
            best = Design(n, K, halfwidth(v, n, K, z), cost)
    return best


def swrb_evaluations(horizon: int, tau: np.ndarray) -> float:
    """Expected SWRB kernel-pair evaluations per replicate, from rollouts' first mismatches
    (``tau`` 0 = none): the full scan plus ``E[H - tau | tau <= H]`` continuation steps."""
    tau = np.asarray(tau)
    entered = tau[diverged(tau)]
    return horizon + (float((horizon - entered).mean()) if entered.size else 0.0)


def target_stats(target: str) -> tuple[str, ...]:
    """The statistics a target reads (``R(a) - F(b)``: ``("R", "F")``)."""
    e = parse_endpoint(target)
    return (e.stat,) + ((e.minus[0],) if e.minus else ())


def needs_steps(target: str) -> bool:
    """Whether a target's per-replicate values come from the step records (``S99``)."""
    return any(registry.quantity(s).from_steps for s in target_stats(target))


def with_saturation(replicates: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``replicates`` with a ``saturation`` column: per replicate, the fraction of positions
    with ``delta_t > 0.99`` (``S99``'s value; steps: model, action, doc_id, replicate,
    delta)."""
    keys = ["model", "action", "doc_id", "replicate"]
    flags = steps[keys].assign(saturation=(steps["delta"] > SATURATION).astype(float))
    per_rep = flags.groupby(keys, sort=False, as_index=False)["saturation"].mean()
    return replicates.drop(columns="saturation", errors="ignore").merge(per_rep, on=keys,
                                                                        how="left")


def _values(reps: pd.DataFrame, stat: str, action: str) -> pd.DataFrame:
    q = registry.quantity(stat)
    cols = q.plan
    sub = reps[reps["action"] == action]
    if q.from_steps and cols[0] not in sub:
        raise ValueError(f"{stat} is computed from the step records; pass them "
                         "(plan_study(..., steps=...))")
    if "risk_tv" in cols and ("risk_tv" not in sub or sub["risk_tv"].isna().all()):
        raise ValueError(f"{stat} needs the replicates' rollout TV (risk_tv), which this "
                         "development run predates; run it again with this kvdrift")
    value = sub[cols[0]]
    if len(cols) > 1:
        value = value - sub[cols[1]]
    return sub.assign(value=value).pivot(index="doc_id", columns="replicate", values="value")


def _target_values(reps: pd.DataFrame, target: str, actions: list[str]):
    e = parse_endpoint(target)
    allowed = [q.name for q in registry.QUANTITIES if q.plan]
    for stat in (e.stat, e.minus[0] if e.minus else e.stat):
        checks.choice(stat, "a plan target's statistic (a document-level mean)", allowed)
    for name in e.actions:
        checks.named_action(name, f"target {e.text!r}", "the development run", actions)
    values = _values(reps, e.stat, e.action)
    if e.minus is not None:  # paired by replicate: actions share random numbers per document
        values = values - _values(reps, e.minus[0], e.minus[1])
    return e, values.dropna()


def plan_study(replicates: pd.DataFrame, target: str, halfwidth_target: float,
               alpha: float = 0.05, endpoints: int = 1,
               steps: pd.DataFrame | None = None) -> PlanResult:
    """Plans for each model of a development run's replicate records.

    ``endpoints``: how many prespecified endpoints share ``alpha`` (Bonferroni, the target's
    interval at ``1 - alpha / endpoints``); ``steps``: the step records (columns
    :data:`STEP_COLUMNS`), needed for ``S99`` targets.
    """
    checks.alpha(alpha)
    limits.endpoints(endpoints)
    if not 1 - alpha / (2 * endpoints) < 1:  # the level rounds to 1: no normal quantile
        raise ValueError(f"alpha / (2 x endpoints) must be at least {2**-52:.3g} (a level a "
                         f"float tells from 1); got {alpha!r} / (2 x {endpoints})")
    if steps is not None and needs_steps(target):
        replicates = with_saturation(replicates, steps)
    limits.plan_halfwidth(halfwidth_target)
    missing = [c for c in ("setup_seconds", "replicate_seconds") if c not in replicates]
    if missing:
        raise ValueError("the development run has no wall-time records (it predates them); "
                         "run it again with this kvdrift to measure the cost per replicate")
    z = NormalDist().inv_cdf(1 - alpha / (2 * endpoints))
    models = []
    for model, reps in replicates.groupby("model", sort=False):
        actions = list(dict.fromkeys(reps["action"]))
        measured = str(single_value(reps, "estimator"))
        complete = recorded_estimator(measured).complete_branches
        e, values = _target_values(reps, target, actions)
        needs_rollouts = any(registry.quantity(s).rollouts_only for s in target_stats(target))
        if needs_rollouts and not complete:
            raise ValueError(f"target {e.text!r} needs complete rollouts (fixed-history risk F, "
                             "rollout TV or S99), which SWRB runs do not measure; plan it from "
                             "a rollout development run")
        strata = reps.drop_duplicates("doc_id").set_index("doc_id")["stratum"]
        v = variance_components(values.to_numpy(), strata.loc[values.index].to_numpy())
        units = reps[reps["action"].isin(e.actions)]
        per_unit = units.drop_duplicates(["doc_id", "action"])  # setup is per unit
        setup = float(per_unit.groupby("action")["setup_seconds"].mean().sum())
        per_rep = float(units.groupby("action")["replicate_seconds"].mean().sum())
        H = int(single_value(reps, "horizon"))
        evals = float(units["evaluations"].mean())  # the target's actions only
        if complete:  # rollouts: what SWRB would evaluate on the same divergence times
            other_evals = swrb_evaluations(H, units["tau"].to_numpy())
        else:
            other_evals = float(H)
        design = recommend(v, halfwidth_target, setup, per_rep, z)
        notes = []
        if v.between == 0:
            notes.append("the between-document variance estimate is 0 (floored): the plan "
                         f"keeps the minimum of {MIN_DOCUMENTS} documents per stratum and "
                         "leans on replicates; more development documents would firm it up")
        if design.replicates == MAX_REPLICATES:
            notes.append(f"K reached the search limit {MAX_REPLICATES}")
        if needs_rollouts:  # measured by rollouts (SWRB runs were refused above)
            comparison = EstimatorComparison(
                "rollout", None, reason="SWRB does not estimate fixed-history risk F, "
                                        "rollout TV or S99")
        else:
            comparison = _compare(v, halfwidth_target, setup, per_rep, z, measured, evals,
                                  other_evals)
        models.append(ModelPlan(
            str(model), measured, v, setup, per_rep, design,
            CurrentDesign(v.documents / v.strata, v.replicates,
                          halfwidth(v, v.documents / v.strata, v.replicates, z)),
            tuple(notes), comparison))
    return PlanResult(target, halfwidth_target, alpha, z, tuple(models), endpoints)


def _compare(v: VarianceComponents, target: float, setup: float, per_rep: float, z: float,
             measured: str, evals: float, other_evals: float) -> EstimatorComparison:
    """The other estimator's plan under equal variance, and the break-even variance ratio."""
    other = "swrb" if measured == "rollout" else "rollout"
    rep_cost = {measured: per_rep, other: per_rep * other_evals / evals}

    def plan(estimator: str, ratio: float = 1.0) -> Design:
        # ratio: the rollouts' within-document variance over SWRB's (1 = equal).
        within = v.within
        if estimator != measured:
            within = within / ratio if estimator == "swrb" else within * ratio
        return recommend(dataclasses.replace(v, within=within), target, setup,
                         rep_cost[estimator], z)

    def swrb_wins(ratio: float) -> bool:
        return plan("swrb", ratio).seconds <= plan("rollout", ratio).seconds

    same = {measured: plan(measured), other: plan(other)}
    break_even = None  # None: SWRB never wins (e.g. between-document variance dominates)
    if swrb_wins(1.0):
        break_even = 1.0
    elif swrb_wins(1e6):
        lo, hi = 1.0, 1e6
        while hi / lo > 1.01:
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if swrb_wins(mid) else (mid, hi)
        break_even = hi
    return EstimatorComparison(
        cheaper="swrb" if swrb_wins(1.0) else "rollout",
        assumption=("the unmeasured estimator has the measured one's variance (for SWRB "
                    "an upper bound) and costs in proportion to its kernel-pair "
                    "evaluations per replicate"),
        evaluations_per_replicate={measured: evals, other: other_evals},
        plans=same, break_even_variance_ratio=break_even)
