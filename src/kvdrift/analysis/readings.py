"""Teacher-forced and speculative readings of the coupling, per action (docs/method.md section 10).

Per document (replicate means, like every feature of :mod:`kvdrift.analysis.features`), over
the generation a speculative decoder would produce, positions ``t <= N = min(e_X, H)``:

- teacher-forced along X (llama.cpp ``perplexity --kl-divergence`` definitions, on X): sums of
  ``kl``, ``top1``, ``dp = q(X_t) - p(X_t)`` and ``logp_x - logq_x``, and the count N;
- speculative (:mod:`kvdrift.analysis.speculative`): the sum of ``f_t`` (rejection
  probabilities), the expected verification rounds for each draft length gamma, and the first
  round's accepted-length indicators ``A >= k``.

Per action the numbers are ratios of these weighted means (a token-weighted mean within the
population; documents weigh as in the study): mean KL, top-1 agreement, mean dp, PPL ratio
``exp(mean(logp_x - logq_x))``, acceptance ``1 - sum f / N``, tokens per round
``E[N] / E[rounds]``, and ``P(A >= k)``. Intervals come from the study's document bootstrap
(the same counts for every action, so contrasts ``a - b``, ``a`` the later action, are paired).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd

from kvdrift.analysis.bootstrap import percentile_interval, weighted_means
from kvdrift.analysis.endpoints import action_pairs
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.speculative import (
    FIRST_ROUND_MAX,
    GAMMAS,
    acceptance_probs,
    before_end,
    expected_rounds,
    first_round_survival,
    generated_lengths,
)
from kvdrift.records.schema import RecordedEstimator

TEACHER_FORCED = ("kl", "top1", "dp", "ppl_ratio")
FORCED_FEATURES = ("tf_kl", "tf_top1", "tf_dp", "tf_logratio")

NOT_ROLLOUT = ("the teacher-forced and speculative readings need complete rollouts (SWRB does "
               "not follow the reference path X from the start); they are absent")
NOT_RECORDED = ("{model}: the step records have no teacher-forced columns (logp_x, logq_x, kl, "
                "top1; runs made before they were recorded), so teacher-forced numbers and "
                "tokens per round are absent")


def reading_features(
    x_eos: np.ndarray, f: np.ndarray, tau: np.ndarray, forced: Mapping[str, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    """Per-document features (``[n_docs, k]``) from step cubes ``[n_docs, K, H]``.

    ``forced`` holds the cubes of ``logp_x``, ``logq_x``, ``kl`` and ``top1``, or None when the
    records lack them (then only the acceptance and the first round are available).
    """
    H = x_eos.shape[-1]
    live = before_end(x_eos)  # t <= N
    out = {
        "positions": generated_lengths(x_eos).mean(axis=1)[:, None].astype(np.float64),
        "spec_rejections": np.where(live, f, 0.0).sum(axis=2).mean(axis=1)[:, None],
        "spec_first_round": first_round_survival(tau, x_eos, min(FIRST_ROUND_MAX, H)).mean(axis=1),
    }
    if forced is None:
        return out
    logp, logq = forced["logp_x"], forced["logq_x"]
    terms = {"tf_kl": forced["kl"], "tf_top1": forced["top1"],
             "tf_dp": np.exp(logq) - np.exp(logp), "tf_logratio": logp - logq}
    for name, cube in terms.items():
        out[name] = np.where(live, cube, 0.0).sum(axis=2).mean(axis=1)[:, None]
    n, K, _ = x_eos.shape
    lengths = generated_lengths(x_eos).reshape(n * K)
    accept = acceptance_probs(logp, logq).reshape(n * K, H)
    out["spec_rounds"] = np.stack(
        [expected_rounds(accept, lengths, g).reshape(n, K).mean(axis=1) for g in GAMMAS], axis=1)
    return out


def _nan(lead: tuple[int, ...], k: int = 0) -> np.ndarray:
    return np.full(lead + ((k,) if k else ()), np.nan)


def derive_readings(m: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The numbers from weighted feature means (leading axes: bootstrap draws). A draw with
    no generated position (every replicate of its documents ended at once, as a question
    answered by EOS can) has no reading: NaN, silently (the interval's percentiles skip it)."""
    positions = m["positions"][..., 0]
    lead = positions.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {"acceptance": 1.0 - m["spec_rejections"][..., 0] / positions,
               "first_round": m["spec_first_round"]}
        out["tokens_per_round"] = (positions[..., None] / m["spec_rounds"] if "spec_rounds" in m
                                   else _nan(lead, len(GAMMAS)))
        for key, feature in zip(TEACHER_FORCED, FORCED_FEATURES, strict=True):
            out[key] = m[feature][..., 0] / positions if feature in m else _nan(lead)
        out["ppl_ratio"] = np.exp(out["ppl_ratio"])
    return out


