"""The report's "Task outcomes": each action's task accuracy under P and Q, the flips between
them, and how much the coupling narrows the comparison (overall and per stratum)."""

from __future__ import annotations

import math

from kvdrift.analysis.results import StudyAnalysis, TaskResult
from kvdrift.report.page_model import Cell, Estimate, Markup, Number, Section, Table, Text

TITLE, ANCHOR = "Task outcomes", "task"
HEADERS = ("scored documents", "accuracy P (%)", "accuracy Q (%)",
           "Q &minus; P (pp)", "lost: P right, Q wrong (%)", "gained: P wrong, Q right (%)",
           "SE coupled (pp)", "SE uncoupled (pp)", "variance gain")
NOTE = ('<p class="note">Each replicate\'s X (full cache, P) and Y (compressed, Q), decoded '
        "up to EOS, scored with the task's metric (RULER's string_match_all, or "
        "string_match_part for QA, final_answer for a task answered after a chain of steps: "
        "the number after its last &ldquo;Final answer:&rdquo;); documents without an "
        "expected answer are left out. "
        "Flips: P right and Q wrong, and the reverse (for graded scores, the positive "
        "parts of s<sub>X</sub> &minus; s<sub>Y</sub> and s<sub>Y</sub> &minus; "
        "s<sub>X</sub>), so Q &minus; P = gained &minus; lost. SE coupled: the standard "
        "error of Q &minus; P as measured; SE uncoupled: what two independent sets of K "
        "samples per document would give; variance gain: their squared ratio. Intervals: "
        "paired document bootstrap.</p>")


def task_outcomes(analysis: StudyAnalysis) -> Section:
    """One row per action, then one per stratum and action."""
    if not analysis.task:
        why = ("SWRB does not sample both complete texts from the start; run rollouts for them"
               if not analysis.meta.records.complete_branches else
               "no document has an expected answer, or the run could not decode text")
        return Section(TITLE, ANCHOR,
                       ((Markup(f"<p>No task outcomes in this analysis: {why}.</p>"),),))
    rows = tuple((Text(t.model), Text(t.action), *_cells(t)) for t in analysis.task)
    lines = [(Markup(NOTE),), (Table(("model", "action", *HEADERS), rows, numeric_from=2),)]
    strata = tuple((Text(st.model), Text(st.stratum), Text(t.action), *_cells(t))
                   for st in analysis.strata for t in st.task)
    if strata:
        lines += [(Markup("<h3>Per stratum</h3>"),),
                  (Table(("model", "stratum", "action", *HEADERS), strata, numeric_from=3),)]
    return Section(TITLE, ANCHOR, tuple(lines))


def _cells(t: TaskResult) -> tuple[Cell, ...]:
    """The cells of one task result, in the order of :data:`HEADERS`."""
    s = t.stats
    c, u = s["se_coupled"].estimate, s["se_uncoupled"].estimate
    gain = (u / c) ** 2 if c > 0 and math.isfinite(u) else math.nan
    return (Text(t.documents),
            *(Estimate(s[k], digits=1) for k in ("acc_p", "acc_q")),
            Estimate(s["diff"], digits=1, signed=True),
            *(Estimate(s[k], digits=1) for k in ("flips_lost", "flips_gained",
                                                 "se_coupled", "se_uncoupled")),
            Number(gain, digits=1, suffix="&times;"))
