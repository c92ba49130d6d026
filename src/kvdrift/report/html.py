"""The study report as one self-contained HTML file (figures embedded as base64 PNGs).

``write_report(analysis, out_dir)`` writes::

    out_dir/report.html      the report; can be mailed on its own
    out_dir/analysis.json    every number of the analysis, strict JSON (NaN -> null)
    out_dir/figures/*.png    the figures, also embedded in the HTML
"""

from __future__ import annotations

import base64
import json
import math
from html import escape
from pathlib import Path

from kvdrift.analysis.interval import Interval
from kvdrift.analysis.registry import Quantity, quantity
from kvdrift.analysis.results import ContrastResult, StudyAnalysis
from kvdrift.json_values import to_json_safe
from kvdrift.report import page
from kvdrift.report.figures import FIGURES, by_model
from kvdrift.report.numbers import MISSING, headline_quantities, number_text
from kvdrift.report.paper import paper_section

DEFAULT_TITLE = "KV-cache compression: divergence timing and cumulative disagreement"


GLOSSARY = (
    ("&tau;", "first generated position at which the reference branch X and the intervention "
              "branch Y emit different tokens (&infin; if they never do within H)."),
    ("&delta;<sub>t</sub>", "branch-aligned TV at position t: total-variation distance between "
                            "the full model's next-token distribution on the reference branch's "
                            "history and the evicted model's on the intervention branch's own "
                            "history; E[&delta;<sub>t</sub>] is the chance the branches disagree "
                            "at t."),
    ("P(&tau; &le; H)", "share of trajectories that diverge within the horizon; mean entry time "
                        "is E[&tau; | &tau; &le; H] in steps."),
    ("R", "risk: expected fraction of the H positions at which the two branches disagree, "
          "R = O<sub>H</sub> + &Pi;<sub>H</sub> "
          "= O<sub>H</sub> + E<sub>H</sub>&middot;C<sub>H</sub>."),
    ("O<sub>H</sub>", "first-mismatch contribution P(&tau; &le; H)/H."),
    ("E<sub>H</sub>", "post-divergence exposure E[(H &minus; &tau;)<sub>+</sub>]/H: the share of "
                      "positions that come after the first divergence."),
    ("&Pi;<sub>H</sub>", "post-divergence occupation: share of positions after &tau; at which the "
                         "branches disagree."),
    ("C<sub>H</sub>", "post-divergence mismatch rate &Pi;<sub>H</sub>/E<sub>H</sub>."),
    ("F", "fixed-history risk: mean TV between the full and the evicted model when both follow the "
          "reference branch's history; R<sub>TV</sub> &minus; F (the paper's R &minus; F) is the "
          "part of the risk due to the branches' histories drifting apart."),
    ("R<sub>TV</sub>", "rollout-TV risk (1/H) &sum;<sub>t</sub> E[&delta;<sub>t</sub>]: the "
                       "same expectation as R (P(I<sub>t</sub> = 1 | history) = "
                       "&delta;<sub>t</sub>) and, per replicate, never a larger variance. The "
                       "paper's R &minus; F, EOS split and prediction target use it; the "
                       "decomposition R = O + E C stays on token mismatch."),
    ("S<sub>.99</sub>", "saturation: mean over positions of P(&delta;<sub>t</sub> &gt; 0.99), "
                        "the share of positions where the two branches' next-token "
                        "distributions are almost disjoint."),
    ("B(a)", "lag-profile slope: mean branch-aligned TV in the late lag window minus that in the "
             "early window, among trajectories that diverged early (pp); positive means the "
             "branches keep drifting apart after the first divergence."),
    ("G<sub>r</sub>", "EOS split of R &minus; F: (1/H) E[&sum; (&delta;<sub>t</sub> &minus; "
                      "f<sub>t</sub>)] over the positions of category r (0 pre-EOS, 1 first EOS, "
                      "2 one branch absorbed, 3 both absorbed); the EOS share of a contrast is "
                      "(&Delta;G<sub>1</sub> + &Delta;G<sub>2</sub> + &Delta;G<sub>3</sub>) / "
                      "&Delta;(R &minus; F)."),
    ("local agreement", "within the branch cohort (early divergers), the share of trajectories "
                        "whose branches agree again for a run of consecutive pre-EOS positions, "
                        "and the share that disagree again after such an agreement."),
    ("R<sub>L</sub>", "observed contribution to R when each divergent trajectory is followed for "
                      "only L positions from &tau; (R<sub>1</sub> = O<sub>H</sub>, "
                      "R<sub>H</sub> = R)."),
    ("B<sub>L</sub>", "unobserved capacity: the most that the unobserved positions could add; "
                      "the sharp set of R is [R<sub>L</sub>, R<sub>L</sub> + B<sub>L</sub>], its "
                      "minimax point R<sub>L</sub> + B<sub>L</sub>/2."),
)


