"""Per-action point summaries of a run: documents are the unit, strata weigh equally.

Replicate records are averaged within each document; document means are then averaged
with weights ``1 / (number of strata * documents in the stratum)``. The quantities come
from the same features and formulas as the full study analysis
(:func:`kvdrift.analysis.quantities.derive`), without the bootstrap; the weights are
:func:`kvdrift.analysis.bootstrap.stratum_weights`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd

from kvdrift.analysis.bootstrap import stratum_weights, weighted_means
from kvdrift.analysis.features import action_features
from kvdrift.analysis.memory import memory_means
from kvdrift.analysis.quantities import derive
from kvdrift.analysis.readings import derive_readings
from kvdrift.analysis.speculative import GAMMAS


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
    R_minus_F: float  # R_tv - F, as in the paper
    R_tv: float = float("nan")  # rollout-TV risk (1/H) sum_t E[delta_t]; NaN for SWRB
    # Readings along X (NaN under SWRB, or without the teacher-forced records):
    kl: float = float("nan")  # mean KL(P || Q) per token, nats
    acceptance: float = float("nan")  # speculative per-token acceptance
    tokens_per_round: float = float("nan")  # expected tokens per round, draft length 4
    # Q's prompt cache, weighted mean over documents (NaN where the pair does not tell it):
    kv_bytes: float = float("nan")  # bytes held (quantized entries at their bits, scales in)
    kv_fraction: float = float("nan")  # of the full cache in the model's dtype

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(steps: pd.DataFrame, replicates: pd.DataFrame) -> list[ActionSummary]:
    """One summary per (model, action), in order of first appearance."""
    out = []
    for model, action in replicates[["model", "action"]].drop_duplicates().itertuples(index=False):
        reps = replicates[(replicates.model == model) & (replicates.action == action)]
        unit_steps = steps[(steps.model == model) & (steps.action == action)]
        f = action_features(unit_steps, reps, None)
        means = weighted_means(f.columns, stratum_weights(pd.Series(f.strata)))
        d = derive(means, None)
        values = {k: float(d[k]) for k in ("p_diverge", "mean_entry_time", "R", "O", "E", "Pi",
                                           "C", "F", "R_minus_F", "R_tv")}
        if "spec_rejections" in means:
            r = derive_readings(means)
            values |= {"kl": float(r["kl"]), "acceptance": float(r["acceptance"]),
                       "tokens_per_round": float(r["tokens_per_round"][GAMMAS.index(4)])}
        values |= memory_means(reps, f.doc_ids, stratum_weights(pd.Series(f.strata)))
        out.append(ActionSummary(model=model, action=action, documents=len(f.doc_ids), **values))
    return out
