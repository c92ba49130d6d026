"""The frontier's report: a figure (measure against kv_fraction, one curve per family, the
tolerance line, certified points marked) and an HTML page with the table of every budget."""

from __future__ import annotations

from html import escape
from pathlib import Path

import numpy as np

from kvdrift import output
from kvdrift.frontier_search.result import BudgetResult, FrontierResult
from kvdrift.report import page
from kvdrift.report.figures import plt, save_figure
from kvdrift.report.numbers import number_text
from kvdrift.text import printable

STATUS_TEXT = {"certified": "within tolerance (certified)", "fails": "certainly outside",
               "undecided": "undecided"}


def plot_frontier(result: FrontierResult, path: str | Path) -> Path:
    """One curve per family: the measure's estimate and its simultaneous interval at every
    budget tried, against kv_fraction; filled markers are certified, the star the best."""
    fig, ax = plt.subplots(figsize=(7.6, 5.0))
    colors = plt.get_cmap("tab10")
    for i, fam in enumerate(result.families):
        pts = sorted(fam.budgets, key=lambda b: b.kv_fraction)
        if not pts:
            continue
        x = np.array([100 * b.kv_fraction for b in pts])
        est = np.array([b.interval.estimate for b in pts])
        lo = np.array([b.interval.lo for b in pts])
        hi = np.array([b.interval.hi for b in pts])
        color = colors(i % 10)
        ax.errorbar(x, est, yerr=np.vstack([est - lo, hi - est]), color=color, capsize=3,
                    marker="o", mfc="white", label=fam.family)
        cert = [b for b in pts if b.status == "certified"]
        ax.plot([100 * b.kv_fraction for b in cert], [b.interval.estimate for b in cert],
                "o", color=color)
    ax.axhline(result.tolerance, color="black", ls="--", lw=1,
               label=f"tolerance {result.measure}")
    if result.best is not None:
        ax.plot([100 * result.best.kv_fraction], [result.best.interval.estimate], "*",
                ms=16, color="gold", mec="black", label=f"best: {result.best.action}")
    ax.set_xlabel("Q's KV cache, % of the full cache (kv_fraction)")
    ax.set_ylabel(result.measure.split()[0])
    ax.set_xlim(0, 105)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"Compression frontier (intervals at {100 * result.level:.3g}% each, "
                 f"{100 * (1 - result.alpha):.3g}% jointly)")
    fig.tight_layout()
    return save_figure(fig, path)


def _row(b: BudgetResult, on_frontier: bool, best: BudgetResult | None) -> list[str]:
    iv = b.interval
    mark = " &#9733;" if best is not None and b is best else ""
    return [escape(b.family), escape(b.label) + mark, f"<code>{escape(b.action)}</code>",
            number_text(b.kv_fraction, 100, 1) + "%",
            f"{number_text(iv.estimate, 1, 4)}<br><span class=\"ci\">"
            f"[{number_text(iv.lo, 1, 4)}, {number_text(iv.hi, 1, 4)}]</span>",
            STATUS_TEXT[b.status], str(b.looks), str(b.replicates),
            "yes" if on_frontier else ""]


