"""The frontier search: the least cache whose measure is within the tolerance, certified.

Each family's budgets are tried coarse first, then refined by bisection around the crossing
(continuous axes), spending a second batch of replicates ("look") on a budget only while its
interval straddles the tolerance and it could still change the answer. Every interval the
search could ever compute (every budget of every family, at every look) is held at level
``1 - alpha / M`` (Bonferroni over those ``M``), so with probability at least ``1 - alpha`` all
of them hold at once, whichever the search computed: every certified point then meets the
tolerance and every "certainly dominated" holds (docs/method.md, "The compression frontier").
Budgets of one look share each document's seed across budgets (common random numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from scipy import stats

from kvdrift import checks
from kvdrift.analysis.interval import Interval
from kvdrift.frontier_search.families import Budget, Family
from kvdrift.frontier_search.measure import Measure
from kvdrift.frontier_search.result import BudgetResult, FamilyResult, FrontierResult


@dataclass(frozen=True)
class Sample:
    """One look at one budget: per document, the per-replicate values of the measure."""

    values: dict[str, np.ndarray]  # doc id -> [K] values
    kv_fraction: float  # Q's cache as a fraction of the full cache (mean over documents)
    calls: int  # coupled positions evaluated (rows x positions)


class Evaluator(Protocol):
    """Runs budgets at a look and returns their samples (same documents at every budget)."""

    def evaluate(self, budgets: Sequence[Budget], look: int) -> dict[Budget, Sample]: ...


@dataclass(frozen=True)
class SearchSettings:
    """How sure and how thorough: level ``1 - alpha`` over the whole search, at most ``looks``
    batches of ``replicates`` per document at a budget."""

    alpha: float = 0.05
    looks: int = 2
    replicates: int = 8
    exhaustive: bool = False  # every budget at every look (the full grid, for comparison)

    def __post_init__(self) -> None:
        checks.number(self.alpha, "alpha", 0, 1, open_lo=True, open_hi=True)
        checks.integer(self.looks, "looks", 1, 8)
        checks.integer(self.replicates, "replicates", 2)


def pooled_interval(samples: Sequence[Sample], level: float, low: float, high: float
                    ) -> Interval:
    """The mean over documents of each document's mean, with a t-interval, clipped to the
    measure's range ``[low, high]``.

    The variance of one replicate is pooled within documents (``df = sum(K_d - 1)``) and,
    for a bounded measure, shrunk toward the largest variance a value in the range can have
    at that mean (Bhatia-Davis, ``(m - low)(high - m)``) by one pseudo-replicate, with ``m``
    the mean of the values and one pseudo-value at the range's midpoint. Without it, rare
    large values that a handful of replicates did not show leave the interval far too
    narrow (a nominal 99% interval covered 66% of finite worlds at a risk of 0.025 with
    K = 8; docs/method.md, section 12). The documents are fixed: the interval is over
    replicates, for these documents.
    """
    docs = sorted(samples[0].values)
    means, squares, df, inv_k, total, count = [], 0.0, 0, 0.0, 0.0, 0
    for d in docs:
        v = np.concatenate([s.values[d] for s in samples]).astype(np.float64)
        v = v[np.isfinite(v)]
        if v.size < 2:
            raise ValueError(f"document {d!r} has fewer than 2 replicates with a value")
        means.append(v.mean())
        squares += float(((v - v.mean()) ** 2).sum())
        df += v.size - 1
        inv_k += 1 / v.size
        total, count = total + float(v.sum()), count + v.size
    n = len(docs)
    estimate = float(np.mean(means))
    pseudo = 0.0
    if np.isfinite(low) and np.isfinite(high):
        m = (total + (low + high) / 2) / (count + 1)
        pseudo = (m - low) * (high - m)
    var = (squares + pseudo) / (df + 1) * inv_k / n**2
    if var == 0:
        return Interval(estimate, estimate, estimate, level)
    half = float(stats.t.ppf(1 - (1 - level) / 2, df)) * var**0.5
    return Interval(estimate, max(low, estimate - half), min(high, estimate + half), level)


@dataclass
class _Tried:
    budget: Budget
    samples: list[Sample] = field(default_factory=list)
    interval: Interval | None = None
    status: str = "untried"  # "certified" | "fails" | "undecided"


class _FamilySearch:
    def __init__(self, family: Family, measure: Measure, settings: SearchSettings,
                 level: float) -> None:
        self.family, self.measure, self.settings, self.level = family, measure, settings, level
        self.tried = {b.index: _Tried(b) for b in family.budgets}

    def record(self, index: int, sample: Sample) -> None:
        t = self.tried[index]
        t.samples.append(sample)
        kind = self.measure.kind
        t.interval = pooled_interval(t.samples, self.level, kind.low, kind.high)
        if self.measure.certified(t.interval.lo, t.interval.hi):
            t.status = "certified"
        elif self.measure.certainly_fails(t.interval.lo, t.interval.hi):
            t.status = "fails"
        else:
            t.status = "undecided"

    def _indices(self, status: str) -> list[int]:
        return [i for i, t in self.tried.items() if t.status == status]

    def cheapest(self) -> int:
        """The cheapest certified budget's index (-1 if none)."""
        return max(self._indices("certified"), default=-1)

    def requests(self) -> list[tuple[int, int]]:
        """(budget index, look) to run next; empty when the family's answer is settled."""
        if self.settings.exhaustive:
            done = min(len(t.samples) for t in self.tried.values())
            return [(i, done + 1) for i in self.tried] if done < self.settings.looks else []
        if not any(t.samples for t in self.tried.values()):
            return [(i, 1) for i in self.family.coarse]
        c = self.cheapest()  # undecided budgets with less cache than it could still win
        more = [(i, len(self.tried[i].samples) + 1) for i in self._indices("undecided")
                if i > c and len(self.tried[i].samples) < self.settings.looks]
        if more:
            return more
        if not self.family.continuous:
            return []
        tried = sorted(i for i, t in self.tried.items() if t.samples)
        below = [i for i in tried if i > c]
        lo = below[0] if below else len(self.tried)  # the next budget tried with less cache
        if c == -1 and 0 not in tried:
            return [(0, 1)]  # nothing certified: try the most cache the axis offers
        if lo - c > 1 and c >= 0:
            return [((c + lo) // 2, 1)]
        return []

    def result(self) -> tuple[list[BudgetResult], BudgetResult | None, list[str]]:
        rows = []
        for t in sorted(self.tried.values(), key=lambda t: t.budget.index):
            if not t.samples:
                continue
            rows.append(BudgetResult(
                family=self.family.name, label=t.budget.label, action=t.budget.action,
                index=t.budget.index,
                kv_fraction=float(np.mean([s.kv_fraction for s in t.samples])),
                interval=t.interval, status=t.status, looks=len(t.samples),
                replicates=sum(len(next(iter(s.values.values()))) for s in t.samples),
                calls=sum(s.calls for s in t.samples)))
        c = self.cheapest()
        certified = next((r for r in rows if r.index == c), None)
        return rows, certified, self._not_monotone(rows)

    def _not_monotone(self, rows: list[BudgetResult]) -> list[str]:
        """Pairs of budgets whose intervals are ordered against the budget: the one with more
        cache certainly worse than one with less (both intervals hold jointly)."""
        out = []
        for i, more in enumerate(rows):
            for less in rows[i + 1:]:
                a, b = more.interval, less.interval
                worse = a.lo > b.hi if self.measure.op == "<=" else a.hi < b.lo
                if worse:
                    out.append(f"{self.family.name}: not monotone in the budget: {more.label} "
                               f"(more cache) is certainly worse than {less.label}")
                    break
        return out


def check_family_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` if they are one or more distinct family names; else one clear error."""
    return checks.distinct_items(names, "families", "one or more distinct family names")


def frontier_search(families: Sequence[Family], measure: Measure, evaluator: Evaluator,
                    settings: SearchSettings = SearchSettings()) -> FrontierResult:
    """Search every family's budget axis for the least cache within the measure's tolerance."""
    check_family_names([f.name for f in families])
    tests = sum(len(f.budgets) for f in families) * settings.looks
    level = 1 - settings.alpha / tests
    searches = [_FamilySearch(f, measure, settings, level) for f in families]
    while True:
        wanted = [(s, i, look) for s in searches for i, look in s.requests()]
        if not wanted:
            break
        for look in sorted({w[2] for w in wanted}):
            batch = [(s, i) for s, i, lk in wanted if lk == look]
            samples = evaluator.evaluate([s.family.budgets[i] for s, i in batch], look)
            for s, i in batch:
                s.record(i, samples[s.family.budgets[i]])
    families_out, warnings, rows = [], [], []
    for s in searches:
        r, cert, warn = s.result()
        rows.extend(r)
        warnings.extend(warn)
        families_out.append(FamilyResult(s.family.name, tuple(r), cert))
    calls = sum(r.calls for r in rows)
    per_look = calls / max(1, sum(r.looks for r in rows))
    return FrontierResult.assemble(
        measure=str(measure), better=measure.op, tolerance=measure.tolerance,
        alpha=settings.alpha, tests=tests, level=level, families=tuple(families_out),
        calls=calls, full_grid_calls=int(round(per_look * tests)),
        warnings=tuple(warnings))
