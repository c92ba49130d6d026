"""What a certificate costs: replicates per certified budget on synthetic values.

The case of issue 38: per-replicate values mostly small with rare large ones (mean 0.03), six
documents, tolerance 0.1, alpha = 0.05, three families whose first four budgets sit at 0.03 and
the rest far above the tolerance. Every search runs through kvdrift's own search and bound
(``frontier_search``), on the synthetic evaluator of the tests. Prints, per certified budget,
the values its bound used when it was decided and the values drawn (a look's leftovers
included), for looks of 1 replicate per document (the bound checked after every round) and of
8 (the CLI's default), beside what a fixed-sample Hoeffding bound would need at the same level.

    python benchmarks/frontier_bounds.py [--searches 40]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from frontier_worlds import SyntheticCase, SyntheticEvaluator, rare_large  # noqa: E402

from kvdrift.frontier_search.families import parse_family  # noqa: E402
from kvdrift.frontier_search.measure import parse_measure  # noqa: E402
from kvdrift.frontier_search.search import SearchSettings, frontier_search  # noqa: E402

TOL, ALPHA, MEAN, DOCS = 0.1, 0.05, 0.03, 6
FAMILIES = ("snapkv", "recent", "pyramidkv")


def certified_costs(searches: int, replicates: int) -> tuple[list[int], list[int], int]:
    """Values used at the decision and values drawn, per certified budget; and the number of
    certified budgets whose true mean breaks the tolerance (none should)."""
    curve = [MEAN] * 4 + [0.4] * 11
    families = {name: parse_family(name) for name in FAMILIES}
    case = SyntheticCase("rare large", rare_large, MEAN, documents=DOCS)
    used, drawn, wrong = [], [], 0
    for seed in range(searches):
        ev = SyntheticEvaluator(families, {n: curve for n in FAMILIES}, case, replicates, seed)
        r = frontier_search(list(families.values()), parse_measure(f"R_tv <= {TOL}"), ev,
                            SearchSettings(alpha=ALPHA, replicates=replicates,
                                           max_replicates=256))
        for f in r.families:
            for b in f.budgets:
                if b.status == "certified":
                    used.append(b.decided_at * DOCS)
                    drawn.append(b.replicates * DOCS)
                    wrong += curve[b.index] > TOL
    return used, drawn, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", type=int, default=40)
    args = parser.parse_args()
    level = ALPHA / len(FAMILIES)
    hoeffding = math.ceil(math.log(1 / level) / (2 * (TOL - MEAN) ** 2))
    print(f"rare-large values, mean {MEAN}, {DOCS} documents, R_tv <= {TOL}, alpha {ALPHA}, "
          f"{len(FAMILIES)} families, {args.searches} searches")
    for replicates in (1, 8):
        used, drawn, wrong = certified_costs(args.searches, replicates)
        print(f"looks of {replicates} replicate(s) per document: {len(used)} certified "
              f"budgets ({wrong} breaking the tolerance); replicates per certified budget: "
              f"median {np.median(used):.0f} used at the decision (90th percentile "
              f"{np.percentile(used, 90):.0f}), median {np.median(drawn):.0f} drawn")
    print(f"a fixed-sample Hoeffding bound at the same level ({level:.3g}) needs {hoeffding}; "
          "the pooled t-interval this replaced used 48-96 and was not valid")


if __name__ == "__main__":
    main()
