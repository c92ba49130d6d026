"""The two clocks (the paper's Table 2): the generation clock beside the branch clock.

The *branch clock* is ``B(a)`` (:mod:`kvdrift.analysis.lags`): time counted from each
trajectory's first divergence. The *generation clock* counts generated positions: per
position block ``J`` the gap ``g_J = mean_{t in J} (E[delta_t](a) - E[delta_t](b))`` between
two actions (the contrast ``a - b``), over the paper's blocks ``1..H/4``, ``H/4+1..H/2``
and ``H/2+1..H`` (1:32, 33:64, 65:128 at H = 128), and ``Delta g = g_last - g_first``:
whether the gap between the actions grows along the generated text. Both come with pointwise
percentile intervals from the paired document bootstrap, pooled over strata and within each
stratum.
"""

from __future__ import annotations

import numpy as np

from kvdrift.analysis.endpoints import action_pairs
from kvdrift.analysis.quantities import block_gap, interval, intervals
from kvdrift.analysis.results import TwoClocks


def clock_blocks(horizon: int) -> list[tuple[int, int]] | None:
    """``[(1, H/4), (H/4 + 1, H/2), (H/2 + 1, H)]`` (floors); None when ``H < 4``."""
    if horizon < 4:
        return None
    q, h = horizon // 4, horizon // 2
    return [(1, q), (q + 1, h), (h + 1, horizon)]


def two_clock_entries(
    model: str, stratum: str, point: dict[str, dict], draws: dict[str, dict], alpha: float,
    horizon: int,
) -> list[TwoClocks]:
    """One entry per contrast ``a - b`` of ``point``'s actions
    (:func:`~kvdrift.analysis.endpoints.action_pairs`; ``point``: the actions' derived dicts,
    ``draws`` the same on paired bootstrap draws); ``B_a`` and ``B_b`` are the branch clocks
    of ``a`` and ``b``. Empty without ``E[delta_t]`` curves."""
    blocks = clock_blocks(horizon)
    if blocks is None or not all("expected_delta" in p for p in point.values()):
        return []
    out = []
    for a, b in action_pairs(list(point)):
        g = block_gap(point[a], point[b], blocks)  # [3]
        g_draws = block_gap(draws[a], draws[b], blocks)  # [B, 3]
        out.append(TwoClocks(
            model, stratum, a, b, tuple(blocks), intervals(g, g_draws, alpha),
            interval(g[-1] - g[0], g_draws[:, -1] - g_draws[:, 0], alpha),
            interval(np.asarray(point[a]["B"]), np.asarray(draws[a]["B"]), alpha),
            interval(np.asarray(point[b]["B"]), np.asarray(draws[b]["B"]), alpha)))
    return out
