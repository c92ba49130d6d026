"""The frontier search: per family, the least cache whose measure is within the tolerance,
certified by fixed-sequence testing down the family's axis with anytime-valid bounds.

Each budget's mean over the documents gets a betting confidence sequence (``betting.py``),
checked after every round of replicates, so a budget is run only until it is decided. A family's
budgets are tested in a fixed order, most cache first: a budget is **certified** when its own
bound is within the tolerance and every budget before it is certified; the first one that is
not stops the sequence, so nothing after it is run. Each family's sequence holds at level
``alpha / families``, so with probability at least ``1 - alpha`` no certified budget of any
family breaks the tolerance, under any dependence between budgets (they share random numbers
within a look) and whatever the search chose to run. "Fails" labels hold jointly at level
``1 - alpha`` on their own (Bonferroni over every budget of every axis). docs/method.md
section 12 states the guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from kvdrift import checks, limits
from kvdrift.frontier_search.betting import (
    BET,
    Bet,
    bound,
    first_round_beyond,
    rounds_of,
    rounds_suggested,
)
from kvdrift.frontier_search.families import Budget, Family, check_family_names
from kvdrift.frontier_search.feasibility import fewest_replicates
from kvdrift.frontier_search.measure import Measure
from kvdrift.frontier_search.result import BudgetResult, FamilyResult, FrontierResult, Scheme


@dataclass(frozen=True)
class Sample:
    """One look at one budget: per document, the per-replicate values of the measure."""

    values: dict[str, np.ndarray]  # doc id -> [K] values
    kv_fraction: float  # Q's cache as a fraction of the full cache (mean over documents)
    calls: int  # coupled positions evaluated (rows x positions)


class Evaluator(Protocol):
    """Runs budgets at a look, ``replicates`` per document each, and returns their samples
    (same documents at every budget).

    Look ``L`` must use random numbers that no earlier look used (budgets of one look may
    share them: common random numbers)."""

    def evaluate(self, budgets: Sequence[Budget], look: int, replicates: int
                 ) -> dict[Budget, Sample]: ...


#: The default most replicates per document at one budget
#: (:data:`kvdrift.limits.DEFAULT_SEARCH_REPLICATES`).
MAX_REPLICATES = limits.DEFAULT_SEARCH_REPLICATES


@dataclass(frozen=True)
class SearchSettings:
    """How sure and how thorough: level ``1 - alpha`` over the whole search; each look runs
    up to ``replicates`` more per document at the budgets still undecided near the head of
    each family's sequence (at most ``window`` of them; with ``sized_looks``, fewer where the
    values so far say a decision is due sooner, :func:`look_size`), and a budget still
    undecided after ``max_replicates`` per document stops its family's sequence (a look is
    cut to that number: no budget's bound ever uses more)."""

    alpha: float = 0.05
    replicates: int = 8
    max_replicates: int = MAX_REPLICATES
    window: int = 3
    exhaustive: bool = False  # every budget until decided (the full grid, for comparison)
    sized_looks: bool = True  # later looks sized to where the decision is due
    bet: Bet = BET  # how the confidence sequences stake (betting.py)

    def __post_init__(self) -> None:
        checks.number(self.alpha, "alpha", 0, 1, open_lo=True, open_hi=True)
        limits.search_replicates(self.replicates, self.max_replicates)
        checks.integer(self.window, "window", 1)


@dataclass(frozen=True)
class Judgement:
    """A budget's own test after the rounds so far: its estimate, its bounds (each at its
    level) and its own outcome, ``"within"``, ``"beyond"`` or ``"undecided"``."""

    estimate: float
    lo: float
    hi: float
    outcome: str
    rounds: int  # complete rounds: values per document that the bounds use
    decided_at: int | None  # the round at which the outcome was reached
    more_rounds: float = math.nan  # undecided: rounds its values suggest it still needs


