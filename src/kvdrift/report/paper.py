"""The paper's tables, in the paper's layout, from a study analysis (and a prediction).

Table 1: the saturation ``S_.99`` per action with the endpoint family's interval when the
study prespecified ``S99(action)`` (else the pointwise one, labelled so), and the branch
cohort's support (documents and paths with ``tau <= H/2``). Table 2: the two clocks
(:mod:`kvdrift.analysis.clocks`). Study-1 headline: ``P(tau <= 32)`` per action, the
mismatch gaps ``Delta R`` and their exposure shares. Table 4: the prediction's supporting
contrasts (:func:`prediction_table`, for ``kvdrift predict --report``). Figure 7 is
:func:`kvdrift.report.figures.plot_paper_figure7`.
"""

from __future__ import annotations

import math

from kvdrift import output
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.results import ActionResult, StudyAnalysis
from kvdrift.report.numbers import MISSING
from kvdrift.report.page import render_blocks, standalone
from kvdrift.report.page_model import Block, Difference, Estimate, Markup, Section, Table, Text

HEADLINE_T = 32  # the paper's P(tau <= 32)


def _s99(analysis: StudyAnalysis, a: ActionResult) -> tuple[Interval | None, str]:
    """S_.99 of an action: the endpoint family's interval when the study prespecified it."""
    for e in analysis.endpoints:
        if e.model == a.model and e.name.replace(" ", "") == f"S99({a.action})":
            return e.interval, f"endpoint family, {100 * (1 - e.alpha):.4g}%"
    iv = a.scalars.get("S99")
    return iv, "pointwise" if iv is None else f"pointwise {100 * iv.level:.4g}%"


def table1(analysis: StudyAnalysis) -> tuple[Block, ...]:
    """S_.99 with the endpoint-family interval, and cohort documents / paths."""
    support = {(c.model, c.action): c for c in analysis.cohort_support}
    rows = []
    for a in analysis.actions:
        iv, level = _s99(analysis, a)
        c = support.get((a.model, a.action))
        docs = MISSING if c is None else f"{c.documents}/{c.documents_total}"
        paths = MISSING if c is None else f"{c.trajectories}/{c.trajectories_total}"
        rows.append((Text(a.model), Text(a.action), Estimate(iv), Text(level),
                     Markup(docs), Markup(paths)))
    entry = analysis.lags.max_entry if analysis.lags is not None else None
    cohort = f"&tau; &le; {entry}" if entry else "cohort"
    return (Markup("<h3>Table 1: saturation and branch-cohort support</h3>"),
            Table(("model", "action", "S<sub>.99</sub> (%)", "interval",
                   f"cohort documents ({cohort})", f"cohort paths ({cohort})"), tuple(rows), 2))


def table2(analysis: StudyAnalysis) -> tuple[Block, ...]:
    """The two clocks: generation-clock gaps per block and Delta g beside B(a), B(b)."""
    if not analysis.two_clocks:
        return (Markup("<h3>Table 2: the two clocks</h3><p>Not available (needs complete "
                       "rollouts and H &ge; 4).</p>"),)
    blocks = analysis.two_clocks[0].blocks
    headers = ("model", "stratum", "contrast (a &minus; b)",
               *(f"g t {s}&ndash;{e} (pp)" for s, e in blocks),
               "&Delta;g = g<sub>last</sub> &minus; g<sub>first</sub> (pp)", "B(a) (pp)",
               "B(b) (pp)")
    rows = tuple((Text(x.model), Text(x.stratum), Difference(x.a, x.b),
                  *(Estimate(g, signed=True) for g in x.g),
                  Estimate(x.delta_g, signed=True), Estimate(x.B_a, signed=True),
                  Estimate(x.B_b, signed=True)) for x in analysis.two_clocks)
    return (Markup("<h3>Table 2: the two clocks</h3><p class=\"note\">Generation clock: "
                   "g<sub>J</sub> = mean over positions t in block J of E[&delta;<sub>t</sub>](a) "
                   "&minus; E[&delta;<sub>t</sub>](b); branch clock: B = late &minus; early "
                   "branch TV after the first divergence. Pointwise intervals (paired document "
                   "bootstrap).</p>"),
            Table(headers, rows, 3))


def headline(analysis: StudyAnalysis) -> tuple[Block, ...]:
    """P(tau <= 32) per action; Delta R (token mismatch) with its exposure share."""
    t = min(HEADLINE_T, analysis.meta.horizon)
    rows = []
    for a in analysis.actions:
        cdf = a.curves.get("timing_cdf")
        iv = None
        if cdf is not None and len(cdf.estimate) >= t:
            iv = Interval(cdf.estimate[t - 1], cdf.lo[t - 1], cdf.hi[t - 1], cdf.level)
        rows.append((Text(a.model), Text(a.action), Estimate(iv)))
    gaps = tuple((Text(c.model), Difference(c.a, c.b),
                  Estimate(c.terms.get("dR"), signed=True),
                  Estimate(c.terms.get("dR_tv"), signed=True),
                  Estimate(c.terms.get("exposure_share"), digits=1)) for c in analysis.contrasts)
    return (Markup("<h3>Study 1 headline</h3>"),
            Table(("model", "action", f"P(&tau; &le; {t}) (%)"), tuple(rows), 2),
            Table(("model", "contrast (a &minus; b)", "mismatch gap &Delta;R (pp)",
                   "rollout-TV gap &Delta;R<sub>TV</sub> (pp)", "exposure share (%)"), gaps, 2))


def paper_section(analysis: StudyAnalysis) -> Section:
    """The report's "The paper's tables" section (Figure 7 is among the figures)."""
    note = ('<p class="note">In the layout of the paper (arXiv 2609.16617): Tables 1 and 2, '
            "the study-1 headline, and Figure 7 (see Figures). Table 4 comes from "
            "<code>kvdrift predict --report</code>, which needs a development and an "
            "evaluation run.</p>")
    return Section("The paper's tables", "paper", ((
        Markup(note), *headline(analysis), *table1(analysis), *table2(analysis)),))


def _pp(iv: Interval) -> Markup:
    if iv is None or not math.isfinite(iv.estimate):
        return Markup(MISSING)
    return Markup(f"{100 * iv.estimate:+.2f} [{100 * iv.lo:+.2f}, {100 * iv.hi:+.2f}]")


def prediction_table(result) -> tuple[Block, ...]:
    """Table 4 from a :class:`~kvdrift.analysis.predict.PredictionResult`."""
    rows = []
    for m in result.models:
        for o in m.observations:
            rows.append((Text(m.model), Text(o.label), Text(o.selected),
                         *(_pp(iv) for iv in o.supporting.values()),
                         _pp(o.error), Text(o.decision)))
    what = "rollout-TV" if result.target == "tv" else "token-mismatch"
    level = f"{100 * (1 - result.alpha):g}%"
    headers = ("model", "observation", "selected", f"full-H {what} gap (pp, {level})",
               f"observed gap (pp, {level})", f"full minus observed (pp, {level})",
               f"error (pp, {100 * (1 - result.alpha_adjusted):.4g}%)", "decision")
    return (Markup("<h3>Table 4: aggregate prediction on evaluation documents</h3>"),
            Table(headers, tuple(rows), 3))


def write_prediction_report(result, path) -> None:
    """An HTML page with Table 4 (``kvdrift predict --report PATH``)."""
    html = standalone("kvdrift prediction (Table 4)", render_blocks(prediction_table(result)))
    output.write_file(path, html.encode("utf-8"))
