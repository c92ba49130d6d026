"""The report's "Prespecified endpoints": each endpoint with its family-adjusted interval."""

from __future__ import annotations

import math

from kvdrift.analysis.registry import unit_scale
from kvdrift.analysis.results import StudyAnalysis
from kvdrift.report.page_model import Estimate, Markup, Number, Section, Table, Text

TITLE, ANCHOR = "Prespecified endpoints", "endpoints"


def endpoints(analysis: StudyAnalysis) -> Section:
    """The endpoints, with how their family's alpha was shared out among them."""
    endpoints = analysis.endpoints
    if not endpoints:
        return Section(TITLE, ANCHOR,
                       ((Markup("<p>No prespecified endpoints in this analysis.</p>"),),))
    alpha = analysis.meta.alpha
    k = len(endpoints)
    if all(math.isclose(e.alpha, alpha / k, rel_tol=1e-6) for e in endpoints):
        note = (f"Intervals are family-adjusted (Bonferroni): each of the k = {k} endpoints uses "
                f"&alpha;/k = {alpha:g}/{k} = {alpha / k:.5g}, so all {k} intervals hold jointly "
                f"with probability at least {1 - alpha:g}.")
    else:
        note = ("Intervals are family-adjusted: each endpoint's interval is at level "
                "1 &minus; &alpha;<sub>endpoint</sub>, with &alpha;<sub>endpoint</sub> as listed "
                f"(the family's &alpha; divided by the number of endpoints, k = {k}).")
    rows = []
    for e in endpoints:
        unit = e.unit
        rows.append((Text(e.model), Text(e.name),
                     Estimate(e.interval, unit_scale(unit), signed=unit == "pp",
                              suffix=f" {unit}"),
                     Number(e.alpha, digits=5)))
    headers = ("model", "endpoint", "estimate [family-adjusted interval]",
               "&alpha;<sub>endpoint</sub>")
    return Section(TITLE, ANCHOR, ((
        Markup(f'<p class="note">{note} B(&middot;) endpoints are in percentage points, '
               "S<sub>.99</sub> endpoints in percent of positions.</p>"),
        Table(headers, tuple(rows), numeric_from=2)),))
