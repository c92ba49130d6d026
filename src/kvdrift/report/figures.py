"""kvdrift's figures (matplotlib, Agg backend): each function draws one figure to a PNG.

The study report's figures (:data:`FIGURES`, drawn by :mod:`kvdrift.report.html`) and the
finite-state check's (:func:`plot_finite_study`, drawn by ``kvdrift finite-state``).

Every study figure returns None, and writes nothing, when the analysis lacks what it needs (a study
run with the SWRB estimator has only ``timing_cdf`` curves). Fractions are drawn in percent,
differences of fractions in percentage points. One panel per model; an action keeps its colour
across panels and figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import matplotlib
import numpy as np

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.patches import Patch  # noqa: E402

from kvdrift import output  # noqa: E402
from kvdrift.analysis.interval import Interval  # noqa: E402
from kvdrift.analysis.results import ActionResult, StudyAnalysis  # noqa: E402

if TYPE_CHECKING:
    from kvdrift.finite.check import FiniteStudyResult

T = TypeVar("T")

DPI = 130
BAND_ALPHA = 0.18


@dataclass(frozen=True)
class CurveArrays:
    """A curve as float arrays (NaN where the analysis had None/NaN)."""

    x: np.ndarray
    estimate: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


def curve_arrays(action: ActionResult, name: str) -> CurveArrays | None:
    """``action.curves[name]`` as arrays, or None when absent or without a finite estimate."""
    curve = action.curves.get(name)
    if curve is None or len(curve.x) == 0:
        return None
    arrays = CurveArrays(*(np.asarray(v, dtype=np.float64)
                           for v in (curve.x, curve.estimate, curve.lo, curve.hi)))
    if not np.isfinite(arrays.estimate).any():
        return None
    return arrays


def action_colors(analysis: StudyAnalysis) -> dict[str, str]:
    """One colour per action name, in order of first appearance."""
    palette = plt.get_cmap("tab10").colors
    names = list(dict.fromkeys(a.action for a in analysis.actions))
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def by_model(rows: Sequence[T]) -> dict[str, list[T]]:
    """Rows (anything with a ``model``) grouped by model, in order of first appearance."""
    groups: dict[str, list[T]] = {}
    for row in rows:
        groups.setdefault(row.model, []).append(row)
    return groups


def _ends(interval: Interval | None) -> tuple[float, float, float]:
    """``(estimate, lo, hi)``; all NaN for an interval the analysis does not have."""
    if interval is None:
        return math.nan, math.nan, math.nan
    return interval.estimate, interval.lo, interval.hi


def _panels(n: int, width: float = 6.2, height: float = 4.4):
    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


#: Above this horizon the position figures stay readable: the timing curve on a log axis of
#: positions, the generation clock averaged over :data:`POSITION_BINS` bins of positions.
LONG_HORIZON = 512
POSITION_BINS = 128
#: At most this many compressions are drawn per action (dotted lines); more are too dense.
MAX_DRAWN_COMPRESSIONS = 64


def binned(c: CurveArrays, bins: int = POSITION_BINS) -> tuple[CurveArrays, int]:
    """``c`` averaged over consecutive bins of ``ceil(len / bins)`` positions (NaN left out),
    each bin at its mean position; and the bin width (1: unchanged)."""
    width = max(1, math.ceil(c.x.size / bins))
    if width == 1:
        return c, 1
    edges = range(0, c.x.size, width)

    def mean(v: np.ndarray) -> np.ndarray:
        out = []
        for i in edges:
            part = v[i:i + width]
            out.append(float(np.nanmean(part)) if np.isfinite(part).any() else math.nan)
        return np.asarray(out)

    return CurveArrays(*(mean(v) for v in (c.x, c.estimate, c.lo, c.hi))), width


def mark_compressions(ax, action: ActionResult, color) -> bool:
    """Dotted lines at the positions a decoding-time press's compressions first show in
    (at most :data:`MAX_DRAWN_COMPRESSIONS`); whether any was drawn."""
    drawn = action.compressions[:MAX_DRAWN_COMPRESSIONS]
    for t in drawn:
        ax.axvline(t, color=color, ls=":", lw=0.8, alpha=0.7)
    return bool(drawn)


def _compression_legend(ax) -> None:
    ax.plot([], [], color="0.4", ls=":", lw=0.8,
            label="✂ decoding-time compression (first position after it)")


def _band(ax, c: CurveArrays, color, scale: float = 100.0) -> None:
    finite = np.isfinite(c.lo) & np.isfinite(c.hi)
    if finite.any():
        ax.fill_between(c.x, c.lo * scale, c.hi * scale, where=finite, color=color,
                        alpha=BAND_ALPHA, linewidth=0)


def save_figure(fig, path: str | Path | output.FileIn, dpi: int = DPI) -> Path | output.FileIn:
    """Write ``fig`` as a PNG at the report's resolution to ``path`` (a file the user named,
    its folder made, or a file in a held folder; never through a link, only a regular file:
    :mod:`kvdrift.output`), then close it; returns where."""
    try:
        with output.writing_to(path) as handle:
            fig.savefig(handle, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return path if isinstance(path, output.FileIn) else Path(path)


def _curve_panels(analysis: StudyAnalysis,
                  name: str) -> dict[str, list[tuple[ActionResult, CurveArrays]]]:
    """Per model, the actions that have curve ``name``; models without any are left out."""
    panels: dict[str, list[tuple[ActionResult, CurveArrays]]] = {}
    for model, actions in by_model(analysis.actions).items():
        rows = [(a, c) for a in actions if (c := curve_arrays(a, name)) is not None]
        if rows:
            panels[model] = rows
    return panels


def _never_diverged(action: ActionResult, cdf: CurveArrays) -> str:
    """``"never diverged 38.9% [35.2, 42.4]"`` from P(tau <= H), or from the curve's last point."""
    est, lo, hi = _ends(action.scalars.get("p_diverge"))
    if not math.isfinite(est):
        finite = np.flatnonzero(np.isfinite(cdf.estimate))
        last = finite[-1]
        est, lo, hi = cdf.estimate[last], cdf.lo[last], cdf.hi[last]
    def percent(p: float) -> str:  # 1 - P(tau <= H); a bootstrap mean of ones can top 1
        return f"{min(max(100 * p, 0.0), 100.0):.1f}"

    text = f"never diverged {percent(1 - est)}%"
    if math.isfinite(lo) and math.isfinite(hi):
        text += f" [{percent(1 - hi)}, {percent(1 - lo)}]"
    return text


