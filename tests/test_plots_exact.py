"""The finite-state figure plots the study's numbers (read back from the matplotlib artists)."""

import numpy as np
import pytest

import kvdrift.report.figures as plots
from kvdrift.finite.check import run_finite_study


def test_finite_state_figure_plots_the_results(tmp_path, monkeypatch):
    captured = []
    monkeypatch.setattr(plots.plt, "close", captured.append)
    result = run_finite_study(systems=4, replicates=32, seed=1)
    path = plots.plot_finite_study(result, tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = captured
    left, right = fig.axes
    heights = [bar.get_height() for bar in right.patches]
    np.testing.assert_allclose(heights, np.sort(result.var_ratios))
    (median_line,) = [ln for ln in right.get_lines() if ln.get_label().startswith("median")]
    assert median_line.get_ydata()[0] == pytest.approx(result.median_var_ratio)
    exact = [s.exact for s in result.systems]
    # Each errorbar's data line has one point per system: x = exact risk, y = a mean.
    ys = [tuple(ln.get_ydata()) for ln in left.get_lines() if len(ln.get_xdata()) == 4]
    assert tuple(s.naive_mean for s in result.systems) in ys
    assert tuple(s.swrb_mean for s in result.systems) in ys
    xs = [tuple(ln.get_xdata()) for ln in left.get_lines() if len(ln.get_xdata()) == 4]
    assert all(x == tuple(exact) for x in xs)
    # The first errorbar (naive) spans mean +- 2 SE.
    segs = left.containers[0].lines[2][0].get_segments()
    np.testing.assert_allclose([s[1][1] - s[0][1] for s in segs],
                               [4 * s.naive_se for s in result.systems])
    assert f"{result.cost_ratio:.2f}" in right.get_title()
