"""The measure a frontier keeps within a tolerance: which per-replicate value, which side.

A measure is read per replicate from a study directory's records, so its estimate over the
documents is a mean of per-replicate values (docs/method.md, "The compression frontier").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvdrift import checks
from kvdrift.analysis import registry
from kvdrift.analysis.speculative import acceptance_probs

if TYPE_CHECKING:  # pandas is not imported for the checks that run before a model loads
    import pandas as pd


def _replicate_column(column: str) -> Callable[[pd.DataFrame, pd.DataFrame], pd.Series]:
    def read(steps: pd.DataFrame, replicates: pd.DataFrame) -> pd.Series:
        if column not in replicates or replicates[column].isna().all():
            raise ValueError(f"the records hold no {column!r} per replicate (SWRB records "
                             "follow no complete branch pair; use estimator = \"rollout\")")
        return replicates.set_index(["doc_id", "replicate"])[column]
    return read


def _step_mean(values: Callable[[pd.DataFrame], np.ndarray], what: str
               ) -> Callable[[pd.DataFrame, pd.DataFrame], pd.Series]:
    """The mean over a replicate's positions up to X's end (NaN positions left out)."""
    def read(steps: pd.DataFrame, replicates: pd.DataFrame) -> pd.Series:
        if "logp_x" not in steps or steps["logp_x"].isna().all():
            raise ValueError(f"the records hold no teacher-forced columns for {what} "
                             "(SWRB records; use estimator = \"rollout\")")
        frame = steps[["doc_id", "replicate"]].assign(value=values(steps))
        return frame.groupby(["doc_id", "replicate"])["value"].mean()
    return read


NEEDS_ANSWERS = "the task measure needs scored documents (an \"answer\" per document)"


def _task_gap(steps: pd.DataFrame, replicates: pd.DataFrame) -> pd.Series:
    if "score_x" not in replicates or replicates["score_x"].isna().all():
        raise ValueError(NEEDS_ANSWERS)
    reps = replicates.dropna(subset=["score_x", "score_y"]).set_index(["doc_id", "replicate"])
    return reps["score_y"] - reps["score_x"]


@dataclass(frozen=True)
class MeasureKind:
    """One measure kvdrift can hold to a tolerance."""

    name: str
    label: str
    low: float  # the range of a per-replicate value (-inf/inf where unbounded)
    high: float
    read: Callable[[pd.DataFrame, pd.DataFrame], pd.Series]  # (steps, reps) -> per replicate
    better: str  # "<=" when smaller is better (risks), ">=" when larger is
    needs_answers: bool = False  # read from task scores: documents must carry answers


def _risk(name: str) -> MeasureKind:
    """A risk of the registry of quantities, read from its per-replicate column."""
    q = registry.quantity(name)
    return MeasureKind(q.name, f"{q.description} {q.name}", 0.0, 1.0,
                       _replicate_column(q.plan[0]), "<=")


MEASURES: dict[str, MeasureKind] = {m.name: m for m in (
    _risk("R_tv"), _risk("R"), _risk("F"),
    MeasureKind("kl", "teacher-forced KL(P||Q) per token", 0.0, math.inf,
                _step_mean(lambda s: s["kl"].to_numpy(dtype=float), "kl"), "<="),
    MeasureKind("acceptance", "self-speculative acceptance", 0.0, 1.0,
                _step_mean(lambda s: acceptance_probs(s["logp_x"], s["logq_x"]), "acceptance"),
                ">="),
    MeasureKind("task", "task score difference Q - P", -1.0, 1.0, _task_gap, ">=", True),
)}
_ALIASES = {"task diff": "task", "task_diff": "task", "r_tv": "R_tv"}
_PATTERN = re.compile(r"^\s*(?P<name>[A-Za-z_][A-Za-z_ ]*?)\s*(?P<op><=|>=)\s*"
                      r"(?P<tol>[-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Measure:
    """A measure and its tolerance: ``R_tv <= 0.05`` keeps rollout-TV risk at most 5%.

    ``cap`` states a bound on an unbounded measure's per-replicate values (``kl``): it is an
    assumption the certificate rests on, and a value above it stops the search. Without one,
    an unbounded measure gets estimates only, never "certified"."""

    kind: MeasureKind
    tolerance: float
    cap: float | None = None

    @property
    def op(self) -> str:
        """``"<="`` or ``">="``: the side a measure of this kind is kept on."""
        return self.kind.better

    @property
    def certifiable(self) -> bool:
        """Whether its values have a known range (its own, or the stated cap)."""
        return math.isfinite(self.kind.low) and (math.isfinite(self.kind.high)
                                                 or self.cap is not None)

    @property
    def range(self) -> tuple[float, float]:
        """The range of a per-replicate value: the kind's, its upper end the cap if stated."""
        return self.kind.low, self.kind.high if self.cap is None else self.cap

    def __str__(self) -> str:
        return f"{self.kind.name} {self.op} {self.tolerance:g}"

    def describe(self) -> str:
        """The measure with its range, as the report states it."""
        if not self.certifiable:
            return f"{self} (unbounded: estimates only, not certified)"
        low, high = self.range
        stated = " (stated cap)" if self.cap is not None else ""
        return f"{self} (values in [{low:g}, {high:g}]{stated})"

    def meets(self, value: float) -> bool:
        """Whether ``value`` (a number, or elementwise an array) is within the tolerance."""
        return value <= self.tolerance if self.op == "<=" else value >= self.tolerance

    def check_sample(self, values: dict[str, np.ndarray], where: str) -> None:
        """Refuse any value the bound cannot take: not a number other than NaN (NaN marks a
        value absent by design and is left out), or outside the measure's range (a stated
        cap the data broke); in one line naming ``where`` (the budget), the document and the
        value. Every value of a look counts, those a look leaves out included."""
        low, high = self.range
        for doc, v in values.items():
            v = np.asarray(v, dtype=np.float64)
            bad = v[~np.isnan(v) & ((v < low) | (v > high) | ~np.isfinite(v))]
            if bad.size:
                what = "the stated cap" if self.cap is not None else "the measure's range"
                raise ValueError(f"{self.kind.name} value {float(bad[0]):g} at {where}, "
                                 f"document {doc}, lies outside [{low:g}, {high:g}], {what}; "
                                 "a bound that assumes the range would not hold"
                                 + (" (state a larger cap)" if self.cap is not None else ""))


