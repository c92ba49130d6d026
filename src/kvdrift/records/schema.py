"""The record schema: every column of the step and replicate tables, its dtype and meaning.

A unit (model, document, action) writes one row per (replicate, position t) into the step
table and one row per replicate into the replicate table (``run/records.py`` builds them,
``run/store.py`` stores them as Parquet). This module is the one place the columns are
declared; the writers and the readers (``analysis/``, ``kvdrift predict``/``plan``, the
frontier) name them from here.

The observation depths are one typed column each, not one column per depth: every replicate
row holds the depths ``L`` (:data:`DEPTHS`, ascending) and, in the same order, the window
terms at each (:data:`OBSERVED`, :data:`CAPACITY`). :mod:`.depths` writes and reads them;
:mod:`.legacy` converts the one-column-per-depth layout of earlier stores on read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from kvdrift import checks


@dataclass(frozen=True)
class Column:
    """One record column: its name, Arrow type and meaning (``when``: who writes it)."""

    name: str
    dtype: pa.DataType
    meaning: str
    when: str = "always"


KEY = (
    Column("model", pa.string(), "model name or path"),
    Column("doc_id", pa.string(), "document id"),
    Column("stratum", pa.string(), "document stratum (bootstrap stratum, report group)"),
    Column("action", pa.string(), "the action's name as given (Q's cache)"),
    Column("estimator", pa.string(), "rollout or swrb"),
    Column("replicate", pa.int32(), "replicate index 0..K-1"),
)
"""The columns that say whose row it is (both tables)."""

FORCED = (
    Column("logp_x", pa.float64(), "log P(X_t | X_<t)", "rollout, up to X's EOS"),
    Column("logq_x", pa.float64(), "log Q(X_t | X_<t)", "rollout, up to X's EOS"),
    Column("kl", pa.float64(), "KL(P || Q) at X's history", "rollout, up to X's EOS"),
    Column("top1", pa.float64(), "1 if P's and Q's most likely tokens agree",
           "rollout, up to X's EOS"),
)
"""Teacher-forced numbers along the reference path X (null after X's EOS and for SWRB)."""

STEPS = KEY + (
    Column("t", pa.int32(), "position 1..H"),
    Column("x_token", pa.int64(), "P's branch token (-1 before SWRB's continuation)"),
    Column("y_token", pa.int64(), "Q's branch token (-1 before SWRB's continuation)"),
    Column("mismatch", pa.bool_(), "the branches' tokens differ at t"),
    Column("delta", pa.float64(), "TV(P, Q) at the branches' history (NaN for SWRB)"),
    Column("f", pa.float64(), "TV(P, Q) along X, the fixed history (NaN for SWRB)"),
    Column("tau", pa.int32(), "divergence time (0: never; SWRB: J)"),
    Column("x_eos", pa.bool_(), "X has emitted EOS by t"),
    Column("y_eos", pa.bool_(), "Y has emitted EOS by t"),
    Column("shared_token", pa.int64(), "the scan's shared token", "swrb"),
    Column("scan_tv", pa.float64(), "the scan's TV at t", "swrb"),
    Column("weight", pa.float64(), "the scan's survival weight at t", "swrb"),
) + FORCED

MEMORY = (
    Column("kv_bytes", pa.float64(), "bytes of Q's prompt cache", "language models"),
    Column("kv_fraction", pa.float64(), "Q's prompt cache over the full cache",
           "language models"),
)
KV_MEASURE = Column(
    "kv_measure", pa.string(),
    "how kv_bytes and kv_fraction were obtained: 'kept entries' (a named action's kept entries "
    "at their bits, hidden ones included) or 'stored bytes' (a press object's cache as stored, "
    "hidden entries and all-zero channels not counted); absent in stores before it",
    "language models")
_GENERATION_WHEN = "language models; absent in stores before it"
GENERATION = (
    Column("kv_bytes_generation", pa.float64(),
           "bytes of Q's cache, prompt and generated entries, averaged over positions 1..H "
           "(a decoding-time press's evictions derived from its target and interval)",
           _GENERATION_WHEN),
    Column("kv_fraction_generation", pa.float64(),
           "kv_bytes_generation over the full cache's bytes averaged over positions 1..H",
           _GENERATION_WHEN),
    Column("compression_positions", pa.list_(pa.int32()),
           "the positions first computed from Q's cache after each decoding-time compression "
           "(derived from the press's target and interval; empty without a decoding press)",
           _GENERATION_WHEN),
)
"""Q's cache over the generation (:mod:`kvdrift.records.generation`): the memory a
decoding-time press bounds, which ``kv_bytes`` (the prompt cache) does not see."""
WEIGHTS = (
    Column("weights_bytes", pa.float64(),
           "bytes of Q's model's weights (a llama.cpp weight type: as that type stores them; "
           "else at their dtype)", _GENERATION_WHEN),
    Column("weights_fraction", pa.float64(),
           "weights_bytes over P's model's weights at their dtype (1 where Q runs on P's model)",
           _GENERATION_WHEN),
)
"""Q's model's weights (:mod:`kvdrift.lm.generators`): the memory a weight type saves."""
TIMING = (
    Column("setup_seconds", pa.float64(), "wall time to build the unit's pair"),
    Column("replicate_seconds", pa.float64(), "the estimator's wall time per replicate"),
)
SCORES = (
    Column("score_x", pa.float64(), "task score of X's text", "documents with answers"),
    Column("score_y", pa.float64(), "task score of Y's text", "documents with answers"),
)

_LOST_WHEN = "--attribution, rollouts of language models (divergent replicates)"
LOST = (
    Column("lost_mass", pa.float64(),
           "share of P's attention at tau (mean over layers and query heads) on prompt entries "
           "Q's cache lost (evicted: all; held: their relative distortion); NaN: no divergence",
           _LOST_WHEN),
    Column("lost_positions", pa.list_(pa.int32()),
           "the prompt positions (0-based) with the most lost attention, most first", _LOST_WHEN),
    Column("lost_shares", pa.list_(pa.float64()),
           "each position's lost attention mass m(j), in the order of lost_positions",
           _LOST_WHEN),
    Column("lost_tokens", pa.list_(pa.string()), "each position's token text", _LOST_WHEN),
    Column("lost_contexts", pa.list_(pa.string()),
           "each position's context in the prompt: a few tokens either side, the token in ⟦ ⟧",
           _LOST_WHEN),
)
"""What Q's cache had lost at the first divergence (:mod:`kvdrift.lm.attribution`)."""

DEPTHS = Column("depths", pa.list_(pa.int32()),
                "the observation depths L, ascending (the same list in every row of a run)")
OBSERVED = Column("observed", pa.list_(pa.float64()),
                  "per depth, in the order of depths: the observed window term (mean -> R_L)")
CAPACITY = Column("capacity", pa.list_(pa.float64()),
                  "per depth, in the order of depths: the unobserved capacity (mean -> B_L)")
DEPTH_TERMS = (DEPTHS, OBSERVED, CAPACITY)
"""The window terms at each observation depth L: one list column each, with the depths
recorded beside them in every row (an empty list where a run has no depths)."""

TERMS = (
    Column("risk", pa.float64(), "mismatch fraction D_H (mean -> R)"),
    Column("occurrence", pa.float64(), "1{tau <= H}/H (mean -> O)"),
    Column("exposure", pa.float64(), "(H - tau)_+/H (mean -> E)"),
    Column("occupation", pa.float64(), "(1/H) sum_{t > tau} I_t (mean -> Pi)"),
    Column("fixed_risk", pa.float64(), "(1/H) sum_t f_t (mean -> F; NaN for SWRB)"),
    Column("divergence_mass", pa.float64(), "1{tau <= H} (mean -> p_diverge)"),
    Column("entry_time_mass", pa.float64(), "tau (mean -> sum_s s p_s)"),
)
"""The replicate terms whose document means are the method's quantities."""

REPLICATES = KEY + (
    Column("horizon", pa.int32(), "H"),
    Column("tau", pa.int32(), "divergence time (0: never; SWRB: J)"),
    TERMS[0],
    Column("risk_tv", pa.float64(), "(1/H) sum_t delta_t (rollout TV; NaN for SWRB)"),
    *TERMS[1:5],
    Column("evaluations", pa.int64(), "kernel-pair evaluations of the replicate"),
    *TERMS[5:],
) + DEPTH_TERMS + TIMING + MEMORY + (KV_MEASURE,) + GENERATION + WEIGHTS + SCORES + LOST
"""The replicate columns."""


@dataclass(frozen=True)
class RecordedEstimator:
    """What the records of one estimator hold; the ``estimator`` column names it.

    ``complete_branches``: both branches are followed from t = 1, so the step columns
    ``delta`` and ``f``, the teacher-forced columns, ``risk_tv``, ``fixed_risk``, the lag
    windows and the task scores hold values (SWRB's records hold NaN or nothing there).
    """

    name: str
    complete_branches: bool


RECORDED_ESTIMATORS = {e.name: e for e in (RecordedEstimator("rollout", True),
                                           RecordedEstimator("swrb", False))}


def recorded_estimator(name: str) -> RecordedEstimator:
    """The estimator a table's ``estimator`` column names."""
    return RECORDED_ESTIMATORS[checks.choice(name, "estimator", RECORDED_ESTIMATORS)]


def names(columns: Iterable[Column]) -> tuple[str, ...]:
    """The names of ``columns``, in order."""
    return tuple(c.name for c in columns)


FORCED_COLUMNS = names(FORCED)
MEMORY_COLUMNS = names(MEMORY)
GENERATION_COLUMNS = names(GENERATION)
WEIGHTS_COLUMNS = names(WEIGHTS)
TIMING_COLUMNS = names(TIMING)
"""The only columns that differ between two runs of the same settings."""
SCORE_COLUMNS = names(SCORES)
LOST_COLUMNS = names(LOST)
TERM_COLUMNS = names(TERMS)
DEPTH_TERM_COLUMNS = names(DEPTH_TERMS)
