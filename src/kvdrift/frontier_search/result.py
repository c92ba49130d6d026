"""What a frontier search returns: every budget tried with its bounds and status, each family's
certified cheapest budget, the overall one, the frontier of certified budgets, the dominated
families, and the statement of what is guaranteed."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from kvdrift.frontier_search.measure import Measure
from kvdrift.notebook import HtmlTable

#: How a budget's bounds are computed (reported with the result).
BOUND_METHOD = ("betting confidence sequence for the mean over documents of bounded "
                "per-replicate values (Waudby-Smith & Ramdas, JRSS-B 2024), checked after "
                "every round of replicates")
#: What each status means, as the report prints it.
STATUS_TEXT = {
    "certified": "certified within the tolerance",
    "blocked": "bound within, not certified (a budget with more cache is not)",
    "fails": "outside the tolerance at level 1 - alpha",
    "undecided": "undecided",
    "estimate within": "estimate within (not certified: unbounded measure)",
    "estimate beyond": "estimate outside (not certified: unbounded measure)",
}


@dataclass(frozen=True)
class Scheme:
    """How the level ``alpha`` is shared: fixed-sequence testing down each family's axis at
    ``alpha / families`` (certified labels), Bonferroni over every budget of every axis
    (fails labels)."""

    alpha: float
    families: int
    budgets: int  # budgets on all the axes together

    @property
    def certify_level(self) -> float:
        """Each family's level for its sequence of certifications."""
        return self.alpha / self.families

    @property
    def fail_level(self) -> float:
        """Each budget's level for a "fails" label."""
        return self.alpha / self.budgets

    def describe(self) -> str:
        return (f"fixed-sequence testing down each family's axis from the most cache, "
                f"alpha split across the {self.families} families ({self.certify_level:.3g} "
                f"each); 'fails' labels Bonferroni over all {self.budgets} budgets "
                f"({self.fail_level:.3g} each)")

    def to_json(self) -> dict:
        return {"name": "fixed-sequence per family, Bonferroni across families",
                "alpha": self.alpha, "families": self.families, "budgets": self.budgets,
                "certify_level": self.certify_level, "fail_level": self.fail_level,
                "description": self.describe()}


@dataclass(frozen=True)
class BudgetResult:
    """One budget tried: its estimate, its bounds (the certifying side at the family's level,
    the other at the fails level), its status and what it cost."""

    family: str
    label: str
    action: str
    index: int  # position on the family's axis, 0 = most cache
    kv_fraction: float
    estimate: float  # mean over documents of the values the bounds use
    lo: float
    hi: float
    status: str  # a key of STATUS_TEXT
    rounds: int  # values per document the bounds use (complete rounds)
    decided_at: int | None  # the round at which its own test was decided
    looks: int
    replicates: int  # drawn per document, over all looks (values left out included)
    calls: int  # coupled positions evaluated
    #: undecided: about how many more replicates per document its values suggest (inf: none
    #: suffices at its current estimate); None when decided
    more_replicates: float | None = None

    def to_json(self) -> dict:
        return {"family": self.family, "budget": self.label, "action": self.action,
                "kv_fraction": self.kv_fraction, "estimate": self.estimate, "lo": self.lo,
                "hi": self.hi, "status": self.status, "status_text": STATUS_TEXT[self.status],
                "rounds": self.rounds, "decided_at": self.decided_at, "looks": self.looks,
                "replicates": self.replicates, "calls": self.calls,
                "more_replicates": self.more_replicates, "more_text": self.more_text()}

    def more_text(self) -> str:
        """What an undecided budget's values suggest, in words ("" when decided)."""
        if self.more_replicates is None:
            return ""
        if math.isinf(self.more_replicates):
            return "no number of replicates suffices at its current estimate"
        return f"about {self.more_replicates:.0f} more replicates per document"

    def bound(self, op: str) -> float:
        """The certifying side: the upper bound for a measure kept ``<=``, else the lower."""
        return self.hi if op == "<=" else self.lo


@dataclass(frozen=True)
class FamilyResult:
    """A family's budgets tried (most cache first) and its certified cheapest one."""

    family: str
    budgets: tuple[BudgetResult, ...]
    certified: BudgetResult | None


def _better(a: float, b: float, op: str) -> bool:
    """``a`` is at least as good as ``b`` for a measure kept with ``op``."""
    return a <= b if op == "<=" else a >= b


def pareto(points: tuple[BudgetResult, ...], op: str) -> tuple[BudgetResult, ...]:
    """The certified budgets no other certified budget beats on both cache and certified
    bound (less cache first); budgets without a known kv_fraction are left out."""
    cert = [p for p in points if p.status == "certified" and math.isfinite(p.kv_fraction)]
    keep = []
    for p in cert:
        beaten = any(q is not p and q.kv_fraction <= p.kv_fraction
                     and _better(q.bound(op), p.bound(op), op)
                     and (q.kv_fraction < p.kv_fraction or q.bound(op) != p.bound(op))
                     for q in cert)
        if not beaten:
            keep.append(p)
    return tuple(sorted(keep, key=lambda p: p.kv_fraction))