def plot_timing(analysis: StudyAnalysis, path: str | Path) -> Path | None:
    """Divergence timing P(tau <= t) per action, one panel per model, with bootstrap bands.

    The legend gives each action's never-diverged mass 1 - P(tau <= H) with its interval.
    Above :data:`LONG_HORIZON` positions the axis of positions is logarithmic; dotted lines
    mark each decoding-time compression.
    """
    panels = _curve_panels(analysis, "timing_cdf")
    if not panels:
        return None
    colors = action_colors(analysis)
    H = analysis.meta.horizon
    fig, axes = _panels(len(panels), height=5.2)
    for ax, (model, rows) in zip(axes, panels.items(), strict=True):
        cuts = False
        for action, c in rows:
            color = colors[action.action]
            _band(ax, c, color)
            ax.plot(c.x, c.estimate * 100, color=color, lw=1.8,
                    marker="o" if c.x.size <= 40 else None, ms=2.5,
                    label=f"{action.action} — {_never_diverged(action, c)}")
            cuts |= mark_compressions(ax, action, color)
        if cuts:
            _compression_legend(ax)
        ax.set_ylim(0, 100)
        if H > LONG_HORIZON:
            ax.set_xscale("log")
        ax.set_xlim(1, H)
        ax.set_xlabel("generated position t (steps" + (", log scale)" if H > LONG_HORIZON
                                                       else ")"))
        ax.set_ylabel("P(first divergence by step t), % of trajectories")
        ax.set_title(model)
        ax.grid(alpha=0.3)
        # below the axes: a curve may end anywhere, and no corner is reliably empty
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), frameon=False,
                  title="action — never-diverged mass 1 − P(τ ≤ H) [interval]",
                  title_fontsize=8)
    fig.suptitle("Divergence timing: P(τ ≤ t) with bootstrap bands")
    fig.tight_layout()
    return save_figure(fig, path)


