"""How often the frontier decides: the share of whole searches that certify a good budget.

The defaults of ``kvdrift frontier``: six documents, ``R_tv <= 0.1``, alpha 0.05, the families
snapkv, recent and kivi, looks of 8 replicates per document. Each family's first budgets sit at
a true mean of ``share x tolerance`` (per-replicate values mostly small with rare large ones,
the shape R_tv takes) and the rest far above the tolerance. Every search runs through kvdrift's
own search and bound (``frontier_search``, ``tests/frontier_worlds.py``); a search *certifies*
when it reports a best budget. Today's bet (issue 38: the growth-rate plug-in with one
pseudo-value at the middle of the range, stakes up to 0.9 / (high - low), first stake 0) runs
beside the new one on the same random streams (look ``L`` of search ``s`` draws the same
uniforms under both), at today's cap (32) and the new default.

    python benchmarks/frontier_power.py [--searches 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from frontier_worlds import (  # noqa: E402
    SyntheticCase,
    SyntheticEvaluator,
    TodaysBet,
    rare_large,
)

from kvdrift.frontier_search.betting import Bet  # noqa: E402
from kvdrift.frontier_search.families import parse_family  # noqa: E402
from kvdrift.frontier_search.measure import parse_measure  # noqa: E402
from kvdrift.frontier_search.search import (  # noqa: E402
    MAX_REPLICATES,
    SearchSettings,
    frontier_search,
)

TOL, ALPHA, DOCS, REPLICATES = 0.1, 0.05, 6, 8
FAMILIES = ("snapkv", "recent", "kivi")
SHARES = (0.3, 0.4, 0.5, 0.6, 0.7)


def certified_share(share: float, bet: Bet, cap: int, searches: int, seed: int = 0
                    ) -> tuple[float, float]:
    """Share of searches that certify a budget at mean ``share x TOL``, and the mean
    replicates per document drawn over all budgets of a search."""
    families = {name: parse_family(name) for name in FAMILIES}
    curves = {n: [share * TOL] * 4 + [0.4] * 11 for n in FAMILIES}
    case = SyntheticCase("rare large", rare_large, share * TOL, documents=DOCS)
    found, drawn = 0, 0
    for s in range(searches):
        ev = SyntheticEvaluator(families, curves, case, REPLICATES, seed * 100003 + s)
        r = frontier_search(list(families.values()), parse_measure(f"R_tv <= {TOL}"), ev,
                            SearchSettings(alpha=ALPHA, replicates=REPLICATES,
                                           max_replicates=cap, bet=bet))
        found += r.best is not None
        drawn += sum(b.replicates for f in r.families for b in f.budgets)
    return found / searches, drawn / searches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", type=int, default=200)
    args = parser.parse_args()
    rows = [("today's bet, cap 32", TodaysBet(), 32),
            (f"today's bet, cap {MAX_REPLICATES}", TodaysBet(), MAX_REPLICATES),
            ("new bet, cap 32", Bet(), 32),
            (f"new bet, cap {MAX_REPLICATES} (new default)", Bet(), MAX_REPLICATES)]
    print(f"share of {args.searches} searches certifying a budget at mean share x {TOL} "
          f"(rare-large values, {DOCS} documents, alpha {ALPHA}, {', '.join(FAMILIES)}); "
          "in brackets: replicates per document drawn per search, all budgets")
    print(f"{'':36s}" + "".join(f"{s:>14.1f}" for s in SHARES))
    for name, bet, cap in rows:
        start = time.perf_counter()
        cells = [certified_share(s, bet, cap, args.searches) for s in SHARES]
        print(f"{name:36s}" + "".join(f"{p:>7.0%} [{d:4.0f}]" for p, d in cells)
              + f"   ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
