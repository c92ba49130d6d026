"""A study's statistics: every quantity per action, contrasts, bounds and endpoints.

Documents are the unit and strata weigh equally (:mod:`kvdrift.analysis.summary`).
Intervals come from the document bootstrap, paired across actions
(:mod:`kvdrift.analysis.bootstrap`): pointwise percentile intervals for exploratory
quantities, Bonferroni-adjusted ones (alpha / k over the k prespecified endpoints, all
models together) for endpoints. The result is a JSON-able dict that the report renders.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvdrift.analysis.bootstrap import (
    percentile_interval,
    stratified_counts,
    stratum_weights,
    weighted_means,
)
from kvdrift.analysis.bounds import hoeffding_enclosure, sharp_interval
from kvdrift.analysis.endpoints import Endpoint, parse_endpoint
from kvdrift.analysis.features import EOS_CATEGORIES, DocFeatures, action_features
from kvdrift.analysis.lags import LagWindows

SCALARS = ("p_diverge", "mean_entry_time", "R", "O", "E", "Pi", "C", "F", "R_minus_F", "S99",
           "B", "B_strict")
CONTRAST_TERMS = ("dR", "dO", "dE", "dC", "occurrence_term", "exposure_term", "rate_term",
                  "exposure_share")


@dataclass(frozen=True)
class AnalysisOptions:
    """How to turn records into conclusions."""

    bootstrap: int = 2000
    alpha: float = 0.05
    endpoints: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.bootstrap, bool) or not isinstance(self.bootstrap, int) \
                or self.bootstrap < 1:
            raise ValueError(f"bootstrap draws must be an integer >= 1; got {self.bootstrap!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be within (0, 1); got {self.alpha}")
        for text in self.endpoints:
            parse_endpoint(text)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _nan(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, np.nan)


def derive(m: dict[str, np.ndarray], windows: LagWindows | None) -> dict[str, np.ndarray]:
    """Every reported quantity from weighted feature means (leading axes: bootstrap draws)."""
    lead = m["risk"].shape[:-1]
    occ, exp_, pi = m["occurrence"][..., 0], m["exposure"][..., 0], m["occupation"][..., 0]
    R = occ + pi
    F = m["fixed_risk"][..., 0]
    out = {
        "p_diverge": m["divergence_mass"][..., 0],
        "mean_entry_time": _ratio(m["entry_time_mass"][..., 0], m["divergence_mass"][..., 0]),
        "R": R, "O": occ, "E": exp_, "Pi": pi,
        "C": np.where(exp_ > 0, _ratio(pi, exp_), 0.0),
        "F": F, "R_minus_F": R - F,
        "S99": m["saturation"][..., 0] if "saturation" in m else _nan(lead),
        "timing_cdf": m["timing"],
    }
    if "expected_delta" in m:
        out["expected_delta"] = m["expected_delta"]
    for name, suffix in (("B", ""), ("B_strict", "_strict")):
        if windows is not None and f"lag_num{suffix}" in m:
            profile = _ratio(m[f"lag_num{suffix}"], m[f"lag_den{suffix}"])
            out[f"lag_profile{suffix}"] = profile
            out[name] = windows.gap(profile)
        else:
            out[name] = _nan(lead)
    for key in m:
        if key.startswith(("observed_L", "capacity_L")):
            out[key] = m[key][..., 0]
    return out


def contrast_terms(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``b - a`` decomposition terms from two derived dicts (same bootstrap draws)."""
    d = {f"d{k}": b[k] - a[k] for k in ("R", "O", "E", "C")}
    d["occurrence_term"] = d["dO"]
    d["exposure_term"] = d["dE"] * (a["C"] + b["C"]) / 2
    d["rate_term"] = d["dC"] * (a["E"] + b["E"]) / 2
    dR = np.asarray(d["dR"])
    d["exposure_share"] = np.where(dR != 0, d["exposure_term"] / np.where(dR != 0, dR, 1), np.nan)
    return d