#: The three terms of a contrast's decomposition: (key, legend label, colour).
CONTRAST_TERMS = (
    ("occurrence_term", "occurrence ΔO", "#8da0cb"),
    ("exposure_term", "exposure ΔE·C̄", "#fc8d62"),
    ("rate_term", "rate ΔC·Ē", "#66c2a5"),
)


def _yerr(est: float, lo: float, hi: float, scale: float) -> tuple[float, float]:
    """Non-negative error-bar lengths; zero when an end is missing."""
    below = (est - lo) * scale if math.isfinite(lo) else 0.0
    above = (hi - est) * scale if math.isfinite(hi) else 0.0
    return max(below, 0.0), max(above, 0.0)


def _share_text(share: Interval | None, label: str = "exposure share") -> str:
    """``"exposure share 86%\n[81, 94]"`` from a contrast's share interval (in percent)."""
    est, lo, hi = _ends(share)
    if not math.isfinite(est):
        return f"{label} —"
    text = f"{label} {100 * est:.0f}%"
    if math.isfinite(lo) and math.isfinite(hi):
        text += f"\n[{100 * lo:.0f}, {100 * hi:.0f}]"
    return text


def plot_contrasts(analysis: StudyAnalysis, path: str | Path) -> Path | None:
    """Per contrast (a minus b): occurrence, exposure and rate terms (pp) and the total dR.

    Bars are the three terms with their intervals; the black diamond is dR = sum of the terms;
    the tick label gives the exposure share.
    """
    contrasts = [c for c in analysis.contrasts if math.isfinite(_ends(c.terms.get("dR"))[0])]
    if not contrasts:
        return None
    groups = by_model(contrasts)
    widest = max(len(rows) for rows in groups.values())
    fig, axes = _panels(len(groups), width=max(5.0, 2.6 * widest + 1.5), height=4.8)
    width = 0.2
    offsets = (-0.3, -0.1, 0.1, 0.3)
    for ax, (model, rows) in zip(axes, groups.items(), strict=True):
        x = np.arange(len(rows))
        for (key, label, color), off in zip(CONTRAST_TERMS, offsets, strict=False):
            vals = [_ends(r.terms.get(key)) for r in rows]
            keep = [i for i, v in enumerate(vals) if math.isfinite(v[0])]  # no bar if missing
            est = np.array([vals[i][0] for i in keep]) * 100
            err = np.array([_yerr(*vals[i], scale=100) for i in keep]).reshape(-1, 2).T
            ax.bar(x[keep] + off, est, width, color=color, label=label,
                   yerr=err, capsize=3, error_kw={"lw": 1, "ecolor": "0.25"})
        vals = [_ends(r.terms.get("dR")) for r in rows]
        ax.errorbar(x + offsets[3], np.array([v[0] for v in vals]) * 100,
                    yerr=np.array([_yerr(*v, scale=100) for v in vals]).T, fmt="D", ms=7,
                    color="black", capsize=3, label="ΔR (total)")
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set_xticks(x, [f"{r.a} − {r.b}\n{_share_text(r.terms.get('exposure_share'))}"
                          for r in rows],
                      fontsize=8)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.set_ylabel("contribution to ΔR (pp of positions)")
        ax.set_title(model)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle("Contrast decomposition ΔR = ΔO + ΔE·C̄ + ΔC·Ē (a − b)")
    fig.tight_layout()
    return save_figure(fig, path)


def _b_text(action: ActionResult, key: str = "B") -> str:
    est = _ends(action.scalars.get(key))[0]
    return f", B = {100 * est:+.2f} pp" if math.isfinite(est) else ""