def _interval(point: np.ndarray, draws: np.ndarray, alpha: float) -> Interval:
    lo, hi = percentile_interval(np.asarray(draws, dtype=float), alpha)
    return Interval(float(point), float(lo), float(hi), 1 - alpha)


# ------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class TeacherForcedNumbers:
    """Mean KL (nats), top-1 agreement, mean dp and the PPL ratio, each with its interval."""

    kl: Interval
    top1: Interval
    dp: Interval
    ppl_ratio: Interval

    def to_json(self) -> dict:
        return {k: getattr(self, k).to_json() for k in TEACHER_FORCED}

    def columns(self) -> dict[str, Interval]:
        return {k: getattr(self, k) for k in TEACHER_FORCED}

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> TeacherForcedNumbers:
        return cls(*(Interval.from_json(data[k] or {}, level) for k in TEACHER_FORCED))

    @classmethod
    def from_arrays(cls, point: Mapping, draws: Mapping, alpha: float) -> TeacherForcedNumbers:
        return cls(*(_interval(point[k], draws[k], alpha) for k in TEACHER_FORCED))


@dataclass(frozen=True)
class SpeculativeNumbers:
    """Acceptance ``1 - F`` (per token), tokens per round by gamma, and ``P(A >= k)``."""

    acceptance: Interval
    tokens_per_round: Mapping[int, Interval]
    first_round: Mapping[int, Interval]

    def to_json(self) -> dict:
        return {"acceptance": self.acceptance.to_json(),
                "tokens_per_round": {str(g): v.to_json() for g, v in
                                     self.tokens_per_round.items()},
                "first_round": {str(k): v.to_json() for k, v in self.first_round.items()}}

    def columns(self) -> dict[str, Interval]:
        return ({"acceptance": self.acceptance}
                | {f"tokens_per_round_{g}": v for g, v in self.tokens_per_round.items()}
                | {f"first_round_{k}": v for k, v in self.first_round.items()})

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> SpeculativeNumbers:
        def table(key: str) -> dict[int, Interval]:
            return {int(k): Interval.from_json(v or {}, level)
                    for k, v in (data.get(key) or {}).items()}
        return cls(Interval.from_json(data["acceptance"] or {}, level),
                   table("tokens_per_round"), table("first_round"))

    @classmethod
    def from_arrays(cls, point: Mapping, draws: Mapping, alpha: float) -> SpeculativeNumbers:
        return cls(
            _interval(point["acceptance"], draws["acceptance"], alpha),
            {g: _interval(point["tokens_per_round"][i], draws["tokens_per_round"][:, i], alpha)
             for i, g in enumerate(GAMMAS)},
            {k + 1: _interval(point["first_round"][k], draws["first_round"][:, k], alpha)
             for k in range(point["first_round"].shape[-1])})