def frontier_section(result: FrontierResult) -> str:
    """The frontier's HTML: the answer in words, then every budget tried."""
    best = result.best
    lines = []
    if best is None:
        lines.append(f"<p>No budget tried is certified to keep <code>{escape(result.measure)}"
                     f"</code>.</p>")
    else:
        far = best.interval.hi if result.better == "<=" else best.interval.lo
        side = "upper" if result.better == "<=" else "lower"
        lines.append(f"<p><strong>Least cache certified:</strong> <code>{escape(best.action)}"
                     f"</code>, {number_text(best.kv_fraction, 100, 1)}% of the full cache "
                     f"({escape(result.measure)}; {side} bound {number_text(far, 1, 4)}).</p>")
    items = []
    for fam in result.families:
        c = fam.certified
        what = ("none certified" if c is None else
                f"<code>{escape(c.action)}</code> at {number_text(c.kv_fraction, 100, 1)}%")
        dom = " &mdash; certainly dominated" if fam.family in result.dominated else ""
        items.append(f"<li>{escape(fam.family)}: {what}{dom}</li>")
    lines.append(f"<ul>{''.join(items)}</ul>")
    lines.append(
        f"<p class=\"note\">Intervals are t-intervals over replicates for these documents (not "
        f"bootstrap intervals; the variance shrunk toward the range's largest, docs/method.md "
        f"section 12). Every interval is held at level {100 * result.level:.4g}% "
        f"(Bonferroni over the {result.tests} intervals the search could compute), so all "
        f"hold together with probability at least {100 * (1 - result.alpha):.3g}%. The search "
        f"evaluated {result.calls:,} coupled positions; every budget at every look would "
        f"take {result.full_grid_calls:,}.</p>")
    for w in result.warnings:
        lines.append(f"<p class=\"note\"><strong>warning:</strong> {escape(w)}</p>")
    on = {(b.family, b.index) for b in result.frontier}
    rows = [_row(b, (b.family, b.index) in on, best) for f in result.families
            for b in f.budgets]
    lines.append(page.table(["family", "budget", "action", "kv_fraction", "estimate [lo, hi]",
                             "status", "looks", "replicates / doc", "Pareto"], rows,
                            numeric_from=3))
    return page.section("The compression frontier", "frontier", "\n".join(lines))


def write_frontier_report(result: FrontierResult, out_dir: str | Path,
                          title: str = "KV-cache compression frontier") -> Path:
    """Write ``report.html`` and ``figures/frontier.png`` into ``out_dir``; returns the HTML."""
    out_dir = output.make_folder(out_dir, "figures").parent  # never through a link
    plot_frontier(result, out_dir / "figures" / "frontier.png")
    figure = ('<figure><img src="figures/frontier.png" alt="frontier"><figcaption>The measure '
              "against the cache kept, per family: each point a budget tried with its "
              "simultaneous interval; filled points are certified within the tolerance (the "
              "dashed line), the star the least cache certified.</figcaption></figure>")
    body = frontier_section(result) + figure
    return output.write_text(out_dir, "report.html", page.standalone(title, body))


def frontier_table(result: FrontierResult):
    """The terminal table: every budget tried, the certified ones and the best marked."""
    from rich.table import Table
    from rich.text import Text

    from kvdrift.report.terminal import user_text

    table = Table(title=f"frontier: {result.measure} (jointly at "
                        f"{100 * (1 - result.alpha):.3g}%)", title_justify="left")
    for name in ("family", "budget", "kv_fraction", "estimate", "interval", "status", "K/doc"):
        table.add_column(name, justify="left" if name in ("family", "budget", "status")
                         else "right")
    for fam in result.families:
        for b in fam.budgets:
            mark = " *" if result.best is not None and b is result.best else ""
            status = STATUS_TEXT[b.status] + (" (dominated)" if fam.family in result.dominated
                                              and b is fam.budgets[-1] else "")
            table.add_row(user_text(fam.family), user_text(b.label + mark),
                          f"{100 * b.kv_fraction:.1f}%", number_text(b.interval.estimate, 1, 4),
                          f"[{number_text(b.interval.lo, 1, 4)}, "
                          f"{number_text(b.interval.hi, 1, 4)}]", Text(status),
                          str(b.replicates))
    best = "none certified" if result.best is None else (
        f"{printable(result.best.action)} at {100 * result.best.kv_fraction:.1f}% of the cache")
    dominated = printable(", ".join(result.dominated)) or "none"
    table.caption = (f"best: {best}; certainly dominated: {dominated}; "
                     f"{result.calls:,} coupled positions (full grid: "
                     f"{result.full_grid_calls:,})")
    return table