def plot_lag_profiles(analysis: StudyAnalysis, path: str | Path) -> Path | None:
    """Branch-aligned lag profile b_j = E[delta_{tau+j} | tau <= max_entry] per action.

    The early and late windows (inclusive ranges of j) are shaded; B(a) = mean(late) -
    mean(early). The strict pre-EOS variant, when present, is dashed.
    """
    panels = _curve_panels(analysis, "lag_profile")
    if not panels:
        return None
    colors = action_colors(analysis)
    lags = analysis.lags
    max_entry = lags.max_entry if lags is not None else "max entry"
    early, late = (lags.early, lags.late) if lags is not None else (None, None)
    fig, axes = _panels(len(panels), height=5.4)
    for ax, (model, rows) in zip(axes, panels.items(), strict=True):
        for window, name, shade in ((early, "early", "#4c72b0"), (late, "late", "#dd8452")):
            if window is not None:
                ax.axvspan(window[0] - 0.5, window[1] + 0.5, color=shade, alpha=0.08,
                           label=f"{name} window j = {window[0]:g}–{window[1]:g}")
        for action, c in rows:
            color = colors[action.action]
            _band(ax, c, color)
            ax.plot(c.x, c.estimate * 100, color=color, lw=1.8,
                    label=f"{action.action}{_b_text(action)}")
            strict = curve_arrays(action, "lag_profile_strict")
            if strict is not None:
                ax.plot(strict.x, strict.estimate * 100, color=color, lw=1.3, ls="--",
                        label=f"{action.action} strict pre-EOS{_b_text(action, 'B_strict')}")
        ax.set_xlabel("lag j after first divergence (steps)")
        ax.set_ylabel(rf"branch TV $E[\delta_{{\tau+j}} \mid \tau \leq {max_entry}]$, %")
        ax.set_title(model)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                  frameon=False)
    fig.suptitle("Branch-aligned lag profile after first divergence")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_expected_delta(analysis: StudyAnalysis, path: str | Path) -> Path | None:
    """The generation clock: E[delta_t] by generated position per action, with bands; above
    :data:`LONG_HORIZON` positions averaged over bins of positions; dotted lines mark each
    decoding-time compression."""
    panels = _curve_panels(analysis, "expected_delta")
    if not panels:
        return None
    colors = action_colors(analysis)
    H = analysis.meta.horizon
    fig, axes = _panels(len(panels))
    for ax, (model, rows) in zip(axes, panels.items(), strict=True):
        cuts, width = False, 1
        for action, c in rows:
            color = colors[action.action]
            if H > LONG_HORIZON:
                c, width = binned(c)
            _band(ax, c, color)
            ax.plot(c.x, c.estimate * 100, color=color, lw=1.8, label=action.action)
            cuts |= mark_compressions(ax, action, color)
        if cuts:
            _compression_legend(ax)
        ax.set_xlim(1, H)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("generated position t (steps" + (
            f"; mean over bins of {width} positions)" if width > 1 else ")"))
        ax.set_ylabel(r"$E[\delta_t]$ (branch-aligned TV), %")
        ax.set_title(model)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle("Generation clock: expected branch TV by position")
    fig.tight_layout()
    return save_figure(fig, path)


#: Colours of the four EOS categories (pre-EOS, first EOS, one absorbed, both absorbed).
EOS_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3")


def _stack(ax, x: float, values: Sequence[float], width: float) -> None:
    """One stacked bar: positive parts upward from 0, negative parts downward."""
    up = down = 0.0
    for r, v in enumerate(values):
        if not math.isfinite(v) or v == 0:
            continue
        bottom = up if v > 0 else down
        ax.bar(x, v, width, bottom=bottom, color=EOS_COLORS[r % len(EOS_COLORS)],
               edgecolor="white", linewidth=0.5)
        up, down = (up + v, down) if v > 0 else (up, down + v)


