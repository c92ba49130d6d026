"""Per-stratum results: every headline quantity and contrast within each model x stratum.

Within a stratum every document weighs the same. The bootstrap draws are the study's own,
restricted to the stratum's documents: the study resamples documents within strata, so a
draw's counts for one stratum are a bootstrap draw of that stratum alone, and they are shared
by every action (paired contrasts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdrift.analysis.bootstrap import weighted_means
from kvdrift.analysis.endpoints import action_pairs
from kvdrift.analysis.features import DocFeatures
from kvdrift.analysis.lags import LagWindows
from kvdrift.analysis.quantities import action_scalars, contrast_result, derive
from kvdrift.analysis.results import ActionScalars, StratumResult


@dataclass(frozen=True)
class StratumDerived:
    """One stratum's derived quantities per action: point estimates and bootstrap draws."""

    label: str
    documents: int
    point: dict[str, dict]
    draws: dict[str, dict]


def stratum_derived(
    features: dict[str, DocFeatures], counts: np.ndarray, windows: LagWindows | None,
) -> list[StratumDerived]:
    """Per stratum (sorted as text), every action's :func:`derive` on the stratum's documents.

    ``features`` hold the same documents, in the same order, for every action; ``counts``
    (``[draws, n_docs]``) are the study's within-stratum bootstrap counts for those documents.
    """
    strata = next(iter(features.values())).strata
    out = []
    for label in sorted(set(strata.tolist()), key=str):
        members = np.flatnonzero(strata == label)
        weights = np.full(members.size, 1.0 / members.size)
        sub = counts[:, members]
        point, draws = {}, {}
        for action, f in features.items():
            columns = {k: v[members] for k, v in f.columns.items()}
            point[action] = derive(weighted_means(columns, weights), windows)
            draws[action] = derive(weighted_means(columns, weights, sub), windows)
        out.append(StratumDerived(str(label), int(members.size), point, draws))
    return out


def stratum_results(
    model: str, features: dict[str, DocFeatures], counts: np.ndarray,
    windows: LagWindows | None, horizon: int, alpha: float,
    derived: list[StratumDerived] | None = None,
) -> list[StratumResult]:
    """One result per stratum: each action's scalars and every contrast ``a - b``.

    ``derived``: :func:`stratum_derived` of the same inputs, when the caller has it already.
    """
    out = []
    for d in derived if derived is not None else stratum_derived(features, counts, windows):
        point, draws = d.point, d.draws
        out.append(StratumResult(
            model, d.label, d.documents,
            tuple(ActionScalars(a, action_scalars(point[a], draws[a], alpha)) for a in features),
            tuple(contrast_result(model, (a, b), (point[a], point[b]), (draws[a], draws[b]),
                                  alpha, horizon) for a, b in action_pairs(list(features))),
        ))
    return out