def _interval_columns(intervals: Mapping[str, Interval]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, iv in intervals.items():
        out |= {name: iv.estimate, f"{name}_lo": iv.lo, f"{name}_hi": iv.hi}
    return out


@dataclass(frozen=True)
class StratumNumbers:
    """The numbers within one stratum (documents weigh equally there)."""

    stratum: str
    documents: int
    numbers: TeacherForcedNumbers | SpeculativeNumbers

    def to_json(self) -> dict:
        return {"stratum": self.stratum, "documents": self.documents} | self.numbers.to_json()


@dataclass(frozen=True)
class _Reading:
    """One model x action (``a`` only) or contrast ``a - b`` (``b`` set: the earlier action):
    numbers and strata."""

    model: str
    a: str
    numbers: TeacherForcedNumbers | SpeculativeNumbers
    documents: int = 0
    b: str | None = None
    strata: tuple[StratumNumbers, ...] = ()
    numbers_type: ClassVar[type] = TeacherForcedNumbers

    @property
    def action(self) -> str:
        return self.a

    def _names(self) -> dict:
        if self.b is None:
            return {"model": self.model, "action": self.a, "documents": self.documents}
        return {"model": self.model, "a": self.a, "b": self.b}

    def to_json(self) -> dict:
        return (self._names() | self.numbers.to_json()
                | {"strata": [s.to_json() for s in self.strata]})

    def row(self) -> dict:
        names = self._names()
        names.pop("documents", None)
        return names | _interval_columns(self.numbers.columns())

    def to_frame(self) -> pd.DataFrame:
        """One row: names, then each number's estimate with ``_lo``/``_hi``."""
        return pd.DataFrame([self.row()])

    @classmethod
    def from_json(cls, data: Mapping, level: float):
        contrast = "a" in data
        numbers = cls.numbers_type.from_json(data, level)
        strata = tuple(StratumNumbers(str(s["stratum"]), int(s["documents"]),
                                      cls.numbers_type.from_json(s, level))
                       for s in data.get("strata") or ())
        return cls(str(data["model"]), str(data["a"] if contrast else data["action"]), numbers,
                   int(data.get("documents", 0)), str(data["b"]) if contrast else None, strata)


@dataclass(frozen=True)
class TeacherForcedResult(_Reading):
    """Teacher-forced numbers of one action (``b`` None) or a contrast ``a - b``.

    JSON: ``{model, action, documents, kl, top1, dp, ppl_ratio, strata}`` (a contrast:
    ``{model, a, b, ...}``), each number ``{estimate, lo, hi}``.
    """

    numbers_type: ClassVar[type] = TeacherForcedNumbers


@dataclass(frozen=True)
class SpeculativeResult(_Reading):
    """Speculative numbers of one action (``b`` None) or a contrast ``a - b``.

    JSON: ``{model, action, documents, acceptance, tokens_per_round, first_round, strata}``;
    ``tokens_per_round`` maps each gamma (a string key) and ``first_round`` each k (a string
    key) to an interval; ``first_round[k]`` is ``P(A >= k)``, the probability that the first
    round accepts at least k drafts (for draft length gamma >= k).
    """

    numbers_type: ClassVar[type] = SpeculativeNumbers


# ------------------------------------------------------------------------------ entries


def _difference(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> dict:
    """``a - b`` of every number."""
    return {k: a[k] - b[k] for k in a}


def reading_entries(
    model: str, features: Mapping[str, object], weights: np.ndarray, counts: np.ndarray,
    alpha: float,
) -> dict[str, list]:
    """Every action's and contrast's readings of one model, overall and per stratum.

    ``features`` maps action -> :class:`~kvdrift.analysis.features.DocFeatures` (same documents,
    same order); ``weights`` are the study's document weights and ``counts`` its bootstrap
    counts. Returns lists under ``teacher_forced``, ``speculative``,
    ``teacher_forced_contrasts`` and ``speculative_contrasts`` (empty when the features lack the
    readings, e.g. under SWRB; teacher-forced lists empty when the records lack its columns).
    """
    out: dict[str, list] = {k: [] for k in ("teacher_forced", "speculative",
                                            "teacher_forced_contrasts", "speculative_contrasts")}
    actions = list(features)
    if not actions or not all(f.measured.branches for f in features.values()):
        return out
    forced = all(f.measured.forced for f in features.values())
    strata = next(iter(features.values())).strata
    cells = [(None, np.arange(strata.size), weights, counts)]
    for label in sorted(set(strata.tolist()), key=str):
        members = np.flatnonzero(strata == label)
        cells.append((str(label), members, np.full(members.size, 1.0 / members.size),
                      counts[:, members]))
    derived = {}  # (stratum, action) -> (point, draws, documents)
    for label, members, w, c in cells:
        for a, f in features.items():
            cols = {k: v[members] for k, v in f.columns.items()
                    if k == "positions" or k.startswith(("tf_", "spec_"))}
            derived[label, a] = (derive_readings(weighted_means(cols, w)),
                                 derive_readings(weighted_means(cols, w, c)), int(members.size))
    kinds = [("speculative", SpeculativeResult, SpeculativeNumbers)]
    if forced:
        kinds.insert(0, ("teacher_forced", TeacherForcedResult, TeacherForcedNumbers))
    labels = [label for label, *_ in cells]
    pairs = [(a, None) for a in actions] + action_pairs(actions)  # alone, then each a - b
    for key, result, numbers in kinds:
        for a, b in pairs:
            per_cell = []
            for label in labels:
                pa, da, n = derived[label, a]
                if b is not None:  # the contrast a - b on the same draws (paired)
                    pb, db, _ = derived[label, b]
                    pa, da = _difference(pa, pb), _difference(da, db)
                per_cell.append((label, n, numbers.from_arrays(pa, da, alpha)))
            (_, n, overall), *strata_cells = per_cell
            out[key if b is None else f"{key}_contrasts"].append(result(
                model, a, overall, n, b,
                tuple(StratumNumbers(label, m, x) for label, m, x in strata_cells)))
    return out


def reading_notes(estimator: RecordedEstimator, models_without_forced: list[str]) -> list[str]:
    """Why readings are absent: under SWRB, or for runs without the teacher-forced columns."""
    if not estimator.complete_branches:
        return [NOT_ROLLOUT]
    return [NOT_RECORDED.format(model=m) for m in models_without_forced]