def plot_eos_split(analysis: StudyAnalysis, path: str | Path) -> Path | None:
    """R - F split by EOS category: stacked G_r per action, stacked Delta G_r per contrast.

    Black diamonds are the totals (R - F, or Delta(R - F)) with their bootstrap intervals; a
    contrast's tick label gives its EOS share.
    """
    actions = [a for a in analysis.actions if a.eos_split is not None and a.eos_split.R_minus_F]
    if not actions:
        return None
    contrasts = by_model(analysis.eos_contrasts)
    groups = by_model(actions)
    widest = max(len(rows) + len(contrasts.get(m, [])) for m, rows in groups.items())
    fig, axes = _panels(len(groups), width=max(5.5, 1.5 * widest + 2.0), height=5.0)
    categories = list(actions[0].eos_split.categories)
    for ax, (model, rows) in zip(axes, groups.items(), strict=True):
        bars: list[tuple[str, list[float], tuple[float, float, float]]] = []
        for a in rows:
            split = a.eos_split
            bars.append((a.action, list(split.R_minus_F), _ends(split.G_total)))
        n_actions = len(bars)
        for c in contrasts.get(model, []):
            share = _share_text(c.eos_share, "EOS share")
            bars.append((f"{c.a} − {c.b}\n{share}", [g.estimate for g in c.dG],
                         _ends(c.dR_minus_F)))
        for i, (_, values, _) in enumerate(bars):
            _stack(ax, i, [100 * v for v in values], 0.6)
        totals = [t for _, _, t in bars]
        ax.errorbar(np.arange(len(bars)), [100 * t[0] for t in totals],
                    yerr=np.array([_yerr(*t, scale=100) for t in totals]).T, fmt="D", ms=6,
                    color="black", capsize=3, label="total (R − F or Δ(R − F))")
        if n_actions < len(bars):
            ax.axvline(n_actions - 0.5, color="0.5", lw=0.8, ls="--")
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set_xticks(np.arange(len(bars)), [name for name, _, _ in bars], fontsize=8)
        ax.set_xlim(-0.6, len(bars) - 0.4)
        ax.set_ylabel("R − F by EOS category (pp of positions)")
        ax.set_title(f"{model}: actions | contrasts (a − b)" if n_actions < len(bars) else model)
        ax.grid(axis="y", alpha=0.3)
        handles = [Patch(color=EOS_COLORS[r % len(EOS_COLORS)], label=c)
                   for r, c in enumerate(categories)]
        ax.legend(handles=handles + ax.get_legend_handles_labels()[0], fontsize=8, loc="best")
    fig.suptitle("EOS split of R − F: pre-EOS, first EOS, one absorbed, both absorbed")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_task_by_divergence(analysis: StudyAnalysis, path: str | Path) -> Path | None:
    """Accuracy difference Q - P among replicates diverged by t, per action, with bands;
    above :data:`LONG_HORIZON` positions on a log axis, each decoding-time compression
    drawn."""
    groups = by_model(analysis.task_by_divergence)
    if not groups:
        return None
    colors = action_colors(analysis)
    entries = {(a.model, a.action): a for a in analysis.actions}
    H = analysis.meta.horizon
    fig, axes = _panels(len(groups))
    for ax, (model, rows) in zip(axes, groups.items(), strict=True):
        cuts = False
        for row in rows:
            action = entries.get((model, row.action))
            if action is not None:
                cuts |= mark_compressions(ax, action, colors.get(row.action, "black"))
            c = CurveArrays(*(np.asarray(v, dtype=np.float64) for v in (
                row.curve.x, row.curve.estimate, row.curve.lo, row.curve.hi)))
            color = colors.get(row.action, "black")
            _band(ax, c, color)
            ax.plot(c.x, c.estimate * 100, color=color, lw=1.8,
                    marker="." if c.x.size <= 64 else None,
                    label=f"{row.action} (diverged by H: {100 * row.p_diverged[-1]:.0f}%)")
        ax.axhline(0, color="0.3", lw=0.8)
        if cuts:
            _compression_legend(ax)
        if H > LONG_HORIZON:
            ax.set_xscale("log")
        ax.set_xlim(1, H)
        ax.set_xlabel("divergence by step t" + (" (log scale)" if H > LONG_HORIZON else ""))
        ax.set_ylabel("accuracy Q − P given τ ≤ t (pp)")
        ax.set_title(model)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle("Task accuracy difference by divergence time")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_tokens_per_round(analysis: StudyAnalysis, path: str | Path) -> Path | None:
    """Self-speculative decoding: expected tokens per verification round against draft length."""
    groups = by_model([s for s in analysis.speculative
                       if any(v.defined for v in s.numbers.tokens_per_round.values())])
    if not groups:
        return None
    colors = action_colors(analysis)
    fig, axes = _panels(len(groups))
    for ax, (model, rows) in zip(axes, groups.items(), strict=True):
        for s in rows:
            gammas = sorted(s.numbers.tokens_per_round)
            ends = np.array([_ends(s.numbers.tokens_per_round[g]) for g in gammas])
            color = colors.get(s.action, None)
            ax.fill_between(gammas, ends[:, 1], ends[:, 2], color=color, alpha=BAND_ALPHA,
                            lw=0)
            ax.plot(gammas, ends[:, 0], "o-", color=color, lw=1.8,
                    label=f"{s.action} (acceptance {100 * s.numbers.acceptance.estimate:.1f}%)")
            ax.set_xscale("log", base=2)
            ax.set_xticks(gammas, [str(g) for g in gammas])
        ax.set_xlabel("draft length γ (tokens drafted per round)")
        ax.set_ylabel("expected tokens per verification round")
        ax.set_title(model)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle("Self-speculative decoding with the compressed cache as drafter")
    fig.tight_layout()
    return save_figure(fig, path)


