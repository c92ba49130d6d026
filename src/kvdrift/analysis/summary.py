"""Per-action summaries of a run: documents are the unit, strata weigh equally.

Replicate records are first averaged within each document; document means are then
averaged with weights ``1 / (number of strata * documents in the stratum)``. The same
weighted mean of per-document means is what the bootstrap resamples.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from kvdrift.analysis.decompose import Decomposition

MEAN_COLUMNS = ("risk", "occurrence", "exposure", "occupation", "fixed_risk",
                "divergence_mass", "entry_time_mass")


def document_means(replicates: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, action, stratum, doc_id): replicate means of every numeric column."""
    keys = ["model", "action", "stratum", "doc_id"]
    numeric = [c for c in replicates.columns
               if c not in keys and c not in ("replicate", "estimator", "tau", "horizon")
               and pd.api.types.is_numeric_dtype(replicates[c])]
    out = replicates.groupby(keys, sort=True)[numeric].mean().reset_index()
    out["replicates"] = replicates.groupby(keys, sort=True).size().to_numpy()
    return out


def stratum_weights(strata: pd.Series) -> np.ndarray:
    """Weights that give each stratum equal total weight and each document within it too."""
    counts = strata.map(strata.value_counts())
    n_strata = strata.nunique()
    return (1.0 / (n_strata * counts)).to_numpy(dtype=np.float64)


@dataclass(frozen=True)
class ActionSummary:
    """The run table's row for one (model, action)."""

    model: str
    action: str
    documents: int
    p_diverge: float  # P(tau <= H)
    mean_entry_time: float  # E[tau | tau <= H], in steps
    R: float
    O: float  # noqa: E741
    E: float
    Pi: float
    C: float
    F: float  # NaN for SWRB, which does not follow the fixed-history path
    R_minus_F: float

    def as_dict(self) -> dict:
        return asdict(self)


def weighted(doc: pd.DataFrame, column: str, weights: np.ndarray) -> float:
    values = doc[column].to_numpy(dtype=np.float64)
    return float((values * weights).sum() / weights.sum())


def summarize_action(doc: pd.DataFrame, weights: np.ndarray | None = None) -> ActionSummary:
    """Summary of one (model, action) from its per-document means."""
    if doc.empty:
        raise ValueError("no documents to summarize")
    w = stratum_weights(doc["stratum"]) if weights is None else weights
    d = Decomposition.from_terms(O=weighted(doc, "occurrence", w), E=weighted(doc, "exposure", w),
                                 Pi=weighted(doc, "occupation", w))
    mass = weighted(doc, "divergence_mass", w)
    entry = weighted(doc, "entry_time_mass", w) / mass if mass > 0 else float("nan")
    F = weighted(doc, "fixed_risk", w)
    return ActionSummary(
        model=str(doc["model"].iloc[0]), action=str(doc["action"].iloc[0]),
        documents=len(doc), p_diverge=mass, mean_entry_time=entry, R=d.R, O=d.O, E=d.E,
        Pi=d.Pi, C=d.C, F=F, R_minus_F=d.R - F,
    )


def summarize(replicates: pd.DataFrame) -> list[ActionSummary]:
    """One summary per (model, action), in order of first appearance."""
    docs = document_means(replicates)
    order = replicates[["model", "action"]].drop_duplicates().itertuples(index=False)
    return [summarize_action(docs[(docs.model == m) & (docs.action == a)].reset_index(drop=True))
            for m, a in order]