def _not_monotone(family: FamilyResult) -> list[str]:
    """Budgets that fail while one with less cache is within on its own bound."""
    out = []
    for i, more in enumerate(family.budgets):
        if more.status != "fails":
            continue
        less = next((b for b in family.budgets[i + 1:] if b.status in ("certified",
                                                                       "blocked")), None)
        if less is not None:
            out.append(f"{family.family}: not monotone in the budget: {more.label} (more "
                       f"cache) fails (outside the tolerance at level 1 - alpha) while "
                       f"{less.label} is within on its own bound")
    return out


@dataclass(frozen=True, repr=False)  # HtmlTable's short repr
class FrontierResult(HtmlTable):
    """The answer: ``best`` (least cache certified within the tolerance, over all families;
    ``ties`` the other families certified at the same cache), each family's certified budget,
    the families dominated by ``best`` (assuming monotonicity), the frontier of certified
    budgets, the guarantee's terms and the search's cost against the full grid."""

    measure: str
    better: str
    tolerance: float
    alpha: float
    measure_range: str  # the measure with its range, as the guarantee uses it
    certifiable: bool
    bound_method: str
    scheme: Scheme
    documents: int
    families: tuple[FamilyResult, ...]
    best: BudgetResult | None
    ties: tuple[BudgetResult, ...]
    dominated: tuple[str, ...]
    frontier: tuple[BudgetResult, ...]
    calls: int
    full_grid_calls: int  # every budget of every axis at the most replicates
    looks: int
    warnings: tuple[str, ...]

    @classmethod
    def assemble(cls, *, measure: Measure, alpha: float, scheme: Scheme, documents: int,
                 families: tuple[FamilyResult, ...], calls: int, full_grid_calls: int,
                 looks: int) -> FrontierResult:
        warnings: list[str] = []
        certified = [f.certified for f in families if f.certified is not None]
        unknown = [c for c in certified if not math.isfinite(c.kv_fraction)]
        for c in unknown:
            warnings.append(f"{c.family} {c.label}: its kv_fraction is unknown (the records "
                            "hold none); left out of the best and the frontier")
        known = [c for c in certified if math.isfinite(c.kv_fraction)]
        best = min(known, key=lambda r: r.kv_fraction, default=None)
        ties = tuple(c for c in known if best is not None and c is not best
                     and c.kv_fraction == best.kv_fraction)
        if ties:
            warnings.append("tie at the least cache: " + ", ".join(
                f"{c.family} {c.label}" for c in (best, *ties)))
        dominated = []
        for f in families:
            contradicted = _not_monotone(f)
            warnings.extend(contradicted)
            if best is None or f.family == best.family:
                continue
            # a failure (at level 1 - alpha) with at least best's cache, nothing with less cache
            # within: with a measure that gets no better as the cache shrinks, f cannot meet
            # the tolerance with best's cache or less
            fails = [b for b in f.budgets if b.status == "fails"
                     and b.kv_fraction >= best.kv_fraction]
            if fails and not contradicted:
                dominated.append(f.family)
        points = tuple(b for f in families for b in f.budgets)
        return cls(str(measure), measure.op, measure.tolerance, alpha, measure.describe(),
                   measure.certifiable, BOUND_METHOD if measure.certifiable
                   else "point estimates only (unbounded measure)", scheme, documents,
                   families, best, ties, tuple(dominated), pareto(points, measure.op), calls,
                   full_grid_calls, looks, tuple(warnings))

    def guarantee(self) -> str:
        """The headline's sentence: what holds, for which estimand, with what probability."""
        if not self.certifiable:
            return (f"{self.measure_range}: no distribution-free bound on its mean exists "
                    "without a stated cap on its values (--cap); these are estimates only, "
                    "not certified.")
        return (f"With probability at least {1 - self.alpha:.3g}, every budget labelled "
                f"certified has a mean {self.measure} over these {self.documents} documents "
                "(each document's expected value, averaged; not over other documents); "
                "separately, every budget labelled 'fails' breaks it, also with probability "
                f"at least {1 - self.alpha:.3g}.")

    def to_json(self) -> dict:
        return {
            "measure": self.measure, "tolerance": self.tolerance, "alpha": self.alpha,
            "measure_range": self.measure_range, "certifiable": self.certifiable,
            "bound_method": self.bound_method, "multiplicity": self.scheme.to_json(),
            "scope": f"these {self.documents} documents", "documents": self.documents,
            "guarantee": self.guarantee(),
            "monotonicity": "'dominated' assumes the measure gets no better as the cache "
                            "shrinks (checked only at the budgets tried)",
            "best": None if self.best is None else self.best.to_json(),
            "ties": [b.to_json() for b in self.ties],
            "families": {f.family: {
                "certified": None if f.certified is None else f.certified.to_json(),
                "dominated": f.family in self.dominated,
                "budgets": [b.to_json() for b in f.budgets]} for f in self.families},
            "pareto": [{"family": b.family, "budget": b.label} for b in self.frontier],
            "calls": self.calls, "full_grid_calls": self.full_grid_calls, "looks": self.looks,
            "warnings": list(self.warnings),
        }

    def to_frame(self) -> pd.DataFrame:
        """One row per budget tried: family, budget, action, kv_fraction, estimate, lo, hi,
        status, rounds, decided_at, looks, replicates, calls, pareto (on the frontier)."""
        on = {(b.family, b.index) for b in self.frontier}
        rows = [b.to_json() | {"pareto": (b.family, b.index) in on}
                for f in self.families for b in f.budgets]
        return pd.DataFrame(rows)