def _bar_axes(ax, names: list[str], ylabel: str, title: str) -> None:
    """A zero line, one tick per bar, a y label, a title and a light y grid."""
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set_xticks(np.arange(len(names)), names, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)


def plot_paper_figure7(analysis: StudyAnalysis, path: str | Path) -> Path | None:
    """The paper's Figure 7: late-minus-early B(a) intervals per action (left; strict pre-EOS
    beside it when measured) and the EOS-stacked Delta(R_TV - F) of each contrast (right),
    its EOS share printed at the bar's end."""
    if not analysis.meta.records.complete_branches or analysis.lags is None:
        return None  # B and the EOS split need complete rollouts
    actions = [a for a in analysis.actions if a.scalars.get("B") is not None
               and a.scalars["B"].defined]
    contrasts = list(analysis.eos_contrasts)
    if not actions and not contrasts:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.0, 4.8), squeeze=True)
    labels = [f"{a.model}\n{a.action}" if len(analysis.models) > 1 else a.action
              for a in actions]
    for offset, key, marker, name in ((-0.12, "B", "o", "B(a)"),
                                      (0.12, "B_strict", "s", "B(a) strict pre-EOS")):
        ends = [_ends(a.scalars.get(key)) for a in actions]
        if not any(math.isfinite(e[0]) for e in ends):
            continue
        left.errorbar(np.arange(len(actions)) + offset, [100 * e[0] for e in ends],
                      yerr=np.array([_yerr(*e, scale=100) for e in ends]).T, fmt=marker,
                      capsize=3, label=name)
    _bar_axes(left, labels, "late − early branch TV, B(a) (pp)",
              "Branch clock: B(a) = late − early")
    if actions:
        left.legend(fontsize=8)
    names = []
    for i, c in enumerate(contrasts):
        _stack(right, i, [100 * g.estimate for g in c.dG], 0.6)
        est, lo, hi = _ends(c.dR_minus_F)
        right.errorbar([i], [100 * est], yerr=np.array([_yerr(est, lo, hi, 100)]).T, fmt="D",
                       color="black", capsize=3, ms=6)
        share = _share_text(c.eos_share, "EOS share").replace("\n", " ")
        top = max(100 * est, 100 * hi if math.isfinite(hi) else 100 * est)
        right.annotate(share, (i, top), textcoords="offset points", xytext=(0, 6),
                       ha="center", fontsize=8)
        names.append(f"{c.a} − {c.b}" if len(analysis.models) == 1
                     else f"{c.model}\n{c.a} − {c.b}")
    _bar_axes(right, names, "Δ(R_TV − F) by EOS category (pp)",
              "EOS split of the difference (diamond: total)")
    if contrasts:
        categories = list(contrasts[0].categories)
        right.legend(handles=[Patch(color=EOS_COLORS[r % len(EOS_COLORS)], label=c)
                              for r, c in enumerate(categories)], fontsize=8, loc="best")
    fig.tight_layout()
    return save_figure(fig, path)


