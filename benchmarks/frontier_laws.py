"""The table of laws that the frontier's cost benchmarks run one budget's test on.

Per-replicate values of ``R_tv <= 0.1`` (tests/frontier_worlds.py): two rare-large laws,
{0,1}, Beta(1, 19), values near the tolerance, and values above it at 1.2x, 1.5x and 2x; alpha
0.05 over three families of 15 budgets (the certifying side at 0.05 / 3, the "fails" side at
0.05 / 33). ``frontier_cost.py`` measures the search on them and ``frontier_floor.py`` what any
valid test needs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from frontier_worlds import beta_1_19, near_rare_one, rare_large, rare_spread, zero_one  # noqa: E402

from kvdrift.frontier_search.result import Scheme  # noqa: E402

TOL = 0.1
SCHEME = Scheme(0.05, 3, 33)
LAWS = [  # name, law, mean
    ("rare-large 0.03", rare_large, 0.03),
    ("rare-spread 0.03", rare_spread, 0.03),
    ("{0,1} 0.05", zero_one, 0.05),
    ("Beta(1,19)", beta_1_19, 0.05),
    ("near, rare 1, 0.08", near_rare_one, 0.08),
    ("{0,1} 0.12 (1.2x)", zero_one, 0.12),
    ("{0,1} 0.15 (1.5x)", zero_one, 0.15),
    ("rare-large 0.15 (1.5x)", rare_large, 0.15),
    ("{0,1} 0.20 (2x)", zero_one, 0.20),
]
