"""How often the frontier decides: the share of whole searches that certify a good budget.

The defaults of ``kvdrift frontier``: six documents, ``R_tv <= 0.1``, alpha 0.05, the families
snapkv, recent and kivi, looks of up to 8 replicates per document, a cap of 128. Each family's
first budgets sit at a true mean of ``share x tolerance`` (per-replicate values mostly small
with rare large ones, the shape R_tv takes) and the rest far above the tolerance. Every search
runs through kvdrift's own search and bound (``frontier_search``, ``tests/frontier_worlds.py``);
a search *certifies* when it reports a best budget. Issue 44's search (its bet, looks of 8)
runs beside this one (its bet, looks sized to where the decision is due, the first look no
longer than the fewest rounds that could certify) on the same random streams (look ``L`` of
search ``s`` draws from the same seed under both). Each cell: the share with its 95% Wilson
interval, and in brackets the mean replicates per document drawn per search over all budgets
(+- its 95% half-width).

    python benchmarks/frontier_power.py [--searches 1000] [--rows this,issue44]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from frontier_worlds import (  # noqa: E402
    Issue44Bet,
    SyntheticCase,
    SyntheticEvaluator,
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
ROWS = {  # name -> (label, bet, sized looks)
    "this": ("this search (the default)", Bet(), True),
    "issue44": ("issue 44's search", Issue44Bet(), False),
}


def certified_share(share: float, bet: Bet, sized: bool, searches: int, seed: int = 0
                    ) -> tuple[int, np.ndarray]:
    """Searches that certify a budget at mean ``share x TOL``, and the replicates per
    document each search drew over all its budgets."""
    families = {name: parse_family(name) for name in FAMILIES}
    curves = {n: [share * TOL] * 4 + [0.4] * 11 for n in FAMILIES}
    case = SyntheticCase("rare large", rare_large, share * TOL, documents=DOCS)
    found, drawn = 0, []
    for s in range(searches):
        ev = SyntheticEvaluator(families, curves, case, REPLICATES, seed * 100003 + s)
        r = frontier_search(list(families.values()), parse_measure(f"R_tv <= {TOL}"), ev,
                            SearchSettings(alpha=ALPHA, replicates=REPLICATES,
                                           max_replicates=MAX_REPLICATES, bet=bet,
                                           sized_looks=sized), DOCS)
        found += r.best is not None
        drawn.append(sum(b.replicates for f in r.families for b in f.budgets))
    return found, np.array(drawn, dtype=float)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    mid, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", type=int, default=1000)
    parser.add_argument("--rows", default="this,issue44")
    parser.add_argument("--shares", default=",".join(str(s) for s in SHARES))
    args = parser.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    print(f"share of {args.searches} searches certifying a budget at mean share x {TOL} "
          f"(rare-large values, {DOCS} documents, alpha {ALPHA}, {', '.join(FAMILIES)}, "
          f"cap {MAX_REPLICATES}); [95% interval]; in brackets: replicates per document "
          "drawn per search, all budgets")
    print("| share of the tolerance | " + " | ".join(f"{s:.1f}" for s in shares) + " |")
    for key in args.rows.split(","):
        name, bet, sized = ROWS[key]
        start = time.process_time()
        cells = []
        for share in shares:
            found, drawn = certified_share(share, bet, sized, args.searches)
            lo, hi = wilson(found, args.searches)
            half = 1.96 * drawn.std(ddof=1) / math.sqrt(len(drawn))
            cells.append(f"{found / args.searches:.1%} [{lo:.1%}, {hi:.1%}] "
                         f"({drawn.mean():.0f} +- {half:.0f})")
            print(f"  {name}, share {share}: {cells[-1]}", flush=True)
        print(f"| {name} | " + " | ".join(cells) + f" |   ({time.process_time() - start:.0f}"
              " CPU s)", flush=True)


if __name__ == "__main__":
    main()
