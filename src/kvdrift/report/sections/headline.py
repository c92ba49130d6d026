"""The report's "Headline numbers": every headline quantity of every action, per model."""

from __future__ import annotations

import math
from html import escape

from kvdrift.analysis.registry import quantity
from kvdrift.analysis.results import StudyAnalysis
from kvdrift.report.figures import by_model
from kvdrift.report.numbers import decodes, headline_quantities, quantity_header
from kvdrift.report.page_model import Estimate, Markup, Number, Section, Table, Text

NOTE = ('<p class="note">One row per action; each cell is the estimate over its interval '
        "[lo, hi]. "
        "R, O<sub>H</sub>, E<sub>H</sub>, &Pi;<sub>H</sub>, F, S<sub>.99</sub> are "
        "percentages of generated positions, P(&tau; &le; H) of trajectories, "
        "C<sub>H</sub> of post-divergence positions; R &minus; F and B(a) are percentage "
        "points; mean entry time is E[&tau; | &tau; &le; H] in steps.</p>")
MEMORY_NOTE = ('<p class="note">kv_fraction: the size of Q\'s prompt cache (entries kept '
               "&times; bits, scales and zero points included) over the full cache in the "
               "model's dtype, and kv_bytes that size, each a mean over the documents "
               "(strata equally weighted); &ldquo;&mdash;&rdquo; where the records do not "
               "tell it.</p>")
GENERATION_NOTE = ('<p class="note">kv_fraction over H: Q\'s whole cache (prompt and generated '
                   "entries) averaged over positions 1..H, over the full cache's averaged the "
                   "same way: what a decoding-time press bounds, which the prompt cache's "
                   "kv_fraction does not see. The entries a decoding-time press evicts are "
                   "derived from its target and interval (every interval-th generated token, "
                   "down to target entries per KV head once more are live).</p>")
SWRB_NOTE = ('<p class="note">Under SWRB, C<sub>H</sub> = &Pi;<sub>H</sub>/E<sub>H</sub> '
             "is a ratio of two unbiased estimates, so it and its interval can leave "
             "[0, 1] (e.g. above 100%) in a finite sample; this is sampling noise, not a "
             "bug. analysis.json keeps the raw value.</p>")


def headline(analysis: StudyAnalysis) -> Section:
    """One table per model: an action a row, a headline quantity a column (with the cache
    size where the records tell it, and B_strict where it was measured)."""
    H = analysis.meta.horizon
    actions = analysis.actions
    quantities = headline_quantities()
    if any(a.scalars.get("B_strict") is not None and a.scalars["B_strict"].defined
           for a in actions):
        quantities.append(quantity("B_strict"))
    memory = any(math.isfinite(a.kv_fraction) for a in actions)
    over_h = decodes(analysis)
    headers = ("action", "documents", *(("kv_fraction", "kv_bytes (KiB)") if memory else ()),
               *(("kv_fraction over H",) if over_h else ()),
               *(quantity_header(q, H) for q in quantities))
    notes = [NOTE]
    if memory:
        notes.append(MEMORY_NOTE)
    if over_h:
        notes.append(GENERATION_NOTE)
    if not analysis.meta.records.complete_branches:  # SWRB
        notes.append(SWRB_NOTE)
    if not actions:
        notes.append("<p>No actions in this analysis.</p>")
    lines = [(Markup(n),) for n in notes]
    for model, rows in by_model(actions).items():
        body = tuple(
            (Text(a.action), Text(a.documents),
             *((Number(a.kv_fraction, digits=3), Number(a.kv_bytes, 1 / 1024, 1))
               if memory else ()),
             *((Number(a.kv_fraction_generation, digits=3),) if over_h else ()),
             *(Estimate.of(q, a.scalars.get(q.name)) for q in quantities))
            for a in rows)
        lines += [(Markup(f"<h3>{escape(model)}</h3>"),), (Table(headers, body),)]
    return Section("Headline numbers", "headline", tuple(lines))
