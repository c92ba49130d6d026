"""The frontier's report: a figure (measure against kv_fraction, one curve per family, the
tolerance line, certified points marked) and an HTML page with the table of every budget."""

from __future__ import annotations

from html import escape
from pathlib import Path

import numpy as np

from kvdrift import output
from kvdrift.frontier_search.families import WEIGHTS_FAMILIES
from kvdrift.frontier_search.result import STATUS_TEXT, BudgetResult, FrontierResult
from kvdrift.report import page
from kvdrift.report.figures import plt, save_figure
from kvdrift.report.numbers import number_text
from kvdrift.text import printable


def memory_words(result: FrontierResult) -> tuple[str, str, str]:
    """How the frontier's memory axis reads: the axis title, what is held (``cache`` or
    ``weights``) and what it is a share of (:func:`~kvdrift.frontier_search.families.
    memory_column`)."""
    if any(f.family in WEIGHTS_FAMILIES for f in result.families):
        return "Q's weights, % of P's weights (weights_fraction)", "weights", "P's weights"
    return "Q's KV cache, % of the full cache (kv_fraction)", "cache", "the full cache"


def plot_frontier(result: FrontierResult, path: str | Path) -> Path:
    """One curve per family: the measure's estimate and its bounds at every budget tried,
    against kv_fraction; filled markers are certified, the star the best (unbounded bounds,
    NaN, are not drawn)."""
    fig, ax = plt.subplots(figsize=(7.6, 5.0))
    colors = plt.get_cmap("tab10")
    for i, fam in enumerate(result.families):
        pts = sorted(fam.budgets, key=lambda b: b.kv_fraction)
        if not pts:
            continue
        x = np.array([100 * b.kv_fraction for b in pts])
        est = np.array([b.estimate for b in pts])
        lo = np.nan_to_num(est - np.array([b.lo for b in pts]))
        hi = np.nan_to_num(np.array([b.hi for b in pts]) - est)
        color = colors(i % 10)
        ax.errorbar(x, est, yerr=np.vstack([lo, hi]), color=color, capsize=3,
                    marker="o", mfc="white", label=fam.family)
        cert = [b for b in pts if b.status == "certified"]
        ax.plot([100 * b.kv_fraction for b in cert], [b.estimate for b in cert],
                "o", color=color)
    ax.axhline(result.tolerance, color="black", ls="--", lw=1,
               label=f"tolerance {result.measure}")
    if result.best is not None:
        ax.plot([100 * result.best.kv_fraction], [result.best.estimate], "*",
                ms=16, color="gold", mec="black", label=f"best: {result.best.action}")
    ax.set_xlabel(memory_words(result)[0])
    ax.set_ylabel(result.measure.split()[0])
    ax.set_xlim(0, 105)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"Compression frontier ({result.documents} documents; "
                 + (f"certified at {100 * (1 - result.alpha):.3g}% jointly)"
                    if result.certifiable else "estimates only, not certified)"))
    fig.tight_layout()
    return save_figure(fig, path)


def status_text(b: BudgetResult) -> str:
    """A budget's status in words; for an undecided one, what its values suggest."""
    more = b.more_text()
    return STATUS_TEXT[b.status] + (f" ({more})" if more else "")


def _row(b: BudgetResult, on_frontier: bool, best: BudgetResult | None) -> list[str]:
    mark = " &#9733;" if best is not None and b is best else ""
    bounds = ("&mdash;" if np.isnan(b.lo) and np.isnan(b.hi) else
              f"[{number_text(b.lo, 1, 4)}, {number_text(b.hi, 1, 4)}]")
    decided = "" if b.decided_at is None else str(b.decided_at)
    return [escape(b.family), escape(b.label) + mark, f"<code>{escape(b.action)}</code>",
            number_text(b.kv_fraction, 100, 1) + "%",
            f"{number_text(b.estimate, 1, 4)}<br><span class=\"ci\">{bounds}</span>",
            escape(status_text(b)), str(b.rounds), decided, str(b.replicates),
            "yes" if on_frontier else ""]