def judge(samples: Sequence[Sample], measure: Measure, scheme: Scheme, bet: Bet = BET,
          bounds: bool = False) -> Judgement:
    """The budget's outcome from all its looks (see the module docstring), and with
    ``bounds`` its bounds and, if undecided, the rounds its values suggest it still needs
    (the search needs only the outcome; the bounds are computed once, for the result)."""
    values = rounds_of([s.values for s in samples])
    rounds = values.shape[0]
    if not measure.certifiable:  # estimates only: one look decides, by the point estimate
        means = [np.nanmean(np.concatenate([s.values[d] for s in samples]))
                 for d in sorted(samples[0].values)]
        estimate = float(np.mean(means)) if means else math.nan
        outcome = "within" if measure.meets(estimate) else "beyond"
        return Judgement(estimate, math.nan, math.nan, outcome, rounds, 1)
    low, high = measure.range
    if rounds == 0:
        return Judgement(math.nan, low, high, "undecided", 0, None, math.nan)
    tol = measure.tolerance
    upper = measure.op == "<="  # the certifying side is the upper bound for a risk
    certify, fail = scheme.certify_level, scheme.fail_level
    within = int(first_round_beyond(values, tol, certify, tol, low, high, upper, bet)) or None
    beyond = int(first_round_beyond(values, tol, fail, tol, low, high, not upper, bet)) or None
    if within is not None and (beyond is None or within < beyond):
        outcome, at = "within", within
    elif beyond is not None:
        outcome, at = "beyond", beyond
    else:
        outcome, at = "undecided", None
    lo, hi, more = math.nan, math.nan, math.nan
    if bounds:
        hi = bound(values, certify if upper else fail, tol, low, high, True, bet)
        lo = bound(values, fail if upper else certify, tol, low, high, False, bet)
        # a decided side excludes tol itself: its bound is at tol or past it
        if (outcome, upper) in (("within", True), ("beyond", False)):
            hi = min(hi, tol)
        if (outcome, upper) in (("within", False), ("beyond", True)):
            lo = max(lo, tol)
        if outcome == "undecided":
            more = rounds_suggested(values, certify, tol, low, high, upper, bet)
    return Judgement(float(values.mean()), float(lo), float(hi), outcome, rounds, at, more)


def look_size(values: np.ndarray, measure: Measure, scheme: Scheme, most: int,
              bet: Bet = BET) -> int:
    """Replicates per document for the next look at an undecided budget whose rounds so far
    are ``values`` (``[rounds, documents]``): the fewest more rounds that either side's values
    suggest it needs (:func:`~kvdrift.frontier_search.betting.rounds_suggested`), rounded up,
    from 1 to ``most``; ``most`` when there are no rounds yet or no side suggests a number.

    The bound holds at every round, so a look may be any size and its size may depend on
    every value seen before it. A look past the decision costs the values after it (with
    looks of 8, a decision due at round 18 is seen at round 24); a look short of it costs one
    more look, a model call with a smaller batch."""
    if not measure.certifiable or values.shape[0] == 0:
        return most
    low, high = measure.range
    tol, upper = measure.tolerance, measure.op == "<="
    sides = (rounds_suggested(values, scheme.certify_level, tol, low, high, upper, bet),
             rounds_suggested(values, scheme.fail_level, tol, low, high, not upper, bet))
    finite = [r for r in sides if math.isfinite(r)]
    if not finite:
        return most
    return int(min(most, max(1, math.ceil(min(finite)))))


def to_next_multiple(drawn: int, most: int) -> int:
    """Replicates from ``drawn`` to the next multiple of ``most`` (``most`` at a multiple).

    A sized look never runs past a multiple of ``--replicates``: every such multiple ends a
    look, so a budget decided at round ``t`` has drawn no more than looks of ``most`` would
    have, ``most * ceil(t / most)`` (a first look of 3 then one of 8 passed round 8, and a
    decision due there was seen at round 11). These stops do not move the sized plan's own
    (``_Tried.planned``): every round at which sized looks alone would stop still ends a
    look, so a budget never draws more than either plan alone would."""
    return most - drawn % most


@dataclass
class _Tried:
    budget: Budget
    samples: list[Sample] = field(default_factory=list)
    judgement: Judgement | None = None
    planned: int = 0  # the round at which the sized plan's next look ends

    @property
    def outcome(self) -> str:
        return "untried" if self.judgement is None else self.judgement.outcome

    @property
    def drawn(self) -> int:
        """Replicates drawn per document (before any value was left out)."""
        return sum(max((len(v) for v in s.values.values()), default=0) for s in self.samples)


