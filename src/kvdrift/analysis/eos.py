"""The EOS split of ``R - F`` as paired contrasts between actions (docs/method.md section 8).

With ``e = min(e_X, e_Y)`` and ``e' = max(e_X, e_Y)`` (first EOS positions of the two
branches), positions fall into ``S_0 = {t < e}`` (pre-EOS), ``S_1 = {t = e}`` (first EOS),
``S_2 = {e < t <= e'}`` (one absorbed) and ``S_3 = {e' < t}`` (both absorbed), see
:func:`kvdrift.analysis.features.eos_categories`. Per action
``G_r = (1/H) E[sum_{t in S_r} (delta_t - f_t)]``; between two actions, ``a - b``
(``Delta G_r = G_r(a) - G_r(b)``), ``Delta(R - F) = sum_r Delta G_r``, its pre-EOS
component ``Delta G_0`` and the EOS share
``(Delta G_1 + Delta G_2 + Delta G_3) / Delta(R - F)``. Here ``R`` is the rollout-TV risk
``R_tv = (1/H) sum_t E[delta_t]`` (the paper's reading), equal in expectation to the headline
``R`` (built from ``I_t``); the components sum exactly to the actions' ``R_minus_F = R_tv - F``.

Inputs are weighted means of the features ``eos_R`` and ``eos_F`` (``[..., 4]``, leading axes:
bootstrap draws); the same counts for both actions pair the contrast.
"""

from __future__ import annotations

import numpy as np

from kvdrift.analysis.endpoints import action_pairs
from kvdrift.analysis.features import EOS_CATEGORIES
from kvdrift.analysis.quantities import interval, intervals
from kvdrift.analysis.registry import ratio
from kvdrift.analysis.results import EosContrast, EosSplit


def eos_gaps(means: dict[str, np.ndarray]) -> np.ndarray:
    """``G_r`` for r = 0..3 (``[..., 4]``) from weighted means of ``eos_R`` and ``eos_F``."""
    return np.asarray(means["eos_R"]) - np.asarray(means["eos_F"])


def eos_contrast(g_a: np.ndarray, g_b: np.ndarray) -> dict[str, np.ndarray]:
    """``a - b``: ``dG`` per category, ``dR_minus_F`` (their sum), ``pre_eos`` and ``eos_share``.

    The EOS share is NaN where ``Delta(R - F) = 0``.
    """
    dG = g_a - g_b
    total = dG.sum(axis=-1)
    eos = dG[..., 1:].sum(axis=-1)
    share = ratio(eos, total, total != 0)
    return {"dG": dG, "dR_minus_F": total, "pre_eos": dG[..., 0], "eos_share": share}


def eos_split_entry(point: dict[str, np.ndarray], draws: dict[str, np.ndarray],
                    alpha: float) -> EosSplit:
    """One action's split: the ``R`` and ``F`` parts and ``G_r`` per category (points), ``G_r``
    with intervals (``G``) and ``sum_r G_r`` with its interval (``G_total``).

    ``point`` / ``draws``: the action's weighted feature means without / with bootstrap counts.
    """
    g_point, g_draws = eos_gaps(point), eos_gaps(draws)
    return EosSplit(tuple(EOS_CATEGORIES), tuple(point["eos_R"].tolist()),
                    tuple(point["eos_F"].tolist()), tuple(g_point.tolist()),
                    intervals(g_point, g_draws, alpha),
                    interval(g_point.sum(), g_draws.sum(axis=-1), alpha))


def eos_contrast_entries(
    model: str, point: dict[str, dict], draws: dict[str, dict], alpha: float
) -> list[EosContrast]:
    """Every contrast ``a - b`` of a model's actions
    (:func:`~kvdrift.analysis.endpoints.action_pairs`), with paired bootstrap intervals.

    ``point[a]`` / ``draws[a]`` are action ``a``'s weighted feature means without / with the
    bootstrap counts (``[4]`` / ``[B, 4]`` for ``eos_R`` and ``eos_F``).
    """
    out = []
    for a, b in action_pairs(list(point)):
        pt = eos_contrast(eos_gaps(point[a]), eos_gaps(point[b]))
        bt = eos_contrast(eos_gaps(draws[a]), eos_gaps(draws[b]))
        out.append(EosContrast(model, a, b, tuple(EOS_CATEGORIES),
                               intervals(pt["dG"], bt["dG"], alpha),
                               *(interval(pt[k], bt[k], alpha)
                                 for k in ("dR_minus_F", "pre_eos", "eos_share"))))
    return out