@dataclass(frozen=True)
class MemoryPoint:
    """One action in :func:`plot_risk_memory`: its ``kv_fraction`` and ``R`` with interval."""

    action: str
    kv_fraction: float
    R: float
    lo: float
    hi: float


def risk_memory_points(analysis: StudyAnalysis) -> dict[str, list[MemoryPoint]]:
    """Per model, every action with a finite ``kv_fraction`` and ``R``, in the analysis' order;
    models without any are left out."""
    out: dict[str, list[MemoryPoint]] = {}
    for model, actions in by_model(analysis.actions).items():
        points = [MemoryPoint(a.action, a.kv_fraction, *_ends(a.scalars.get("R")))
                  for a in actions]
        points = [p for p in points if math.isfinite(p.kv_fraction) and math.isfinite(p.R)]
        if points:
            out[model] = points
    return out


def plot_risk_memory(analysis: StudyAnalysis, path: str | Path) -> Path | None:
    """Risk R (with its interval) against ``kv_fraction``, Q's prompt cache as a fraction of
    the full cache, one point per action: eviction and quantization at equal memory."""
    panels = risk_memory_points(analysis)
    if not panels:
        return None
    colors = action_colors(analysis)
    fig, axes = _panels(len(panels), height=5.4)
    for ax, (model, points) in zip(axes, panels.items(), strict=True):
        for p in points:
            ax.errorbar([100 * p.kv_fraction], [100 * p.R],
                        yerr=np.array([_yerr(p.R, p.lo, p.hi, 100)]).T, fmt="o", ms=6,
                        capsize=3, color=colors[p.action], label=p.action)
        ax.set_xlim(0, 105)  # y: autoscaled with a margin, so R = 0 (full) stays visible
        ax.set_xlabel("Q's prompt cache, % of the full cache in the model's dtype (kv_fraction)")
        ax.set_ylabel("risk R, % of generated positions")
        ax.set_title(model)
        ax.grid(alpha=0.3)
        # below the axes: points may sit anywhere, and their names are long
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                  frameon=False)
    fig.suptitle("Risk against KV-cache memory")
    fig.tight_layout()
    return save_figure(fig, path)


@dataclass(frozen=True)
class Figure:
    """A report figure: file stem, drawing function, and a one-sentence caption."""

    name: str
    draw: Callable[[StudyAnalysis, str | Path], Path | None]
    caption: str