class _FamilySearch:
    def __init__(self, family: Family, measure: Measure, settings: SearchSettings,
                 scheme: Scheme) -> None:
        self.family, self.measure, self.settings, self.scheme = family, measure, settings, scheme
        self.tried = [_Tried(b) for b in family.budgets]

    def record(self, index: int, sample: Sample) -> None:
        t = self.tried[index]
        if self.measure.certifiable:
            self.measure.check_sample(sample.values, f"{self.family.name} {t.budget.label}")
            left = self.settings.max_replicates - t.drawn  # a look is cut at the cap
            sample = replace(sample, values={d: v[:left] for d, v in sample.values.items()})
        t.samples.append(sample)
        t.judgement = judge(t.samples, self.measure, self.scheme, self.settings.bet)
        if self.settings.sized_looks and t.outcome == "undecided" and t.drawn >= t.planned:
            t.planned = t.drawn + look_size(rounds_of([s.values for s in t.samples]),
                                            self.measure, self.scheme,
                                            self.settings.replicates, self.settings.bet)

    def size(self, index: int, documents: int | None) -> int:
        """Replicates per document the next look at budget ``index`` should run; its first
        look, with ``documents`` known, no longer than the fewest rounds after which any
        values could certify it (:func:`~kvdrift.frontier_search.feasibility.fewest_replicates`:
        with looks of 8, twenty documents that could be certified after 3 rounds drew 8)."""
        t, most = self.tried[index], self.settings.replicates
        if self.settings.sized_looks and t.samples:  # the sized plan's next stop, or sooner
            most = min(max(1, t.planned - t.drawn), to_next_multiple(t.drawn, most))
        elif self.settings.sized_looks and documents:
            fewest = fewest_replicates(self.measure, documents, self.settings.alpha,
                                       self.scheme.families, self.settings.bet)
            most = min(most, fewest or most)
        return max(1, min(most, self.settings.max_replicates - t.drawn))

    def _open(self, t: _Tried) -> bool:
        """Whether another look at ``t`` could still decide it."""
        return t.outcome in ("untried", "undecided") and t.drawn < self.settings.max_replicates

    def requests(self) -> list[int]:
        """Budget indices to run at the next look; empty when the family's answer is settled.

        Down the sequence from the most cache: budgets already within are passed, the first
        one beyond (or undecided with no replicates left) ends it; of the rest, the first few
        still open are run together: one at first, one more per budget already within, at
        most ``window`` (a budget run ahead of the sequence is wasted if one before it
        fails, which is likelier the sooner it comes)."""
        if self.settings.exhaustive:
            return [t.budget.index for t in self.tried if self._open(t)]
        within = sum(t.outcome == "within" for t in self.tried)
        width = min(self.settings.window, 1 + within)
        out = []
        for t in self.tried:
            if t.outcome == "within":
                continue
            if not self._open(t) or len(out) == width:
                break
            out.append(t.budget.index)
        return out

    def result(self) -> FamilyResult:
        rows, intact = [], True
        for t in self.tried:
            if t.judgement is None:
                intact = False
                continue
            j = judge(t.samples, self.measure, self.scheme, self.settings.bet, bounds=True)
            intact = intact and j.outcome == "within"
            rows.append(BudgetResult(
                family=self.family.name, label=t.budget.label, action=t.budget.action,
                index=t.budget.index, kv_fraction=_kv_fraction(t.samples),
                estimate=j.estimate, lo=j.lo, hi=j.hi,
                status=_status(j.outcome, intact, self.measure.certifiable),
                rounds=j.rounds, decided_at=j.decided_at, looks=len(t.samples),
                replicates=t.drawn, calls=sum(s.calls for s in t.samples),
                more_replicates=_more(j.more_rounds)))
        certified = [r for r in rows if r.status == "certified"]
        return FamilyResult(self.family.name, tuple(rows),
                            certified[-1] if certified else None)


def _more(rounds: float) -> float | None:
    """Replicates per document an undecided budget's values suggest it still needs (inf: no
    number suffices at its current estimate); None for a decided budget."""
    if math.isnan(rounds):
        return None
    return math.inf if math.isinf(rounds) else float(math.ceil(rounds))


def _kv_fraction(samples: Sequence[Sample]) -> float:
    values = [s.kv_fraction for s in samples if math.isfinite(s.kv_fraction)]
    return float(np.mean(values)) if values else math.nan


def _status(outcome: str, intact: bool, certifiable: bool) -> str:
    """A budget's label: its own outcome, and for "within", whether the sequence reached it."""
    if not certifiable:
        return "estimate within" if outcome == "within" else "estimate beyond"
    if outcome == "within":
        return "certified" if intact else "blocked"
    return {"beyond": "fails", "undecided": "undecided"}[outcome]


def frontier_search(families: Sequence[Family], measure: Measure, evaluator: Evaluator,
                    settings: SearchSettings = SearchSettings(), documents: int | None = None
                    ) -> FrontierResult:
    """Search every family's budget axis for the least cache within the measure's tolerance
    (``documents``: how many give values, if known before the first look, which sizes it)."""
    check_family_names([f.name for f in families])
    scheme = Scheme(settings.alpha, len(families), sum(len(f.budgets) for f in families))
    searches = [_FamilySearch(f, measure, settings, scheme) for f in families]
    look = 0
    while True:
        wanted = [(s, i) for s in searches for i in s.requests()]
        if not wanted:
            break
        look += 1
        size = max(s.size(i, documents) for s, i in wanted)  # one look: one size for all
        samples = evaluator.evaluate([s.family.budgets[i] for s, i in wanted], look, size)
        for s, i in wanted:
            sample = samples[s.family.budgets[i]]
            documents = len(sample.values)
            s.record(i, sample)
    results = tuple(s.result() for s in searches)
    rows = [r for f in results for r in f.budgets]
    drawn, calls = sum(r.replicates for r in rows), sum(r.calls for r in rows)
    full = calls / max(1, drawn) * scheme.budgets * settings.max_replicates
    return FrontierResult.assemble(
        measure=measure, alpha=settings.alpha, scheme=scheme, documents=documents or 0,
        families=results, calls=calls, full_grid_calls=int(round(full)), looks=look)
