"""Terminal tables (rich): a run's per-action table, a study's summary, and how to print them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kvdrift.report.numbers import HEADLINE, MISSING, Quantity, number_text

if TYPE_CHECKING:
    from kvdrift.analysis.interval import Interval
    from kvdrift.analysis.results import StudyAnalysis
    from kvdrift.analysis.summary import ActionSummary

#: The terminal table's quantities, a subset of the HTML headline table.
SUMMARY_KEYS = ("p_diverge", "R", "R_tv", "E", "C", "R_minus_F", "B")

#: Widest page :func:`print_whole` measures a table on (wider than any real table).
_WIDEST = 100_000


def swrb_rate_note(raw: str) -> str:
    """Why an SWRB table may show an impossible-looking C_H, and where its raw value is."""
    return (f"SWRB: C_H = Π_H/E_H is a ratio of two unbiased estimates, so it and its interval "
            f"can leave [0, 1] (sampling noise, not a bug); {raw} keeps the raw value.")


def print_whole(console: Console, renderable: RenderableType) -> None:
    """Print on ``console``; off a terminal (a file, a pipe, a CI log) never cut a cell.

    A terminal gets the usual render at its width. Elsewhere rich would squeeze a table into
    80 columns and truncate names and numbers ("sna…", "68.…"); the table is printed at its
    natural width instead.
    """
    if console.is_terminal:
        console.print(renderable)
        return
    natural = Measurement.get(console, console.options.update_width(_WIDEST), renderable).maximum
    if natural <= console.width:
        console.print(renderable)
        return
    Console(file=console.file, width=natural, color_system=None).print(renderable)


def _percent(value: float, digits: int) -> str:
    text = number_text(value, 100, digits)
    return text if text == MISSING else text + "%"


def run_table(summaries: Sequence[ActionSummary], estimator: str = "rollout") -> Table:
    """One row per (model, action) of a run, point estimates; "—" where not measured.

    SWRB does not follow the fixed-history path, so its F (and the readings along X: mean KL,
    speculative acceptance, tokens per round at draft length 4) is "—"; a mean entry time
    needs at least one divergence.
    """
    caption = Text(swrb_rate_note("--json")) if estimator == "swrb" else None
    table = Table(title="Per action (documents weighted equally within strata, strata equally)",
                  caption=caption)
    for col in ("model", "action", "docs", "P(tau<=H)", "entry time", "R", "R_TV", "O_H",
                "E_H", "Pi_H", "C_H", "F", "KL", "accept", "tok/round(4)"):
        table.add_column(col, justify="right")
    for s in summaries:
        table.add_row(Text(s.model), Text(s.action), str(s.documents), _percent(s.p_diverge, 1),
                      number_text(s.mean_entry_time, digits=1), _percent(s.R, 2),
                      _percent(s.R_tv, 2), _percent(s.O, 2), _percent(s.E, 2),
                      _percent(s.Pi, 2), _percent(s.C, 1),
                      _percent(s.F, 2), number_text(s.kl, digits=3),
                      _percent(s.acceptance, 1), number_text(s.tokens_per_round, digits=2))
    return table


def _cell(q: Quantity, interval: Interval | None) -> Text:
    """The estimate, and below it the interval (dim): two short lines keep the table narrow."""
    if interval is None or not interval.defined:
        return Text(MISSING)
    text = Text(number_text(interval.estimate, q.scale, 1))
    lo, hi = interval.lo, interval.hi
    if math.isfinite(lo) and math.isfinite(hi):
        text.append(f"\n[{number_text(lo, q.scale, 1)}, {number_text(hi, q.scale, 1)}]",
                    style="dim")
    return text


def summary_table(analysis: StudyAnalysis) -> Table:
    """One row per (model, action): P(tau<=H), R, E_H, C_H, R-F, B(a) with their intervals.

    Percent for fractions, pp for differences, one decimal. Each cell is the estimate over its
    ``[lo, hi]``; cells are plain :class:`rich.text.Text`, so brackets are never read as markup.
    """
    H = analysis.meta.horizon
    quantities: list[Quantity] = [q for key in SUMMARY_KEYS for q in HEADLINE if q.key == key]
    estimator = analysis.meta.estimator
    caption = ("estimate over [lo, hi]; %: of positions (P(τ≤H): of trajectories); "
               "pp: percentage points")
    if estimator == "swrb":
        caption += "\n" + swrb_rate_note("analysis.json")
    table = Table(
        title="kvdrift study summary" + (f" ({estimator})" if estimator else ""),
        caption=Text(caption),
        header_style="bold",
    )
    table.add_column("model", style="cyan", overflow="fold")
    table.add_column("action", style="bold", overflow="fold")
    for q in quantities:
        table.add_column(f"{q.text.format(H=H)}\n({q.unit})", justify="right")
    previous = None
    for a in analysis.actions:
        model = a.model
        if previous is not None and model != previous:
            table.add_section()
        table.add_row(Text(model if model != previous else ""), Text(a.action),
                      *(_cell(q, a.scalars.get(q.key)) for q in quantities))
        previous = model
    return table