def headline(result: FrontierResult) -> list[str]:
    """The answer in words, with its scope, the bound method and the multiplicity scheme."""
    best = result.best
    measure = escape(result.measure)
    lines = []
    if not result.certifiable:
        lines.append(f"<p><strong>Estimates only, not certified: <code>{measure}</code> is an "
                     "unbounded measure</strong> (state a bound on its values with "
                     "<code>--cap</code> to certify it).</p>")
    elif best is None:
        lines.append(f"<p>No budget tried is certified to keep <code>{measure}</code>.</p>")
    else:
        side = "upper" if result.better == "<=" else "lower"
        ties = "".join(f", tied with <code>{escape(t.action)}</code>" for t in result.ties)
        _, held, whole = memory_words(result)
        lines.append(f"<p><strong>Least {held} certified for these {result.documents} "
                     f"documents:</strong> <code>{escape(best.action)}</code>, "
                     f"{number_text(best.kv_fraction, 100, 1)}% of {whole}{ties} "
                     f"(<code>{measure}</code>; {side} bound "
                     f"{number_text(best.bound(result.better), 1, 4)}).</p>")
    items = []
    for fam in result.families:
        if result.certifiable:
            c, word = fam.certified, "none certified"
        else:
            within = [b for b in fam.budgets if b.status == "estimate within"]
            c, word = (within[-1] if within else None), "no estimate within"
        what = word if c is None else (
            f"<code>{escape(c.action)}</code> at {number_text(c.kv_fraction, 100, 1)}%"
            + ("" if result.certifiable else " (estimate within, not certified)"))
        dom = (" &mdash; dominated (outside the tolerance at level 1 &minus; alpha with at "
               "least the best's cache; assumes its measure gets no better with less cache)"
               if fam.family in result.dominated else "")
        items.append(f"<li>{escape(fam.family)}: {what}{dom}</li>")
    lines.append(f"<ul>{''.join(items)}</ul>")
    word = "Guarantee" if result.certifiable else "No guarantee"
    lines.append(f"<p><strong>{word}.</strong> {escape(result.guarantee())}</p>")
    lines.append(
        f"<p class=\"note\">Measure: {escape(result.measure_range)}. Bounds: "
        f"{escape(result.bound_method)}. Multiplicity: {escape(result.scheme.describe())}. "
        f"Each row's bounds are [lower, upper]; the certifying side is held at the family's "
        f"level, the other at the fails level (docs/method.md section 12). The search ran "
        f"{result.looks} looks and evaluated {result.calls:,} coupled positions; every budget "
        f"at the most replicates would take {result.full_grid_calls:,}.</p>")
    return lines


def frontier_section(result: FrontierResult, examples: str = "") -> str:
    """The frontier's HTML: the answer in words, the budgets by status, then ``examples``
    (already-escaped HTML)."""
    lines = headline(result)
    for w in result.warnings:
        lines.append(f"<p class=\"note\"><strong>warning:</strong> {escape(w)}</p>")
    on = {(b.family, b.index) for b in result.frontier}
    headers = ["family", "budget", "action", "kv_fraction", "estimate [lo, hi]", "status",
               "rounds", "decided at", "replicates / doc", "frontier"]
    for status in STATUS_TEXT:
        rows = [_row(b, (b.family, b.index) in on, result.best) for f in result.families
                for b in f.budgets if b.status == status]
        if rows:
            lines.append(f"<h3>{escape(STATUS_TEXT[status])}</h3>")
            lines.append(page.table(headers, rows, numeric_from=3))
    lines.append(examples)
    return page.section("The compression frontier", "frontier", "\n".join(lines))


