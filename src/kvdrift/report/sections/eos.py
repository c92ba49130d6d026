"""The report's "EOS split": R, F and R - F of each action split by the branches' end-of-
sequence state, and the contrasts of that split between actions."""

from __future__ import annotations

import math
from html import escape

from kvdrift.analysis.results import StudyAnalysis
from kvdrift.report.numbers import MISSING
from kvdrift.report.page_model import (
    Difference,
    Estimate,
    Markup,
    Number,
    Section,
    Table,
    Text,
)

TITLE, ANCHOR = "EOS split", "eos"
NOTE = ('<p class="note">Each generated position is classed by the two branches\' end-of-'
        "sequence state (neither has emitted EOS; one emits its first EOS there; one branch "
        "already absorbed; both absorbed). Cells are that class's contribution to R, F and "
        "R &minus; F in percentage points of positions; the sum is the quantity itself. "
        "R here is the rollout-TV risk R<sub>TV</sub> = (1/H) &sum;<sub>t</sub> "
        "E[&delta;<sub>t</sub>], equal in expectation to the headline R, and the R &minus; F "
        "row sums exactly to the headline R<sub>TV</sub> &minus; F. The R &minus; F row, "
        "G<sub>r</sub>, has bootstrap intervals.</p>")
CONTRAST_NOTE = (
    '<h3>EOS contrasts</h3><p class="note">&Delta;(R &minus; F) = &sum;<sub>r</sub> '
    "&Delta;G<sub>r</sub> between two actions (a &minus; b); &Delta;G<sub>0</sub> is the "
    "pre-EOS component and the EOS share is (&Delta;G<sub>1</sub> + &Delta;G<sub>2</sub> "
    "+ &Delta;G<sub>3</sub>) / &Delta;(R &minus; F). Intervals: paired document "
    "bootstrap.</p>")
ROWS = (("R", "R"), ("F", "F"), ("R_minus_F", "R &minus; F"))


def eos_split(analysis: StudyAnalysis) -> Section:
    """Three rows per action (R, F, R - F; the last with intervals), then the contrasts."""
    rows, starts, categories = [], set(), None
    for a in analysis.actions:
        split = a.eos_split
        if split is None:
            continue
        cats = list(split.categories)
        categories = categories or cats  # the schema fixes the four categories; first wins
        starts.add(len(rows))
        for i, (key, label) in enumerate(ROWS):
            if key == "R_minus_F" and split.G:  # G_r = (R - F)_r with intervals
                cells = [Estimate(g, signed=True) for g in split.G]
                total = Estimate(split.G_total, signed=True)
            else:
                values = getattr(split, key)
                finite = [v for v in values if math.isfinite(v)]
                cells = ([Number(v, 100) for v in values]
                         + [Markup(MISSING)] * (len(cats) - len(values)))
                total = Number(sum(finite) if finite else math.nan, 100)
            rows.append((Text(a.model if i == 0 else ""), Text(a.action if i == 0 else ""),
                         Markup(label), *cells, total))
    if not rows:
        return Section(TITLE, ANCHOR, ((Markup("<p>No EOS split in this analysis (it needs "
                                               "complete rollouts).</p>"),),))
    headers = ("model", "action", "quantity", *(escape(c) + " (pp)" for c in categories),
               "sum (%)")
    line = [Markup(NOTE), Table(headers, tuple(rows), numeric_from=3,
                                group_starts=frozenset(starts))]
    if analysis.eos_contrasts:
        headers = ("model", "contrast (a &minus; b)",
                   *(f"&Delta;G<sub>{r}</sub> {escape(c)} (pp)" for r, c in enumerate(categories)),
                   "&Delta;(R &minus; F) (pp)", "EOS share (%)")
        contrast_rows = tuple(
            (Text(c.model), Difference(c.a, c.b), *(Estimate(g, signed=True) for g in c.dG),
             Estimate(c.dR_minus_F, signed=True), Estimate(c.eos_share, digits=1))
            for c in analysis.eos_contrasts)
        line += [Markup(CONTRAST_NOTE), Table(headers, contrast_rows, numeric_from=2)]
    return Section(TITLE, ANCHOR, (tuple(line),))