#: The report's figures, in order. Adding a figure = one function + one line here.
FIGURES = (
    Figure("timing", plot_timing,
           "Each curve is the share of coupled trajectories whose branches have first disagreed "
           "by step t (bands: bootstrap intervals); the gap above a curve at the right edge is "
           "the mass that never diverged within H, given in the legend."),
    Figure("contrasts", plot_contrasts,
           "For each contrast a − b, the bars split the change in risk ΔR (black diamond) into "
           "the change in first-divergence occurrence, in post-divergence exposure, and in the "
           "post-divergence mismatch rate; a large exposure bar means a differs mainly because "
           "its branches diverge earlier, not because they disagree more once diverged."),
    Figure("lag_profiles", plot_lag_profiles,
           "Each curve is the mean branch-aligned TV j steps after the first divergence among "
           "trajectories that diverged early (bands: bootstrap intervals, dashed: strict "
           "pre-EOS variant); B(a) is the late-window mean minus the early-window mean, so a "
           "rising curve means the branches drift further apart after diverging."),
    Figure("expected_delta", plot_expected_delta,
           "Each curve is the expected branch-aligned TV at generated position t (bands: "
           "bootstrap intervals); its average over t is the risk R, so the area under a curve "
           "shows where in the generation an action's disagreement accrues."),
    Figure("eos_split", plot_eos_split,
           "Left of the dashed line, each action's R − F stacked by the branches' EOS state "
           "(G_r); right of it, each contrast's Δ(R − F) stacked the same way (ΔG_r), with the "
           "EOS share (first EOS, one or both absorbed) under its name. Diamonds: totals with "
           "bootstrap intervals."),
    Figure("paper_figure7", plot_paper_figure7,
           "The paper's Figure 7. Left: B(a), the late-window minus early-window branch TV "
           "after the first divergence, per action with its bootstrap interval (squares: the "
           "strict pre-EOS variant, one ratio per lag window). Right: each contrast's "
           "Δ(R_TV − F) stacked by EOS category (ΔG_r), the diamond its total with its "
           "interval, and its EOS share at the bar's end."),
    Figure("task_by_divergence", plot_task_by_divergence,
           "Each curve is the task-score difference Q − P (percentage points) among the "
           "replicates whose branches diverged by step t (bands: bootstrap intervals); "
           "replicates that never diverge score alike, so a curve below 0 that starts early "
           "means early divergences cost the answer."),
    Figure("tokens_per_round", plot_tokens_per_round,
           "Expected tokens per verification round when the action's cache drafts for the "
           "full cache (Leviathan et al.'s speculative sampling at the run's temperature), "
           "computed exactly from the acceptance probabilities along the reference path "
           "(bands: bootstrap intervals); 1 is no gain, gamma + 1 the ceiling."),
    Figure("risk_memory", plot_risk_memory,
           "Each point is an action's risk R (bars: bootstrap interval) against the size of "
           "its prompt cache as a fraction of the full cache in the model's dtype "
           "(kv_fraction: entries kept times bits, scales and zero points included; mean over "
           "documents): eviction and quantization compared at equal memory. Actions whose "
           "records do not tell the cache size are left out."),
)


# The finite-state check (kvdrift finite-state) ----------------------------------------


def plot_finite_study(result: FiniteStudyResult, path: str | Path) -> Path:
    """Left: both estimators (mean +- 2 SE) against exact risk. Right: sorted variance ratios."""
    exact = np.array([s.exact for s in result.systems])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    lim = [0, max(exact.max(), max(s.naive_mean for s in result.systems)) * 1.1 + 1e-3]
    left.plot(lim, lim, color="0.6", lw=1, ls="--", label="estimate = exact")
    left.errorbar(exact, [s.naive_mean for s in result.systems],
                  yerr=[2 * s.naive_se for s in result.systems], fmt="o", ms=4, capsize=2,
                  label="complete coupled rollouts (naive)", color="tab:orange")
    left.errorbar(exact, [s.swrb_mean for s in result.systems],
                  yerr=[2 * s.swrb_se for s in result.systems], fmt="s", ms=4, capsize=2,
                  label="SWRB", color="tab:blue")
    left.set_xlabel("exact risk R (enumeration)")
    left.set_ylabel("estimated risk (mean ± 2 SE)")
    left.set_title(f"{len(result.systems)} binary systems, H = {result.horizon}, "
                   f"{result.replicates} replicates")
    left.legend(fontsize=8, loc="upper left")

    ratios = np.sort(result.var_ratios)
    right.bar(np.arange(1, ratios.size + 1), ratios, color="tab:blue")
    right.axhline(result.median_var_ratio, color="k", lw=1,
                  label=f"median {result.median_var_ratio:.1f}")
    right.set_yscale("log")
    undefined = len(result.systems) - ratios.size
    right.set_xlabel("system (sorted by variance ratio)" + (
        f"; {undefined} undefined (left out)" if undefined else ""))
    right.set_ylabel("variance ratio naive / SWRB (log scale)")
    right.set_title(f"cost ×{result.cost_ratio:.2f}, variance-cost advantage "
                    f"{result.advantage:.1f}")
    right.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=130)
