"""The report's "Contrasts": each gap Delta R = R_b - R_a split into occurrence, exposure and
rate (docs/method.md, the decomposition R = O + E C), and where in the generation the gap
sits. The per-stratum section writes its contrasts through :func:`stratum_contrast_lines`."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvdrift.analysis.interval import Interval
from kvdrift.analysis.results import ContrastResult, StudyAnalysis
from kvdrift.report.page_model import (
    Block,
    Cell,
    Difference,
    Estimate,
    Markup,
    Section,
    Table,
    Text,
)

HEADERS = ("&Delta;R (pp)", "occurrence &Delta;O (pp)",
           "exposure &Delta;E&middot;C&#772; (pp)", "rate &Delta;C&middot;E&#772; (pp)",
           "exposure share (%)")
NOTE = ('<p class="note">&Delta;R = R<sub>a</sub> &minus; R<sub>b</sub> splits exactly into '
        "&Delta;O + &Delta;E&middot;C&#772; + &Delta;C&middot;E&#772;, where C&#772; and "
        "E&#772; are the midpoints of the two actions' values; exposure share = "
        "&Delta;E&middot;C&#772; / &Delta;R, "
        "the part of the gap due to diverging earlier rather than disagreeing more "
        "after divergence.</p>")
GAPS_NOTE = ('<p class="note">Generation clock: the gap in mean branch TV '
             "E[&delta;<sub>t</sub>] between the two actions, averaged over blocks of "
             "generated positions.</p>")

Labelled = Sequence[tuple[Cell, ContrastResult]]
"""Contrasts, each with the first cell of its row (its model, or its stratum)."""


def contrasts(analysis: StudyAnalysis) -> Section:
    """Every contrast's decomposition, then its generation-clock gaps."""
    if not analysis.contrasts:
        return Section("Contrasts", "contrasts",
                       ((Markup("<p>No contrasts in this analysis.</p>"),),))
    labelled = [(Text(c.model), c) for c in analysis.contrasts]
    table = Table(("model", "contrast (a &minus; b)", *HEADERS),
                  _decomposition_rows(labelled), numeric_from=2)
    return Section("Contrasts", "contrasts",
                   ((Markup(NOTE), table, *_block_gaps(labelled, "model")),))


def stratum_contrast_lines(labelled: Labelled) -> tuple[tuple[Block, ...], ...]:
    """One model's stratum contrasts: a tally, their decomposition, their clock gaps."""
    contrasts = [c for _, c in labelled]
    shares = [c.terms["exposure_share"].estimate for c in contrasts
              if "exposure_share" in c.terms]
    majority = sum(1 for x in shares if math.isfinite(x) and x > 0.5)
    separated = sum(1 for c in contrasts if "dR" in c.terms and c.terms["dR"].excludes_zero())
    n = len(contrasts)
    tally = Markup(f'<p class="note">Exposure share above 50% in {majority} of {n} stratum '
                   f"contrasts; &Delta;R interval excludes 0 in {separated} of {n}.</p>")
    table = Table(("stratum", "contrast (a &minus; b)", *HEADERS),
                  _decomposition_rows(labelled), numeric_from=2)
    return (tally,), (table,), _block_gaps(labelled, "stratum")


def _decomposition_rows(labelled: Labelled) -> tuple[tuple[Cell, ...], ...]:
    """The decomposition's cells of each contrast, in the order of :data:`HEADERS`."""
    return tuple((label, Difference(c.a, c.b),
                  Estimate(c.terms.get("dR"), signed=True),
                  Estimate(c.terms.get("occurrence_term"), signed=True),
                  Estimate(c.terms.get("exposure_term"), signed=True),
                  Estimate(c.terms.get("rate_term"), signed=True),
                  Estimate(c.terms.get("exposure_share"), digits=1))
                 for label, c in labelled)


def _block_gaps(labelled: Labelled, label: str) -> tuple[Block, ...]:
    """The generation clock: where in the generation each contrast's gap in E[delta_t] sits
    (nothing when no contrast has block gaps)."""
    with_gaps = [(name, c) for name, c in labelled if c.block_gap is not None]
    if not with_gaps:
        return ()
    blocks = with_gaps[0][1].block_gap.blocks or ()
    headers = (label, "contrast (a &minus; b)",
               *(f"t {lo}&ndash;{hi} (pp)" for lo, hi in blocks))
    rows = tuple(
        (name, Difference(c.a, c.b),
         *(Estimate(Interval(e, lo, hi, c.block_gap.level), signed=True)
           for e, lo, hi in zip(c.block_gap.estimate, c.block_gap.lo, c.block_gap.hi,
                                strict=True)))
        for name, c in with_gaps)
    return Markup(GAPS_NOTE), Table(headers, rows, numeric_from=2)
