"""Position figures at long horizons (report/figures.py): the generation clock averaged over
bins of positions, the timing curve on a log axis, each decoding-time compression drawn."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kvdrift.analysis.results import ActionResult  # noqa: E402
from kvdrift.report.figures import (  # noqa: E402
    MAX_DRAWN_COMPRESSIONS,
    CurveArrays,
    binned,
    mark_compressions,
)


def curve(n: int) -> CurveArrays:
    x = np.arange(1, n + 1, dtype=float)
    est = (x % 7) / 7
    est[3] = math.nan  # a position not measured is left out of its bin's mean
    return CurveArrays(x, est, est - 0.1, est + 0.1)


def test_binned_means_over_consecutive_positions():
    c = curve(4096)
    out, width = binned(c, bins=128)
    assert width == 32 and out.x.size == 128
    assert out.x[0] == np.mean(np.arange(1, 33)) and out.x[-1] == np.mean(np.arange(4065, 4097))
    first = np.delete(c.estimate[:32], 3)
    assert out.estimate[0] == pytest.approx(np.mean(first), rel=1e-12)
    assert out.lo[0] == pytest.approx(np.mean(np.delete(c.lo[:32], 3)), rel=1e-12)
    assert out.estimate[5] == pytest.approx(np.mean(c.estimate[160:192]), rel=1e-12)
    # a horizon that does not divide: the last bin is shorter
    odd, width = binned(curve(1000), bins=128)
    assert width == 8 and odd.x.size == 125 and odd.x[-1] == np.mean(np.arange(993, 1001))


def test_short_curves_are_not_binned():
    c = curve(100)
    out, width = binned(c, bins=128)
    assert width == 1 and out is c


def test_compressions_are_drawn_up_to_a_cap():
    fig, ax = plt.subplots()
    few = ActionResult("m", "decoding-knorm", 1, {}, compressions=(66, 130, 194))
    assert mark_compressions(ax, few, "C0")
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [66, 130, 194]
    many = ActionResult("m", "decoding-knorm:target=1", 1, {},
                        compressions=tuple(range(3, 4097)))
    assert mark_compressions(ax, many, "C1")
    assert len(ax.get_lines()) == 3 + MAX_DRAWN_COMPRESSIONS
    assert not mark_compressions(ax, ActionResult("m", "snapkv", 1, {}), "C2")
    plt.close(fig)