def parse_cap(kind: MeasureKind, cap: float | None) -> float | None:
    """A stated cap: only for an unbounded measure, above its tolerance's side."""
    if cap is None:
        return None
    if math.isfinite(kind.high):
        raise ValueError(f"{kind.name} is bounded in [{kind.low:g}, {kind.high:g}]; a cap is "
                         "only for an unbounded measure (kl)")
    checks.number(cap, f"{kind.name} cap", kind.low, math.inf, open_lo=True,
                  rule=f"a finite number above {kind.low:g}")
    return float(cap)


def parse_measure(text: str, cap: float | None = None) -> Measure:
    """``"R_tv <= 0.05"`` -> :class:`Measure` (``cap``: a stated bound on an unbounded
    measure's values); one line naming the bad part otherwise."""
    allowed = ", ".join(f"{m.name} {m.better} x" for m in MEASURES.values())
    match = _PATTERN.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"measure must read 'NAME <= x' or 'NAME >= x' ({allowed}); "
                         f"got {text!r}")
    name = " ".join(match["name"].split())
    name = _ALIASES.get(name.lower(), name)
    kind = MEASURES[checks.choice(name, "measure name", MEASURES)]
    try:
        tolerance = float(match["tol"])
    except ValueError:
        raise ValueError(f"measure tolerance must be a number; got {match['tol']!r}") from None
    checks.number(tolerance, f"{name} tolerance", kind.low, kind.high,
                  rule=f"a number within [{kind.low:g}, {kind.high:g}]")
    if match["op"] != kind.better:
        raise ValueError(f"{name} is kept within a tolerance with '{kind.better}' "
                         f"({'smaller' if kind.better == '<=' else 'larger'} is better); "
                         f"got {match['op']!r}")
    cap = parse_cap(kind, cap)
    if cap is not None and tolerance > cap:
        raise ValueError(f"{name} tolerance {tolerance:g} lies above the stated cap {cap:g}")
    return Measure(kind, tolerance, cap)