def position_blocks(horizon: int, count: int = 8) -> list[tuple[int, int]]:
    """Split positions 1..H into at most ``count`` contiguous blocks (inclusive ranges)."""
    edges = np.linspace(0, horizon, min(count, horizon) + 1).round().astype(int)
    return [(int(lo) + 1, int(hi)) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def block_gap(a: dict, b: dict, blocks: list[tuple[int, int]]) -> np.ndarray:
    """Generation-clock gap: mean ``E[delta_t]`` of ``b`` minus ``a`` over each position block."""
    gap = b["expected_delta"] - a["expected_delta"]
    return np.stack([gap[..., lo - 1:hi].mean(axis=-1) for lo, hi in blocks], axis=-1)


def _interval(point: np.ndarray, draws: np.ndarray, alpha: float) -> dict:
    lo, hi = percentile_interval(draws, alpha)
    return {"estimate": float(point), "lo": float(lo), "hi": float(hi)}


def _curve(point: np.ndarray, draws: np.ndarray, alpha: float) -> dict:
    lo, hi = percentile_interval(draws, alpha)
    return {"x": list(range(1, point.shape[-1] + 1)), "estimate": point.tolist(),
            "lo": lo.tolist(), "hi": hi.tolist()}


def _common_documents(features: dict[str, DocFeatures]) -> dict[str, DocFeatures]:
    shared = None
    for f in features.values():
        shared = set(f.doc_ids) if shared is None else shared & set(f.doc_ids)
    ids = np.array(sorted(shared or ()), dtype=object)
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
) -> dict:
    """The full study analysis as a JSON-able dict (schema: :mod:`kvdrift.report`)."""
    if replicates.empty:
        raise ValueError("no finished units to analyze")
    H = int(replicates["horizon"].iloc[0])
    estimator = str(replicates["estimator"].iloc[0])
    windows = LagWindows.for_horizon(H) if estimator == "rollout" else None
    endpoints = [parse_endpoint(t) for t in options.endpoints]
    models = list(dict.fromkeys(replicates["model"]))
    family = max(1, len(endpoints) * len(models))
    out: dict = {
        "meta": (meta or {}) | {
            "estimator": estimator, "horizon": H,
            "replicates": int(replicates.groupby(["model", "action", "doc_id"]).size().max()),
            "bootstrap": options.bootstrap, "alpha": options.alpha},
        "lags": windows.as_dict() if windows else None,
        "actions": [], "contrasts": [], "endpoints": [], "certified_order": [],
    }
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
        point = {a: derive(weighted_means(f.columns, weights), windows) for a, f in feats.items()}
        boot = {a: derive(weighted_means(f.columns, weights, counts), windows)
                for a, f in feats.items()}
        sizes = pd.Series(strata).value_counts().sort_index()
        out["meta"]["documents"] = {str(k): int(v) for k, v in sizes.items()}
        lonely = [str(k) for k, v in sizes.items() if v < 2]
        if lonely:
            out["meta"].setdefault("notes", []).append(
                f"{model}: strata with a single document ({', '.join(lonely)}) contribute no "
                "between-document variation, so intervals understate uncertainty; use at "
                "least two documents per stratum.")
        enclosures: dict[int, dict[str, object]] = {}
        for a, f in feats.items():
            p, b = point[a], boot[a]
            entry = {
                "model": model, "action": a, "documents": int(len(f.doc_ids)),
                "scalars": {k: _interval(p[k], b[k], options.alpha) for k in SCALARS},
                "curves": {k: _curve(p[k], b[k], options.alpha)
                           for k in ("timing_cdf", "expected_delta", "lag_profile",
                                     "lag_profile_strict") if k in p},
                "eos_split": None, "bounds": [],
            }
            if "eos_R" in f.columns:
                eos = weighted_means({"R": f.columns["eos_R"], "F": f.columns["eos_F"]}, weights)
                entry["eos_split"] = {"categories": list(EOS_CATEGORIES), "R": eos["R"].tolist(),
                                      "F": eos["F"].tolist(),
                                      "R_minus_F": (eos["R"] - eos["F"]).tolist()}
            for key in sorted((k for k in f.columns if k.startswith("observed_L")),
                              key=lambda k: int(k[len("observed_L"):])):
                L = int(key[len("observed_L"):])
                lower = f.columns[key][:, 0]
                upper = lower + f.columns[f"capacity_L{L}"][:, 0]
                sharp = sharp_interval(float(p[key]), max(0.0, float(p[f"capacity_L{L}"])))
                upper = np.minimum(upper, 1.0)
                enc = hoeffding_enclosure(lower, upper, options.alpha, weights)
                # For ordering, every action's enclosure must hold at once: alpha / actions.
                enclosures.setdefault(L, {})[a] = hoeffding_enclosure(
                    lower, upper, options.alpha / len(actions), weights)
                entry["bounds"].append({
                    "L": L, "R_L": sharp.lo, "B_L": sharp.hi - sharp.lo, "lo": sharp.lo,
                    "hi": sharp.hi, "minimax": sharp.minimax, "hoeffding_lo": enc.lo,
                    "hoeffding_hi": enc.hi})
            out["actions"].append(entry)
        for i, a in enumerate(actions):
            for b_name in actions[i + 1:]:
                pt, bt = contrast_terms(point[a], point[b_name]), contrast_terms(boot[a],
                                                                                 boot[b_name])
                entry = {"model": model, "a": a, "b": b_name} | {
                    k: _interval(pt[k], bt[k], options.alpha) for k in CONTRAST_TERMS}
                if "expected_delta" in point[a]:
                    blocks = position_blocks(H)
                    gap_p = block_gap(point[a], point[b_name], blocks)
                    gap_b = block_gap(boot[a], boot[b_name], blocks)
                    entry["block_gap"] = _curve(gap_p, gap_b, options.alpha) | {
                        "blocks": [[int(s), int(e)] for s, e in blocks]}
                out["contrasts"].append(entry)
        for e in endpoints:
            missing = [x for x in e.actions if x not in point]
            if missing:
                raise ValueError(f"endpoint {e.text!r} names action {missing[0]!r}, which model "
                                 f"{model!r} did not run; actions: {', '.join(actions)}")
            level = options.alpha / family
            iv = _interval(_endpoint_value(e, point), _endpoint_value(e, boot), level)
            out["endpoints"].append({"model": model, "name": e.text, **iv, "alpha": level})
        for L, encs in sorted(enclosures.items()):
            for better, ia in encs.items():
                for worse, ib in encs.items():
                    if better != worse and ia.hi < ib.lo:
                        out["certified_order"].append(
                            {"model": model, "L": L, "better": better, "worse": worse})
    return out