def write_report(analysis: StudyAnalysis, out_dir: str | Path, *,
                 title: str = DEFAULT_TITLE) -> Path:
    """Write ``report.html``, ``analysis.json`` and ``figures/*.png`` into ``out_dir``.

    Parameters
    ----------
    analysis : StudyAnalysis
        A study analysis; NaN marks quantities that were not measured. ``analysis.json`` is
        its ``to_json()``, with NaN written as null.
    out_dir : path
        Created if needed. Figures of an earlier report that this analysis cannot draw are
        removed, so ``figures/`` always matches the HTML.

    Returns
    -------
    Path of ``report.html``.
    """
    if not isinstance(analysis, StudyAnalysis):
        raise TypeError("analysis must be a StudyAnalysis (from kvdrift.analysis.study."
                        f"analyze), got {type(analysis).__name__}")
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)

    (out_dir / "analysis.json").write_text(
        json.dumps(to_json_safe(analysis.to_json()), indent=1, allow_nan=False) + "\n",
        encoding="utf-8")

    figures = []
    for figure in FIGURES:
        target = fig_dir / f"{figure.name}.png"
        target.unlink(missing_ok=True)
        drawn = figure.draw(analysis, target)
        if drawn is not None:
            figures.append((figure, Path(drawn)))


    body = "\n".join([
        _what_was_run(analysis),
        _headline(analysis),
        paper_section(analysis),
        _contrasts(analysis),
        _endpoints(analysis),
        _bounds(analysis),
        _eos_split(analysis),
        _local_agreement(analysis),
        _task_outcomes(analysis),
        _readings(analysis),
        _strata(analysis),
        _figures(figures),
        _glossary(),
    ])
    path = out_dir / "report.html"
    path.write_text(page.PAGE.substitute(title=escape(title), css=page.CSS, body=body),
                    encoding="utf-8")
    return path


# ---------------------------------------------------------------- building blocks


def _quantity_cell(q: Quantity, interval: Interval | None) -> str:
    return page.interval_cell(interval, q.scale, q.digits, signed=q.unit == "pp")



def _unique(values) -> list[str]:
    return list(dict.fromkeys(str(v) for v in values))


