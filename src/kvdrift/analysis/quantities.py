"""Every reported quantity from weighted feature means, and its bootstrap interval.

The functions here take weighted means of per-document features (leading axes: bootstrap
draws, or none for the point estimate) and return the study's quantities, so one code path
serves the whole study, each stratum, the point estimate and every draw. ``derive`` gives an
action's quantities; ``contrast_terms`` and ``block_gap`` compare two actions on the same
draws, which pairs them. A contrast is ``a - b``, minuend first, as the endpoint grammar
writes it (:mod:`kvdrift.analysis.endpoints`); between a model's actions ``a`` is the later
action and ``b`` the earlier (:func:`~kvdrift.analysis.endpoints.action_pairs`).
"""

from __future__ import annotations

import numpy as np

from kvdrift.analysis import registry
from kvdrift.analysis.bootstrap import percentile_interval
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.lags import LagWindows
from kvdrift.analysis.registry import Means, ratio
from kvdrift.analysis.results import ContrastResult, Curve

CONTRAST_TERMS = ("dR", "dR_tv", "dO", "dE", "dC", "occurrence_term", "exposure_term",
                  "rate_term", "exposure_share")


def derive(m: dict[str, np.ndarray], windows: LagWindows | None) -> dict[str, np.ndarray]:
    """Every quantity of the registry, and the curves, from weighted feature means (leading
    axes: bootstrap draws)."""
    means = Means(m, windows)
    out = {q.name: q.formula(means) for q in registry.QUANTITIES}
    out["timing_cdf"] = m["timing"]
    if "expected_delta" in m:
        out["expected_delta"] = m["expected_delta"]
    for suffix in ("", "_strict"):
        if windows is not None and f"lag_num{suffix}" in m:
            out[f"lag_profile{suffix}"] = ratio(m[f"lag_num{suffix}"], m[f"lag_den{suffix}"])
    return out


def contrast_terms(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``a - b`` decomposition terms from two derived dicts (same bootstrap draws)."""
    d = {f"d{k}": a[k] - b[k] for k in ("R", "O", "E", "C")}
    d["dR_tv"] = (a["R_tv"] - b["R_tv"] if "R_tv" in a and "R_tv" in b
                  else np.full(np.shape(d["dR"]), np.nan))
    d["occurrence_term"] = d["dO"]
    d["exposure_term"] = d["dE"] * (a["C"] + b["C"]) / 2
    d["rate_term"] = d["dC"] * (a["E"] + b["E"]) / 2
    d["exposure_share"] = ratio(d["exposure_term"], d["dR"], np.asarray(d["dR"]) != 0)
    return d


def position_blocks(horizon: int, count: int = 8) -> list[tuple[int, int]]:
    """Split positions 1..H into at most ``count`` contiguous blocks (inclusive ranges)."""
    edges = np.linspace(0, horizon, min(count, horizon) + 1).round().astype(int)
    return [(int(lo) + 1, int(hi)) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def block_gap(a: dict, b: dict, blocks: list[tuple[int, int]]) -> np.ndarray:
    """Generation-clock gap: mean ``E[delta_t]`` of ``a`` minus ``b`` over each position block."""
    gap = a["expected_delta"] - b["expected_delta"]
    return np.stack([gap[..., lo - 1:hi].mean(axis=-1) for lo, hi in blocks], axis=-1)


def interval(point: np.ndarray, draws: np.ndarray, alpha: float) -> Interval:
    """The point estimate and the percentile interval of draws, at level ``1 - alpha``."""
    lo, hi = percentile_interval(draws, alpha)
    return Interval(float(point), float(lo), float(hi), 1 - alpha)


def intervals(point: np.ndarray, draws: np.ndarray, alpha: float) -> tuple[Interval, ...]:
    """One :func:`interval` per entry of the last axis (``point [k]``, ``draws [B, k]``)."""
    return tuple(interval(point[i], draws[:, i], alpha) for i in range(point.shape[-1]))


def curve(point: np.ndarray, draws: np.ndarray, alpha: float,
          blocks: list[tuple[int, int]] | None = None) -> Curve:
    """A curve over ``x = 1..k`` with pointwise percentile bands."""
    lo, hi = percentile_interval(draws, alpha)
    return Curve(tuple(range(1, point.shape[-1] + 1)), tuple(point.tolist()),
                 tuple(lo.tolist()), tuple(hi.tolist()), 1 - alpha,
                 None if blocks is None else tuple((int(s), int(e)) for s, e in blocks))


def action_scalars(point: dict, draws: dict, alpha: float) -> dict[str, Interval]:
    """Every quantity of the registry with its interval."""
    return {q.name: interval(point[q.name], draws[q.name], alpha) for q in registry.QUANTITIES}


def contrast_result(
    model: str, names: tuple[str, str], point: tuple[dict, dict], draws: tuple[dict, dict],
    alpha: float, horizon: int,
) -> ContrastResult:
    """``a - b`` decomposition terms with intervals, and the block gap when both have curves.

    ``names`` are ``(a, b)``; ``point`` and ``draws`` their derived dicts; the draws must share
    their bootstrap counts (paired).
    """
    pt, bt = contrast_terms(*point), contrast_terms(*draws)
    terms = {k: interval(pt[k], bt[k], alpha) for k in CONTRAST_TERMS}
    gap = None
    if "expected_delta" in point[0] and "expected_delta" in point[1]:
        blocks = position_blocks(horizon)
        gap = curve(block_gap(*point, blocks), block_gap(*draws, blocks), alpha, blocks)
    return ContrastResult(model, names[0], names[1], terms, gap)