def frontier_examples(result: FrontierResult, stages: str | Path | output.OutputDir) -> str:
    """HTML: at each family's certified budget, one example of P's and Q's generations (the
    replicate at the median divergence) from the last look that ran it; "" when none is.
    ``stages`` is the frontier's ``stages/`` (a held folder: each stage read through it)."""
    from kvdrift.directory import StudyDirectory
    from kvdrift.report.sections.examples import action_example_html

    if isinstance(stages, output.OutputDir):
        looks = [stages.subdir(n) for n in reversed(stages.names()) if not n.startswith(".")]
    else:
        looks = sorted(Path(stages).iterdir(), reverse=True) if Path(stages).is_dir() else []
    parts = []
    for fam in result.families:
        c = fam.certified
        where = next((d for d in looks if c is not None
                      and c.action in StudyDirectory(d).config.get("actions", ())), None)
        if where is None:
            continue
        parts.append(f"<h4>{escape(c.family)} at {escape(c.label)} (<code>{escape(c.action)}"
                     f"</code>, look {escape(Path(where).name)})</h4>"
                     + action_example_html(StudyDirectory(where), c.action))
    if not parts:
        return ""
    return ("<h3>Examples at each family's certified budget</h3><p class=\"note\">What the "
            "full cache (P) and the certified budget (Q) generated for one replicate, the one "
            "at the median divergence; the divergence marked, mismatches highlighted, each "
            "position's TV as a background shade.</p>" + "".join(parts))


def write_frontier_report(result: FrontierResult, out_dir: str | Path | output.OutputDir,
                          title: str = "KV-cache compression frontier",
                          examples: str = "") -> Path:
    """Write ``report.html`` and ``figures/frontier.png`` into ``out_dir`` (a path, or a
    folder held by the caller); returns the HTML. ``examples`` is already-escaped HTML placed
    after the tables."""
    if not isinstance(out_dir, output.OutputDir):
        out_dir = output.OutputDir(out_dir, marker="report")
    plot_frontier(result, out_dir.subdir("figures") / "frontier.png")  # never through a link
    marks = ("filled points are certified within the tolerance (the dashed line), the star "
             "the least cache certified" if result.certifiable else
             "the dashed line is the tolerance; estimates only, not certified")
    figure = ('<figure><img src="figures/frontier.png" alt="frontier"><figcaption>The measure '
              "against the cache kept, per family: each point a budget tried with its "
              f"bounds; {marks}.</figcaption></figure>")
    body = frontier_section(result, examples) + figure
    intro = ("Generated by kvdrift. Each estimate is the mean over the documents of the "
             "values its bounds use, shown with [lower, upper] beneath it (confidence-sequence "
             "bounds, not bootstrap intervals); &ldquo;&mdash;&rdquo; marks a bound an "
             "unbounded measure does not have.")
    return out_dir.write_text("report.html", page.standalone(title, body, intro))


def frontier_table(result: FrontierResult):
    """The terminal table: every budget tried with its status and bounds; the best marked."""
    from rich.table import Table
    from rich.text import Text

    from kvdrift.report.terminal import user_text

    word = "certified" if result.certifiable else "estimates only, not certified"
    table = Table(title=f"frontier: {user_text(result.measure)} ({word}; "
                        f"{result.documents} documents)", title_justify="left")
    for name in ("family", "budget", "kv_fraction", "estimate", "bounds", "status", "rounds"):
        table.add_column(name, justify="left" if name in ("family", "budget", "status")
                         else "right")
    for fam in result.families:
        for b in fam.budgets:
            mark = " *" if result.best is not None and b is result.best else ""
            bounds = ("—" if np.isnan(b.lo) and np.isnan(b.hi) else
                      f"[{number_text(b.lo, 1, 4)}, {number_text(b.hi, 1, 4)}]")
            table.add_row(user_text(fam.family), user_text(b.label + mark),
                          f"{100 * b.kv_fraction:.1f}%", number_text(b.estimate, 1, 4),
                          bounds, Text(status_text(b)), str(b.rounds))
    best = "none" if result.best is None else (
        f"{printable(result.best.action)} at {100 * result.best.kv_fraction:.1f}% of "
        f"{memory_words(result)[2]}")
    dominated = printable(", ".join(result.dominated)) or "none"
    table.caption = (f"best: {best}; dominated (assuming monotone): {dominated}; "
                     f"{printable(result.guarantee())} {printable(result.scheme.describe())}; "
                     f"{result.calls:,} coupled positions (full grid: "
                     f"{result.full_grid_calls:,})")
    return table
