"""A compact terminal summary of a study analysis (rich)."""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from kvdrift.report.numbers import HEADLINE, MISSING, Quantity, interval_values, number_text

#: The terminal table's quantities, a subset of the HTML headline table.
SUMMARY_KEYS = ("p_diverge", "R", "E", "C", "R_minus_F", "B")


def _cell(q: Quantity, interval) -> Text:
    """The estimate, and below it the interval (dim): two short lines keep the table narrow."""
    est, lo, hi = interval_values(interval)
    if not math.isfinite(est):
        return Text(MISSING)
    text = Text(number_text(est, q.scale, 1))
    if math.isfinite(lo) and math.isfinite(hi):
        text.append(f"\n[{number_text(lo, q.scale, 1)}, {number_text(hi, q.scale, 1)}]",
                    style="dim")
    return text


def summary_table(analysis: dict) -> Table:
    """One row per (model, action): P(tau<=H), R, E_H, C_H, R-F, B(a) with their intervals.

    Percent for fractions, pp for differences, one decimal. Each cell is the estimate over its
    ``[lo, hi]``; cells are plain :class:`rich.text.Text`, so brackets are never read as markup.
    """
    meta = analysis.get("meta") or {}
    H = meta.get("horizon", "H")
    quantities: list[Quantity] = [q for key in SUMMARY_KEYS for q in HEADLINE if q.key == key]
    estimator = meta.get("estimator")
    table = Table(
        title="kvdrift study summary" + (f" ({estimator})" if estimator else ""),
        caption=Text("estimate over [lo, hi]; %: of positions (P(τ≤H): of trajectories); "
                     "pp: percentage points"),
        header_style="bold",
    )
    table.add_column("model", style="cyan", overflow="fold")
    table.add_column("action", style="bold", overflow="fold")
    for q in quantities:
        table.add_column(f"{q.text.format(H=H)}\n({q.unit})", justify="right")
    previous = None
    for a in analysis.get("actions", []):
        model = str(a.get("model", "?"))
        if previous is not None and model != previous:
            table.add_section()
        scalars = a.get("scalars") or {}
        table.add_row(Text(model if model != previous else ""), Text(str(a.get("action", "?"))),
                      *(_cell(q, scalars.get(q.key)) for q in quantities))
        previous = model
    return table
