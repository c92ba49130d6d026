"""The frontier decides: at the defaults, whole searches certify a budget whose true mean is half
the tolerance in at least 90% of searches (and one at 0.7 of it in at least half, slow).

Whole searches through kvdrift's own search and bound on synthetic values shaped like R_tv
(mostly small, rare large ones): six documents, ``R_tv <= 0.1``, alpha 0.05, the families
snapkv, recent and kivi, looks of 8, the default cap. Each family's first four budgets sit at
the good mean, the rest far above the tolerance. The seeds are fixed; the thresholds are
binomial tails (stated per test) so that a search whose power meets the requirement fails the
test rarely, and the bet and cap before issue 44 are shown to fail it.
"""

from __future__ import annotations

import pytest
from frontier_worlds import SyntheticCase, SyntheticEvaluator, TodaysBet, rare_large

from kvdrift.frontier_search.betting import BET, Bet
from kvdrift.frontier_search.families import parse_family
from kvdrift.frontier_search.measure import parse_measure
from kvdrift.frontier_search.search import MAX_REPLICATES, SearchSettings, frontier_search

TOL, FAMILIES = 0.1, ("snapkv", "recent", "kivi")


def certified(share: float, searches: int, bet: Bet = BET, cap: int = MAX_REPLICATES,
              seed: int = 44) -> int:
    """Searches (of ``searches``) that certify a budget whose true mean is ``share * TOL``;
    every certified budget is checked to be a good one."""
    families = {name: parse_family(name) for name in FAMILIES}
    curves = {n: [share * TOL] * 4 + [0.4] * 11 for n in FAMILIES}
    case = SyntheticCase("rare large", rare_large, share * TOL)
    found = 0
    for s in range(searches):
        ev = SyntheticEvaluator(families, curves, case, 8, seed * 1000 + s)
        r = frontier_search(list(families.values()), parse_measure(f"R_tv <= {TOL}"), ev,
                            SearchSettings(max_replicates=cap, bet=bet))
        assert all(curves[b.family][b.index] < TOL for f in r.families for b in f.budgets
                   if b.status == "certified")
        found += r.best is not None
    return found


def test_half_the_tolerance_is_certified_in_at_least_90_percent_of_searches():
    """40 searches; at least 33 must certify. If the true share were exactly 90%, fewer than
    33 would happen with probability 4.2% (the false-alarm rate at the requirement's edge);
    the share measured is 1,000 of 1,000 (benchmarks/frontier_power.py): at 99%, a false alarm
    would have probability about 1e-9. Today's bet at today's cap of 32 certifies about half."""
    assert certified(0.5, 40) >= 33
    assert certified(0.5, 40, TodaysBet(), 32) < 33


@pytest.mark.slow
def test_seven_tenths_of_the_tolerance_is_certified_in_at_least_half_the_searches():
    """60 searches; at least 24 must certify. If the true share were exactly 50%, fewer than
    24 would happen with probability 4.6%; the share measured is 69.6% [66.7%, 72.4%] over
    1,000 searches (benchmarks/frontier_power.py)."""
    assert certified(0.7, 60) >= 24
