"""The report's "Finite-window bounds": each action's sharp interval and Hoeffding enclosure
per observed depth L, and the orderings they certify (docs/method.md, finite windows)."""

from __future__ import annotations

from html import escape

from kvdrift.analysis.results import StudyAnalysis
from kvdrift.report.figures import by_model
from kvdrift.report.page_model import Bullets, Markup, Number, Range, Section, Table, Text

HEADERS = ("model", "action", "depth L", "R<sub>L</sub> (%)", "B<sub>L</sub> (%)",
           "sharp interval [R<sub>L</sub>, R<sub>L</sub> + B<sub>L</sub>] (%)",
           "minimax R<sub>L</sub> + B<sub>L</sub>/2 (%)", "Hoeffding enclosure (%)")
NOTE = ('<p class="note">If each divergent trajectory is followed for only L positions from '
        "&tau;, every kernel pair consistent with what was observed has a risk in the sharp "
        "interval; the minimax point has worst-case error B<sub>L</sub>/2. The Hoeffding "
        "enclosure contains the full-horizon risk with probability at least 1 &minus; "
        "&alpha; over the sampled documents. For rollouts the ladder L = 64, 256, 1,024 "
        "(those below H) is computed from the step records whether or not those depths were "
        "recorded: what watching L steps from the divergence tells about the whole "
        "generation.</p>")
ORDER_NOTE = ('<p class="note"><em>a</em> is certainly better than <em>b</em> at depth L when '
              "the upper end of a's sharp interval is below the lower end of b's: then every "
              "kernel pair consistent with the observed window gives a lower risk to a.</p>")


def bounds(analysis: StudyAnalysis) -> Section:
    """One row per action and depth, then the certified orderings."""
    rows, starts = [], set()
    for a in analysis.actions:
        for i, b in enumerate(sorted(a.bounds, key=lambda b: b.L)):
            if i == 0:
                starts.add(len(rows))
            rows.append((Text(a.model if i == 0 else ""), Text(a.action if i == 0 else ""),
                         Text(b.L), Number(b.R_L, 100), Number(b.B_L, 100),
                         Range(b.sharp.lo, b.sharp.hi), Number(b.sharp.minimax, 100),
                         Range(b.hoeffding.lo, b.hoeffding.hi)))
    table = (Table(HEADERS, tuple(rows), numeric_from=2, group_starts=frozenset(starts))
             if rows else Markup("<p>No finite-window bounds in this analysis.</p>"))
    orders = analysis.certified_order
    if orders:
        items = tuple(
            Markup(f"{escape(model)}, L = {o.L}: <strong>{escape(o.better)}</strong> "
                   f"certainly better than <strong>{escape(o.worse)}</strong>")
            for model, rows in by_model(orders).items() for o in sorted(rows, key=lambda o: o.L))
        ordering = Bullets("orders", items)
    else:
        ordering = Markup("<p>No ordering is certified at any observed depth.</p>")
    return Section("Finite-window bounds", "bounds", (
        (Markup(NOTE), table), (Markup("<h3>Certified orderings</h3>"),),
        (Markup(ORDER_NOTE), ordering)))