def _meta_value(value, digits: int | None = None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    if digits is not None and isinstance(value, float):
        return number_text(value, digits=digits)
    return escape(str(value))


def _what_was_run(analysis: StudyAnalysis) -> str:
    meta = analysis.meta
    actions = analysis.actions
    docs = meta.documents
    if docs:
        total = sum(docs.values())
        doc_text = ", ".join(f"{escape(str(k))}: {_meta_value(v)}" for k, v in docs.items())
        doc_text += f" (total {total}; strata weigh equally)"
    else:
        doc_text = MISSING
    temperature = meta.temperature
    temp_text = _meta_value(temperature)
    if temperature == 0:
        temp_text += " (greedy)"
    version_text = ", ".join(f"{escape(str(k))} {escape(str(v))}"
                             for k, v in meta.versions.items())
    estimator = meta.estimator
    estimator_text = {
        "rollout": "complete coupled rollouts",
        "swrb": "survival-weighted residual branching (SWRB)",
    }.get(estimator, estimator)
    items = [
        ("Models", escape(", ".join(_unique(a.model for a in actions))) or MISSING),
        ("Actions", escape(", ".join(_unique(a.action for a in actions))) or MISSING),
        ("Documents per stratum", doc_text),
        ("Replicates K", _meta_value(meta.replicates)),
        ("Horizon H", f"{_meta_value(meta.horizon)} generated positions"),
        ("Temperature", temp_text),
        ("Estimator", escape(estimator_text)),
        ("Bootstrap draws", f"{_meta_value(meta.bootstrap)} (documents resampled within "
                            "strata, paired across actions)"),
        ("&alpha;", f"{_meta_value(meta.alpha)} (intervals at level 1 &minus; &alpha; "
                    "unless stated)"),
        ("Package versions", version_text or MISSING),
    ]
    rows = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    config = meta.config
    details = ""
    if config:
        text = json.dumps(to_json_safe(config), indent=2, sort_keys=True)
        details = ("<details><summary>Study configuration</summary>"
                   f"<pre>{escape(text)}</pre></details>")
    notes = "".join(f"<li>{escape(n)}</li>" for n in meta.notes)
    notes = f'<p><strong>Notes</strong></p><ul class="notes">{notes}</ul>' if notes else ""
    return page.section("What was run", "run", f'<dl class="meta">{rows}</dl>\n{notes}{details}')


def _headline(analysis: StudyAnalysis) -> str:
    H = analysis.meta.horizon
    actions = analysis.actions
    quantities = headline_quantities()
    if any(a.scalars.get("B_strict") is not None and a.scalars["B_strict"].defined
           for a in actions):
        quantities.append(quantity("B_strict"))
    memory = any(math.isfinite(a.kv_fraction) for a in actions)
    headers = ["action", "documents"] + (
        ["kv_fraction", "kv_bytes (KiB)"] if memory else []) + [
        f"{q.html.format(H=H)} ({q.unit})" for q in quantities]
    parts = ['<p class="note">One row per action; each cell is the estimate over its interval '
             "[lo, hi]. "
             "R, O<sub>H</sub>, E<sub>H</sub>, &Pi;<sub>H</sub>, F, S<sub>.99</sub> are "
             "percentages of generated positions, P(&tau; &le; H) of trajectories, "
             "C<sub>H</sub> of post-divergence positions; R &minus; F and B(a) are percentage "
             "points; mean entry time is E[&tau; | &tau; &le; H] in steps.</p>"]
    if memory:
        parts.append('<p class="note">kv_fraction: the size of Q\'s prompt cache (entries kept '
                     "&times; bits, scales and zero points included) over the full cache in the "
                     "model's dtype, and kv_bytes that size, each a mean over the documents "
                     "(strata equally weighted); &ldquo;&mdash;&rdquo; where the records do not "
                     "tell it.</p>")
    if not analysis.meta.records.complete_branches:  # SWRB
        parts.append('<p class="note">Under SWRB, C<sub>H</sub> = &Pi;<sub>H</sub>/E<sub>H</sub> '
                     "is a ratio of two unbiased estimates, so it and its interval can leave "
                     "[0, 1] (e.g. above 100%) in a finite sample; this is sampling noise, not a "
                     "bug. analysis.json keeps the raw value.</p>")
    if not actions:
        parts.append("<p>No actions in this analysis.</p>")
    for model, rows in by_model(actions).items():
        body = []
        for a in rows:
            body.append([escape(a.action), _meta_value(a.documents)]
                        + ([number_text(a.kv_fraction, digits=3),
                            number_text(a.kv_bytes, 1 / 1024, 1)] if memory else [])
                        + [_quantity_cell(q, a.scalars.get(q.name)) for q in quantities])
        parts.append(f"<h3>{escape(model)}</h3>")
        parts.append(page.table(headers, body))
    return page.section("Headline numbers", "headline", "\n".join(parts))


CONTRAST_HEADERS = ["&Delta;R (pp)", "occurrence &Delta;O (pp)",
                    "exposure &Delta;E&middot;C&#772; (pp)", "rate &Delta;C&middot;E&#772; (pp)",
                    "exposure share (%)"]


def _contrast_name(c) -> str:
    """``b &minus; a`` of a contrast (:class:`ContrastResult` or an EOS contrast)."""
    return f"{escape(c.b)} &minus; {escape(c.a)}"


def _contrast_cells(c: ContrastResult) -> list[str]:
    """The decomposition's cells of one contrast, in the order of :data:`CONTRAST_HEADERS`."""
    t = c.terms
    return [page.interval_cell(t.get("dR"), signed=True),
            page.interval_cell(t.get("occurrence_term"), signed=True),
            page.interval_cell(t.get("exposure_term"), signed=True),
            page.interval_cell(t.get("rate_term"), signed=True),
            page.interval_cell(t.get("exposure_share"), digits=1)]


def _contrasts(analysis: StudyAnalysis) -> str:
    contrasts = analysis.contrasts
    if not contrasts:
        return page.section("Contrasts", "contrasts", "<p>No contrasts in this analysis.</p>")
    headers = ["model", "contrast (b &minus; a)"] + CONTRAST_HEADERS
    rows = [[escape(c.model), _contrast_name(c)] + _contrast_cells(c) for c in contrasts]
    note = ('<p class="note">&Delta;R = R<sub>b</sub> &minus; R<sub>a</sub> splits exactly into '
            "&Delta;O + &Delta;E&middot;C&#772; + &Delta;C&middot;E&#772;, where C&#772; and "
            "E&#772; are the midpoints of the two actions' values; exposure share = "
            "&Delta;E&middot;C&#772; / &Delta;R, "
            "the part of the gap due to diverging earlier rather than disagreeing more "
            "after divergence.</p>")
    labelled = [(escape(c.model), c) for c in contrasts]
    return page.section("Contrasts", "contrasts", note + page.table(headers, rows, numeric_from=2)
                    + _block_gaps(labelled, "model"))


def _block_gaps(labelled: list[tuple[str, ContrastResult]], label: str) -> str:
    """The generation clock: where in the generation each contrast's gap in E[delta_t] sits.

    ``labelled`` pairs each contrast with its first cell (already-escaped HTML) headed ``label``.
    """
    with_gaps = [(name, c) for name, c in labelled if c.block_gap is not None]
    if not with_gaps:
        return ""
    blocks = with_gaps[0][1].block_gap.blocks or ()
    headers = [label, "contrast (b &minus; a)"] + [f"t {lo}&ndash;{hi} (pp)" for lo, hi in blocks]
    rows = []
    for name, c in with_gaps:
        g = c.block_gap
        cells = [page.interval_cell(Interval(e, lo, hi, g.level), signed=True)
                 for e, lo, hi in zip(g.estimate, g.lo, g.hi, strict=True)]
        rows.append([name, _contrast_name(c)] + cells)
    note = ('<p class="note">Generation clock: the gap in mean branch TV E[&delta;<sub>t</sub>] '
            "between the two actions, averaged over blocks of generated positions.</p>")
    return note + page.table(headers, rows, numeric_from=2)


def _endpoints(analysis: StudyAnalysis) -> str:
    endpoints = analysis.endpoints
    if not endpoints:
        return page.section("Prespecified endpoints", "endpoints",
                        "<p>No prespecified endpoints in this analysis.</p>")
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
        name = e.name
        unit = "pp" if name.startswith("B") or "−" in name or " - " in name else "%"
        rows.append([escape(e.model), escape(name),
                     page.interval_cell(e.interval, signed=unit == "pp", unit=f" {unit}"),
                     number_text(e.alpha, digits=5)])
    headers = ["model", "endpoint", "estimate [family-adjusted interval]",
               "&alpha;<sub>endpoint</sub>"]
    return page.section("Prespecified endpoints", "endpoints",
                    f'<p class="note">{note} B(&middot;) endpoints are in percentage points, '
                    "S<sub>.99</sub> endpoints in percent of positions.</p>"
                    + page.table(headers, rows, numeric_from=2))


def _bounds(analysis: StudyAnalysis) -> str:
    headers = ["model", "action", "depth L", "R<sub>L</sub> (%)", "B<sub>L</sub> (%)",
               "sharp interval [R<sub>L</sub>, R<sub>L</sub> + B<sub>L</sub>] (%)",
               "minimax R<sub>L</sub> + B<sub>L</sub>/2 (%)", "Hoeffding enclosure (%)"]
    rows, starts = [], set()
    for a in analysis.actions:
        for i, b in enumerate(sorted(a.bounds, key=lambda b: b.L)):
            if i == 0:
                starts.add(len(rows))
            rows.append([escape(a.model) if i == 0 else "",
                         escape(a.action) if i == 0 else "",
                         _meta_value(b.L),
                         number_text(b.R_L, 100),
                         number_text(b.B_L, 100),
                         _pair(b.sharp.lo, b.sharp.hi),
                         number_text(b.sharp.minimax, 100),
                         _pair(b.hoeffding.lo, b.hoeffding.hi)])
    if not rows:
        table = "<p>No finite-window bounds in this analysis.</p>"
    else:
        table = page.table(headers, rows, numeric_from=2, group_starts=starts)
    note = ('<p class="note">If each divergent trajectory is followed for only L positions from '
            "&tau;, every kernel pair consistent with what was observed has a risk in the sharp "
            "interval; the minimax point has worst-case error B<sub>L</sub>/2. The Hoeffding "
            "enclosure contains the full-horizon risk with probability at least 1 &minus; "
            "&alpha; over the sampled documents.</p>")
    return page.section("Finite-window bounds", "bounds",
                    note + table + "\n<h3>Certified orderings</h3>\n" + _orders(analysis))


def _pair(lo: float, hi: float) -> str:
    lo_text, hi_text = number_text(lo, 100), number_text(hi, 100)
    if lo_text == MISSING and hi_text == MISSING:
        return MISSING
    return f"[{lo_text}, {hi_text}]"


def _orders(analysis: StudyAnalysis) -> str:
    orders = analysis.certified_order
    intro = ('<p class="note"><em>a</em> is certainly better than <em>b</em> at depth L when the '
             "upper end of a's sharp interval is below the lower end of b's: then every kernel "
             "pair consistent with the observed window gives a lower risk to a.</p>")
    if not orders:
        return intro + "<p>No ordering is certified at any observed depth.</p>"
    items = []
    for model, rows in by_model(orders).items():
        for o in sorted(rows, key=lambda o: o.L):
            items.append(f"<li>{escape(model)}, L = {_meta_value(o.L)}: "
                         f"<strong>{escape(o.better)}</strong> certainly better "
                         f"than <strong>{escape(o.worse)}</strong></li>")
    return intro + f'<ul class="orders">{"".join(items)}</ul>'


def _eos_split(analysis: StudyAnalysis) -> str:
    rows, starts, categories = [], set(), None
    for a in analysis.actions:
        split = a.eos_split
        if split is None:
            continue
        cats = list(split.categories)
        categories = categories or cats  # the schema fixes the four categories; first wins
        starts.add(len(rows))
        for i, (key, label) in enumerate((("R", "R"), ("F", "F"), ("R_minus_F", "R &minus; F"))):
            values = getattr(split, key)
            finite = [v for v in values if math.isfinite(v)]
            total = sum(finite) if finite else math.nan
            cells = [number_text(v, 100) for v in values] + [MISSING] * (len(cats) - len(values))
            total_cell = number_text(total, 100)
            if key == "R_minus_F" and split.G:  # G_r = (R - F)_r with intervals
                cells = [page.interval_cell(g, signed=True) for g in split.G]
                total_cell = page.interval_cell(split.G_total, signed=True)
            rows.append([escape(a.model) if i == 0 else "",
                         escape(a.action) if i == 0 else "",
                         label] + cells + [total_cell])
    if not rows:
        return page.section("EOS split", "eos",
                        "<p>No EOS split in this analysis (it needs complete rollouts).</p>")
    headers = (["model", "action", "quantity"] + [escape(c) + " (pp)" for c in categories]
               + ["sum (%)"])
    note = ('<p class="note">Each generated position is classed by the two branches\' end-of-'
            "sequence state (neither has emitted EOS; one emits its first EOS there; one branch "
            "already absorbed; both absorbed). Cells are that class's contribution to R, F and "
            "R &minus; F in percentage points of positions; the sum is the quantity itself. "
            "R here is the rollout-TV risk R<sub>TV</sub> = (1/H) &sum;<sub>t</sub> "
            "E[&delta;<sub>t</sub>], equal in expectation to the headline R, and the R &minus; F "
            "row sums exactly to the headline R<sub>TV</sub> &minus; F. The R &minus; F row, "
            "G<sub>r</sub>, has bootstrap intervals.</p>")
    return page.section("EOS split", "eos",
                    note + page.table(headers, rows, numeric_from=3, group_starts=starts)
                    + _eos_contrasts(analysis, categories))


def _eos_contrasts(analysis: StudyAnalysis, categories: list[str]) -> str:
    contrasts = analysis.eos_contrasts
    if not contrasts:
        return ""
    headers = (["model", "contrast (b &minus; a)"]
               + [f"&Delta;G<sub>{r}</sub> {escape(c)} (pp)" for r, c in enumerate(categories)]
               + ["&Delta;(R &minus; F) (pp)", "EOS share (%)"])
    rows = [[escape(c.model), _contrast_name(c)]
            + [page.interval_cell(g, signed=True) for g in c.dG]
            + [page.interval_cell(c.dR_minus_F, signed=True),
               page.interval_cell(c.eos_share, digits=1)]
            for c in contrasts]
    note = ('<h3>EOS contrasts</h3><p class="note">&Delta;(R &minus; F) = &sum;<sub>r</sub> '
            "&Delta;G<sub>r</sub> between two actions (b &minus; a); &Delta;G<sub>0</sub> is the "
            "pre-EOS component and the EOS share is (&Delta;G<sub>1</sub> + &Delta;G<sub>2</sub> "
            "+ &Delta;G<sub>3</sub>) / &Delta;(R &minus; F). Intervals: paired document "
            "bootstrap.</p>")
    return note + page.table(headers, rows, numeric_from=2)


def _local_agreement(analysis: StudyAnalysis) -> str:
    entries = analysis.local_agreement
    support = {(s.model, s.action): s for s in analysis.cohort_support}
    if not entries and not support:
        return page.section("Local agreement within branches", "agreement",
                        "<p>No local agreement in this analysis (it needs complete rollouts "
                        "and H &ge; 4).</p>")
    max_entry = (entries[0] if entries else next(iter(support.values()))).max_entry
    run = entries[0].run_length if entries else "?"
    headers = ["model", "action", "cohort documents", "cohort trajectories",
               f"&ge; {run} consecutive agreements (%)",
               "mismatch after an agreement (%)"]
    rows = []
    for e in entries:
        s = support.get((e.model, e.action))
        rows.append([escape(e.model), escape(e.action),
                     _of(s, "documents"), _of(s, "trajectories"),
                     page.interval_cell(e.agree_run, digits=1),
                     page.interval_cell(e.relapse, digits=1)])
    note = (f'<p class="note">Branch cohort: trajectories that diverged by step {max_entry} '
            f"(&tau; &le; {max_entry}, the lag profile's cohort). Among them, the share "
            f"with at least {run} consecutive agreements X<sub>t</sub> = Y<sub>t</sub> after "
            "&tau; and before either branch's first EOS, and the share with a pre-EOS mismatch "
            "after an earlier post-divergence agreement; the whole cohort is the denominator. "
            "Cohort support: documents with at least one cohort trajectory, and cohort "
            "trajectories, out of all.</p>")
    return page.section("Local agreement within branches", "agreement",
                    note + page.table(headers, rows, numeric_from=2))


TASK_HEADERS = ["scored documents", "accuracy P (%)", "accuracy Q (%)",
                "Q &minus; P (pp)", "lost: P right, Q wrong (%)", "gained: P wrong, Q right (%)",
                "SE coupled (pp)", "SE uncoupled (pp)", "variance gain"]


def _task_cells(t) -> list[str]:
    s = t.stats
    c, u = s["se_coupled"].estimate, s["se_uncoupled"].estimate
    gain = f"{(u / c) ** 2:.1f}&times;" if c > 0 and math.isfinite(u) else MISSING
    return ([_meta_value(t.documents)]
            + [page.interval_cell(s[k], digits=1) for k in ("acc_p", "acc_q")]
            + [page.interval_cell(s["diff"], digits=1, signed=True)]
            + [page.interval_cell(s[k], digits=1) for k in ("flips_lost", "flips_gained",
                                                         "se_coupled", "se_uncoupled")]
            + [gain])


def _task_outcomes(analysis: StudyAnalysis) -> str:
    title, anchor = "Task outcomes", "task"
    if not analysis.task:
        why = ("SWRB does not sample both complete texts from the start; run rollouts for them"
               if not analysis.meta.records.complete_branches else
               "no document has an expected answer, or the run could not decode text")
        return page.section(title, anchor, f"<p>No task outcomes in this analysis: {why}.</p>")
    rows = [[escape(t.model), escape(t.action)] + _task_cells(t) for t in analysis.task]
    note = ('<p class="note">Each replicate\'s X (full cache, P) and Y (compressed, Q), decoded '
            "up to EOS, scored with the task's metric (RULER's string_match_all, or "
            "string_match_part for QA); documents without an expected answer are left out. "
            "Flips: P right and Q wrong, and the reverse (for graded scores, the positive "
            "parts of s<sub>X</sub> &minus; s<sub>Y</sub> and s<sub>Y</sub> &minus; "
            "s<sub>X</sub>), so Q &minus; P = gained &minus; lost. SE coupled: the standard "
            "error of Q &minus; P as measured; SE uncoupled: what two independent sets of K "
            "samples per document would give; variance gain: their squared ratio. Intervals: "
            "paired document bootstrap.</p>")
    parts = [note, page.table(["model", "action"] + TASK_HEADERS, rows, numeric_from=2)]
    strata = [(st, t) for st in analysis.strata for t in st.task]
    if strata:
        parts.append("<h3>Per stratum</h3>")
        parts.append(page.table(["model", "stratum", "action"] + TASK_HEADERS,
                            [[escape(st.model), escape(st.stratum), escape(t.action)]
                             + _task_cells(t) for st, t in strata], numeric_from=3))
    return page.section(title, anchor, "\n".join(parts))


def _readings(analysis: StudyAnalysis) -> str:
    """Teacher-forced and speculative numbers per action, then their contrasts b - a."""
    title, anchor = "Teacher-forced and speculative readings", "readings"
    if not analysis.speculative:
        return page.section(title, anchor, "<p>No readings along X in this analysis (they need "
                                       "complete rollouts).</p>")
    tf = {(x.model, x.action): x.numbers for x in analysis.teacher_forced}
    gammas = sorted(analysis.speculative[0].numbers.tokens_per_round)
    headers = (["model", "action", "mean KL (nats)", "top-1 agreement (%)", "mean &Delta;p (pp)",
                "PPL ratio", "acceptance (%)"]
               + [f"tokens / round, &gamma; = {g}" for g in gammas])
    rows = []
    for s in analysis.speculative:
        t = tf.get((s.model, s.action))
        rows.append([escape(s.model), escape(s.action),
                     page.interval_cell(t.kl if t else None, 1.0, 4),
                     page.interval_cell(t.top1 if t else None, digits=1),
                     page.interval_cell(t.dp if t else None, signed=True),
                     page.interval_cell(t.ppl_ratio if t else None, 1.0, 4),
                     page.interval_cell(s.numbers.acceptance, digits=1)]
                    + [page.interval_cell(s.numbers.tokens_per_round[g], 1.0, 2) for g in gammas])
    contrast_rows = []
    tfc = {(x.model, x.a, x.b): x.numbers for x in analysis.teacher_forced_contrasts}
    for c in analysis.speculative_contrasts:
        t = tfc.get((c.model, c.a, c.b))
        contrast_rows.append([escape(c.model), f"{escape(c.b)} &minus; {escape(c.a)}",
                              page.interval_cell(t.kl if t else None, 1.0, 4, signed=True),
                              page.interval_cell(t.top1 if t else None, digits=1, signed=True),
                              page.interval_cell(t.dp if t else None, signed=True),
                              page.interval_cell(t.ppl_ratio if t else None, 1.0, 4, signed=True),
                              page.interval_cell(c.numbers.acceptance, digits=1, signed=True)]
                             + [page.interval_cell(c.numbers.tokens_per_round[g], 1.0, 2,
                                               signed=True) for g in gammas])
    note = ('<p class="note">Along the reference path X, over positions up to X\'s first EOS: '
            "teacher-forced numbers as llama.cpp's <code>perplexity --kl-divergence</code> "
            "defines them (mean KL(P&nbsp;||&nbsp;Q), share of positions whose arg-maxes agree, "
            "mean q(X<sub>t</sub>) &minus; p(X<sub>t</sub>), PPL ratio exp(mean(log p &minus; "
            "log q))), and self-speculative decoding with the action's cache drafting for the "
            "full cache: per-token acceptance (1 &minus; F per generated token) and expected "
            "tokens per verification round for draft length &gamma;, exact given the "
            "acceptance probabilities along X. Per-stratum values and the first round's "
            "accepted-length distribution are in <code>analysis.json</code> "
            "(<code>teacher_forced</code>, <code>speculative</code>).</p>")
    body = note + page.table(headers, rows, numeric_from=2)
    if contrast_rows:
        body += ('<h3>Contrasts (b &minus; a)</h3>'
                 + page.table(["model", "contrast (b &minus; a)"] + headers[2:], contrast_rows,
                          numeric_from=2))
    return page.section(title, anchor, body)


def _of(support, key: str) -> str:
    """``"n of total"`` from a cohort-support result (None: no support recorded)."""
    if support is None:
        return f"{MISSING} of {MISSING}"
    return f"{getattr(support, key)} of {getattr(support, key + '_total')}"


def _stratum_tally(contrasts: list[ContrastResult]) -> str:
    """How many stratum contrasts have an exposure majority, and a &Delta;R interval off 0."""
    shares = [c.terms["exposure_share"].estimate for c in contrasts
              if "exposure_share" in c.terms]
    majority = sum(1 for x in shares if math.isfinite(x) and x > 0.5)
    separated = sum(1 for c in contrasts if "dR" in c.terms and c.terms["dR"].excludes_zero())
    n = len(contrasts)
    return (f'<p class="note">Exposure share above 50% in {majority} of {n} stratum contrasts; '
            f"&Delta;R interval excludes 0 in {separated} of {n}.</p>")


def _strata(analysis: StudyAnalysis) -> str:
    strata = analysis.strata
    if not strata:
        return page.section("Per stratum", "strata", "<p>No per-stratum results.</p>")
    H = analysis.meta.horizon
    parts = ['<p class="note">Every headline quantity and contrast within each stratum: '
             "documents weigh equally, and intervals come from the bootstrap within that "
             "stratum (paired across actions).</p>"]
    for model, rows in by_model(strata).items():
        quantities = headline_quantities()
        headers = (["stratum", "action", "documents"]
                   + [f"{q.html.format(H=H)} ({q.unit})" for q in quantities])
        body, starts, contrast_rows, labelled = [], set(), [], []
        for st in rows:
            name = escape(st.stratum)
            starts.add(len(body))
            for i, a in enumerate(st.actions):
                body.append([name if i == 0 else "", escape(a.action),
                             _meta_value(st.documents) if i == 0 else ""]
                            + [_quantity_cell(q, a.scalars.get(q.name)) for q in quantities])
            for c in st.contrasts:
                contrast_rows.append([name, _contrast_name(c)] + _contrast_cells(c))
                labelled.append((name, c))
        parts.append(f"<h3>{escape(model)}</h3>")
        parts.append(page.table(headers, body, numeric_from=2, group_starts=starts))
        if contrast_rows:
            parts.append(_stratum_tally([c for _, c in labelled]))
            parts.append(page.table(["stratum", "contrast (b &minus; a)"] + CONTRAST_HEADERS,
                                contrast_rows, numeric_from=2))
            parts.append(_block_gaps(labelled, "stratum"))
    return page.section("Per stratum", "strata", "\n".join(parts))


def _figures(figures: list) -> str:
    if not figures:
        return page.section("Figures", "figures", "<p>No curves in this analysis to draw.</p>")
    parts = []
    for i, (figure, path) in enumerate(figures, start=1):
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f'<figure id="fig-{figure.name}"><img alt="Figure {i}: {figure.name}" '
                     f'src="data:image/png;base64,{data}">'
                     f"<figcaption><strong>Figure {i}.</strong> {escape(figure.caption)} "
                     f'<span class="muted">(figures/{escape(path.name)})</span></figcaption>'
                     "</figure>")
    return page.section("Figures", "figures", "\n".join(parts))


def _glossary() -> str:
    items = "".join(f"<dt>{sym}</dt><dd>{text}</dd>" for sym, text in GLOSSARY)
    return page.section("Glossary", "glossary", f'<dl class="glossary">{items}</dl>')
