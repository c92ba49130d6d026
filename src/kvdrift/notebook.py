"""Results that show as tables in a notebook, as pandas' and scipy's do, and print short.

Jupyter shows an object by calling its ``_repr_html_``; a result with a ``to_frame()`` (one row
per model x action, per family x budget, ...) shows that frame, headed by the result's kind.
A study's analysis (and a measurement) shows a curated table instead: per action its cache in
bytes, and the terminal summary's quantities under the terminal's headers as ``estimate [lo,
hi]``, with the same legend (:mod:`kvdrift.report.legend`). ``repr()`` is a line or a few,
never the DataFrames a result holds.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from kvdrift.analysis.results import StudyAnalysis

#: Most rows a result's table shows in a notebook (pandas elides the middle of longer ones).
MAX_ROWS = 60


def size_text(nbytes: float) -> str:
    """``4718592`` -> ``"4.5 MiB"``; "—" where not measured."""
    if not math.isfinite(nbytes):
        return "—"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def _interval_text(interval, scale: float, digits: int) -> str:
    """``"87.5 [75.0, 95.8]"``; the bracket left off without ends, "—" without an estimate
    (as the report writes it; :mod:`kvdrift.report` is not imported here: it sets
    matplotlib's backend, and a notebook's figures would no longer show)."""
    def number(value: float) -> str:
        return f"{value * scale:.{digits}f}" if math.isfinite(value) else "—"

    if interval is None or not math.isfinite(interval.estimate):
        return "—"
    text = number(interval.estimate)
    if math.isfinite(interval.lo) and math.isfinite(interval.hi):
        text += f" [{number(interval.lo)}, {number(interval.hi)}]"
    return text


def curated_frame(analysis: StudyAnalysis) -> pd.DataFrame:
    """One row per model x action: Q's prompt cache (``KV cache``, bytes; ``kv_fraction``)
    and the terminal summary's quantities as text, ``estimate [lo, hi]`` in their units."""
    import pandas as pd

    from kvdrift.analysis import legend, registry

    H = analysis.meta.horizon
    quantities = [q for q in registry.QUANTITIES if q.summary]
    rows = []
    for a in analysis.actions:
        row = {"model": a.model, "action": a.action, "KV cache": size_text(a.kv_bytes),
               "kv_fraction": "—" if not math.isfinite(a.kv_fraction)
               else f"{a.kv_fraction:.3f}"}
        for q in quantities:
            digits = 1 if q.scale != 1 else 2
            text = _interval_text(a.scalars.get(q.name), q.scale, digits)
            row[f"{legend.header(q.name, H)} ({q.unit})"] = text
        rows.append(row)
    return pd.DataFrame(rows)


def curated_html(analysis: StudyAnalysis, title: str) -> str:
    """The curated table under ``title``, with the legend of its headers."""
    from kvdrift.analysis import legend, registry

    frame = curated_frame(analysis)
    names = [q.name for q in registry.QUANTITIES if q.summary]
    notes = ["estimate [lo, hi]; %: of positions (of replicates for P(τ≤H)); "
             "pp: percentage points; to_frame() holds the numbers"]
    notes += legend.lines(names, analysis.meta.horizon)
    notes += list(analysis.meta.notes)
    legend_html = "".join(f"<br>{html.escape(n)}" for n in notes)
    return (f"<div><p><b>{html.escape(title)}</b></p>"
            f"{frame.to_html(index=False, max_rows=MAX_ROWS, na_rep='', border=0)}"
            f"<p><small>{legend_html.removeprefix('<br>')}</small></p></div>")


def analysis_line(analysis: StudyAnalysis) -> str:
    """``smollm2: snapkv-half, recent-half; 6 documents, K = 4, H = 32, rollout``."""
    models = ", ".join(analysis.models) or "no model"
    actions = ", ".join(dict.fromkeys(a.action for a in analysis.actions)) or "no action"
    documents = sum(analysis.meta.documents.values())
    return (f"{models}: {actions}; {documents} documents, K = {analysis.meta.replicates}, "
            f"H = {analysis.meta.horizon}, {analysis.meta.estimator}")


class HtmlTable:
    """Mixin: ``_repr_html_`` is ``to_frame()`` as an HTML table under the result's name;
    ``repr()`` names the result and the size of its table (``to_frame()`` shows it)."""

    def _repr_html_(self) -> str:
        frame = self.to_frame()  # type: ignore[attr-defined]
        title = html.escape(type(self).__name__)
        return (f"<div><p><b>{title}</b></p>"
                f"{frame.to_html(max_rows=MAX_ROWS, na_rep='', border=0)}</div>")

    def __repr__(self) -> str:
        frame = self.to_frame()  # type: ignore[attr-defined]
        return (f"<{type(self).__name__}: {len(frame)} rows x {len(frame.columns)} columns; "
                f"to_frame() gives them>")
