"""What a frontier search returns: every budget tried with its interval, each family's
certified cheapest budget, the overall one, the Pareto frontier and the dominated families."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvdrift.analysis.interval import Interval


@dataclass(frozen=True)
class BudgetResult:
    """One budget tried: its measure's interval (simultaneous level), and whether it is
    certified (the whole interval within the tolerance), certainly fails, or undecided."""

    family: str
    label: str
    action: str
    index: int  # position on the family's axis, 0 = most cache
    kv_fraction: float
    interval: Interval
    status: str  # "certified" | "fails" | "undecided"
    looks: int
    replicates: int  # per document, over all looks
    calls: int  # coupled positions evaluated

    def to_json(self) -> dict:
        return {"family": self.family, "budget": self.label, "action": self.action,
                "kv_fraction": self.kv_fraction, **self.interval.to_json(),
                "status": self.status, "looks": self.looks, "replicates": self.replicates,
                "calls": self.calls}


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
    """The budgets no other budget beats on both cache and measure estimate (less cache
    first)."""
    keep = []
    for p in points:
        beaten = any(q is not p and q.kv_fraction <= p.kv_fraction
                     and _better(q.interval.estimate, p.interval.estimate, op)
                     and (q.kv_fraction < p.kv_fraction
                          or q.interval.estimate != p.interval.estimate)
                     for q in points)
        if not beaten:
            keep.append(p)
    return tuple(sorted(keep, key=lambda p: p.kv_fraction))


@dataclass(frozen=True)
class FrontierResult:
    """The answer: ``best`` (least cache certified within the tolerance, over all families),
    each family's certified budget, the families certainly dominated by ``best``, the Pareto
    frontier of every budget tried, and the search's cost against the full grid."""

    measure: str
    better: str
    tolerance: float
    alpha: float
    tests: int  # intervals the search could compute (Bonferroni's M)
    level: float  # each interval's level, 1 - alpha / tests
    families: tuple[FamilyResult, ...]
    best: BudgetResult | None
    dominated: tuple[str, ...]
    frontier: tuple[BudgetResult, ...]
    calls: int
    full_grid_calls: int  # every budget at every look
    warnings: tuple[str, ...]

    @classmethod
    def assemble(cls, *, measure: str, better: str, tolerance: float, alpha: float,
                 tests: int, level: float, families: tuple[FamilyResult, ...], calls: int,
                 full_grid_calls: int, warnings: tuple[str, ...]) -> FrontierResult:
        certified = [f.certified for f in families if f.certified is not None]
        best = min(certified, key=lambda r: r.kv_fraction, default=None)
        dominated = []
        for f in families:
            if best is None or f.family == best.family:
                continue
            # a certain failure with at least best's cache: with a measure monotone in the
            # budget, every budget of f with less cache fails too
            if any(b.status == "fails" and b.kv_fraction >= best.kv_fraction
                   for b in f.budgets):
                dominated.append(f.family)
        points = tuple(b for f in families for b in f.budgets)
        return cls(measure, better, tolerance, alpha, tests, level, families, best,
                   tuple(dominated), pareto(points, better), calls, full_grid_calls, warnings)

    def to_json(self) -> dict:
        return {
            "measure": self.measure, "tolerance": self.tolerance, "alpha": self.alpha,
            "tests": self.tests, "level": self.level,
            "best": None if self.best is None else self.best.to_json(),
            "families": {f.family: {
                "certified": None if f.certified is None else f.certified.to_json(),
                "dominated": f.family in self.dominated,
                "budgets": [b.to_json() for b in f.budgets]} for f in self.families},
            "pareto": [{"family": b.family, "budget": b.label} for b in self.frontier],
            "calls": self.calls, "full_grid_calls": self.full_grid_calls,
            "warnings": list(self.warnings),
        }

    def to_frame(self) -> pd.DataFrame:
        """One row per budget tried: family, budget, action, kv_fraction, estimate, lo, hi,
        status, looks, replicates, calls, pareto (on the frontier)."""
        on = {(b.family, b.index) for b in self.frontier}
        rows = [b.to_json() | {"pareto": (b.family, b.index) in on}
                for f in self.families for b in f.budgets]
        return pd.DataFrame(rows)
