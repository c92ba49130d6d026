"""Issue 50: both sides decide at least as fast as the better of the two bets before, and looks
are sized to where the decision is due (the bound holds at every round, so a look may be any
size). Simulations run kvdrift's own bet on fixed seeds; thresholds are stated per test."""

from __future__ import annotations

import numpy as np
import pytest
from frontier_worlds import (
    Issue44Bet,
    SyntheticCase,
    SyntheticEvaluator,
    TodaysBet,
    rare_large,
    zero_one,
)

from kvdrift.frontier_search.betting import BET, first_round_beyond
from kvdrift.frontier_search.families import parse_family
from kvdrift.frontier_search.feasibility import fewest_replicates
from kvdrift.frontier_search.measure import parse_measure
from kvdrift.frontier_search.result import Scheme
from kvdrift.frontier_search.search import Sample, SearchSettings, frontier_search, look_size

TOL, CAP = 0.1, 128
FAIL_LEVEL = 0.05 / 33  # three families of 15, 15 and 3 budgets
R_TV = parse_measure(f"R_tv <= {TOL}")


def fails_rounds(law, mean: float, documents: int, bet, sims: int = 300) -> np.ndarray:
    """Per simulation, the round at which the fails side decided, the cap if it did not."""
    rng = np.random.default_rng(50)
    shape = (sims, CAP, documents)
    values = law(rng.random(shape), rng.random(shape), mean)
    first = first_round_beyond(values, TOL, FAIL_LEVEL, TOL, 0.0, 1.0, upper=False, bet=bet)
    return np.where(first > 0, first, CAP)


def test_the_fails_side_decides_as_often_as_before_issue_44():
    """{0,1} values of mean 0.15, six documents, 300 simulations: the share that says "fails"
    within 128 rounds is about 0.7 with this bet and the one before issue 44, about 0.1 with
    issue 44's (whose prior sat at mean 0.55). If this bet's share were 0.6, fewer than 165
    of 300 would happen with probability about 4% (binomial); if issue 44's were 0.3, 90 or
    more would happen with probability about 50%, so its measured 0.1 is far below."""
    now = fails_rounds(zero_one, 0.15, 6, BET)
    assert np.sum(now < CAP) >= 165
    assert np.sum(fails_rounds(zero_one, 0.15, 6, Issue44Bet()) < CAP) < 90


@pytest.mark.parametrize(("law", "mean", "documents"), [
    (zero_one, 0.15, 6), (zero_one, 0.2, 6), (zero_one, 0.2, 1), (rare_large, 0.15, 6),
    (rare_large, 0.15, 20), (rare_large, 0.2, 6)])
def test_the_fails_side_is_as_fast_as_the_better_bet_before(law, mean, documents):
    """Above the tolerance (1.5x and 2x), 1 to 20 documents, the same values for every bet:
    this bet's mean rounds to "fails" (the cap when undecided) is within 5% of the better of
    the two bets before it (measured: within 1%, and never behind issue 44's). The values are
    shared, so the comparison's noise is far below 5%."""
    now = fails_rounds(law, mean, documents, BET).mean()
    before = min(fails_rounds(law, mean, documents, TodaysBet()).mean(),
                 fails_rounds(law, mean, documents, Issue44Bet()).mean())
    assert now <= 1.05 * before, (now, before)


def test_a_look_is_sized_to_the_rounds_still_needed():
    """No rounds yet: a full look. Values far inside the tolerance: the decision is due within
    the look, so the look is shorter than the most; every size lies in 1..most."""
    scheme = Scheme(0.05, 3, 33)
    assert look_size(np.zeros((0, 6)), R_TV, scheme, 8) == 8
    rng = np.random.default_rng(3)
    sizes = []
    for rounds in range(1, 12):
        values = rare_large(rng.random((rounds, 6)), rng.random((rounds, 6)), 0.03)
        size = look_size(values, R_TV, scheme, 8)
        assert 1 <= size <= 8
        sizes.append(size)
    assert min(sizes) < 8
    zeros = np.zeros((5, 6))  # 9 rounds of zeros certify: 4 more are needed, the best case
    assert look_size(zeros, R_TV, scheme, 8) <= 4


class _Zeros:
    """Every value 0; records the size of every look."""

    def __init__(self, documents: int) -> None:
        self.documents, self.sizes = documents, []

    def evaluate(self, budgets, look, replicates):
        self.sizes.append(replicates)
        return {b: Sample({f"d{i}": np.zeros(replicates) for i in range(self.documents)},
                          0.5, replicates) for b in budgets}


def test_the_first_look_is_no_longer_than_the_fewest_rounds_that_could_certify():
    """Twenty documents certify after 3 rounds at best: with the documents known, the first
    look runs 3 (looks of 8 drew 8 and certified at round 3); unknown, it runs 8."""
    fam = parse_family("kivi")
    assert fewest_replicates(R_TV, 20, 0.05, 1) == 3
    known = _Zeros(20)
    r = frontier_search([fam], R_TV, known, SearchSettings(), documents=20)
    first = r.families[0].budgets[0]
    assert known.sizes[0] == 3 and (first.status, first.replicates) == ("certified", 3)
    unknown = _Zeros(20)
    r = frontier_search([fam], R_TV, unknown, SearchSettings())
    assert unknown.sizes[0] == 8 and r.families[0].budgets[0].replicates == 8
    assert unknown.sizes[1:] == [3] * (len(unknown.sizes) - 1)  # later budgets: known by then


class _Recorder:
    """Wraps an evaluator; records every look's size per budget."""

    def __init__(self, inner) -> None:
        self.inner, self.sizes = inner, {}

    def evaluate(self, budgets, look, replicates):
        for b in budgets:
            self.sizes.setdefault(b, []).append(replicates)
        return self.inner.evaluate(budgets, look, replicates)


@pytest.mark.parametrize(("law", "mean"), [(zero_one, 0.2), (zero_one, 0.15), (zero_one, 0.05),
                                           (rare_large, 0.03)])
def test_sized_looks_never_draw_more_than_looks_of_the_most(law, mean):
    """Twenty documents (the first look is 3 rounds): every multiple of 8 below a budget's
    last round is the end of a look of its own, so a budget decided at round ``t`` drew at most
    ``8 ceil(t / 8)``, what looks of 8 draw (before, a look of 3 then one of 8 saw a decision
    due at round 8 at round 11: {0,1} values at 2x the tolerance, 160 values became 220). A
    deterministic property of every search: 10 searches per law, every budget checked."""
    fam = parse_family("kivi")
    case = SyntheticCase("cell", law, mean, documents=20)
    for seed in range(10):
        rec = _Recorder(SyntheticEvaluator({"kivi": fam}, {"kivi": [mean] * 3}, case, 8, seed))
        r = frontier_search([fam], R_TV, rec, SearchSettings(), documents=20)
        for row in r.families[0].budgets:
            sizes = rec.sizes[fam.budgets[row.index]]
            ends = set(np.cumsum(sizes).tolist())
            assert all(k in ends for k in range(8, row.replicates, 8)), sizes
            if row.decided_at:
                assert row.replicates <= 8 * -(-row.decided_at // 8), (row, sizes)
