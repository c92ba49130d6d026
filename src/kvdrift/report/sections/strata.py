"""The report's "Per stratum": every headline quantity and contrast within each stratum."""

from __future__ import annotations

from html import escape

from kvdrift.analysis.results import StudyAnalysis
from kvdrift.report.figures import by_model
from kvdrift.report.numbers import headline_quantities, quantity_header
from kvdrift.report.page_model import Estimate, Markup, Section, Table, Text
from kvdrift.report.sections.contrasts import stratum_contrast_lines

TITLE, ANCHOR = "Per stratum", "strata"
NOTE = ('<p class="note">Every headline quantity and contrast within each stratum: '
        "documents weigh equally, and intervals come from the bootstrap within that "
        "stratum (paired across actions).</p>")


def strata(analysis: StudyAnalysis) -> Section:
    """Per model: a row per stratum and action, then the stratum contrasts."""
    if not analysis.strata:
        return Section(TITLE, ANCHOR, ((Markup("<p>No per-stratum results.</p>"),),))
    H = analysis.meta.horizon
    quantities = headline_quantities()
    headers = ("stratum", "action", "documents",
               *(quantity_header(q, H) for q in quantities))
    lines = [(Markup(NOTE),)]
    for model, rows in by_model(analysis.strata).items():
        body, starts, labelled = [], set(), []
        for st in rows:
            starts.add(len(body))
            for i, a in enumerate(st.actions):
                body.append((Text(st.stratum if i == 0 else ""), Text(a.action),
                             Text(st.documents if i == 0 else ""),
                             *(Estimate.of(q, a.scalars.get(q.name)) for q in quantities)))
            labelled += [(Text(st.stratum), c) for c in st.contrasts]
        lines += [(Markup(f"<h3>{escape(model)}</h3>"),),
                  (Table(headers, tuple(body), numeric_from=2, group_starts=frozenset(starts)),)]
        if labelled:
            lines += stratum_contrast_lines(labelled)
    return Section(TITLE, ANCHOR, tuple(lines))
