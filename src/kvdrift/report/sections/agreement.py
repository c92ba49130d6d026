"""The report's "Local agreement within branches": in the branch cohort, how often the
branches agree again for a run of positions, and disagree again after."""

from __future__ import annotations

from kvdrift.analysis.results import CohortSupport, StudyAnalysis
from kvdrift.report.numbers import MISSING
from kvdrift.report.page_model import Estimate, Markup, Section, Table, Text

TITLE, ANCHOR = "Local agreement within branches", "agreement"


def local_agreement(analysis: StudyAnalysis) -> Section:
    """One row per action: cohort support, then the two shares with their intervals."""
    entries = analysis.local_agreement
    support = {(s.model, s.action): s for s in analysis.cohort_support}
    if not entries and not support:
        return Section(TITLE, ANCHOR, ((Markup(
            "<p>No local agreement in this analysis (it needs complete rollouts "
            "and H &ge; 4).</p>"),),))
    max_entry = (entries[0] if entries else next(iter(support.values()))).max_entry
    run = entries[0].run_length if entries else "?"
    headers = ("model", "action", "cohort documents", "cohort trajectories",
               f"&ge; {run} consecutive agreements (%)",
               "mismatch after an agreement (%)")
    rows = []
    for e in entries:
        s = support.get((e.model, e.action))
        rows.append((Text(e.model), Text(e.action), *_support_cells(s),
                     Estimate(e.agree_run, digits=1), Estimate(e.relapse, digits=1)))
    note = (f'<p class="note">Branch cohort: trajectories that diverged by step {max_entry} '
            f"(&tau; &le; {max_entry}, the lag profile's cohort). Among them, the share "
            f"with at least {run} consecutive agreements X<sub>t</sub> = Y<sub>t</sub> after "
            "&tau; and before either branch's first EOS, and the share with a pre-EOS mismatch "
            "after an earlier post-divergence agreement; the whole cohort is the denominator. "
            "Cohort support: documents with at least one cohort trajectory, and cohort "
            "trajectories, out of all.</p>")
    return Section(TITLE, ANCHOR, ((Markup(note), Table(headers, tuple(rows), numeric_from=2)),))


def _support_cells(s: CohortSupport | None) -> tuple[Markup, Markup]:
    """``"n of total"`` cohort documents and trajectories (None: no support recorded)."""
    if s is None:
        return (Markup(f"{MISSING} of {MISSING}"),) * 2
    return (Markup(f"{s.documents} of {s.documents_total}"),
            Markup(f"{s.trajectories} of {s.trajectories_total}"))
