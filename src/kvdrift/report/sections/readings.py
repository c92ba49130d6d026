"""The report's "Teacher-forced and speculative readings": numbers along the reference path
X per action (docs/method.md, readings along X), then their contrasts a - b."""

from __future__ import annotations

from kvdrift.analysis.results import StudyAnalysis
from kvdrift.report.page_model import Difference, Estimate, Markup, Section, Table, Text

TITLE, ANCHOR = "Teacher-forced and speculative readings", "readings"
NOTE = ('<p class="note">Along the reference path X, over positions up to X\'s first EOS: '
        "teacher-forced numbers as llama.cpp's <code>perplexity --kl-divergence</code> "
        "defines them (mean KL(P&nbsp;||&nbsp;Q), share of positions whose arg-maxes agree, "
        "mean q(X<sub>t</sub>) &minus; p(X<sub>t</sub>), PPL ratio exp(mean(log p &minus; "
        "log q))), and self-speculative decoding with the action's cache drafting for the "
        "full cache: per-token acceptance (1 &minus; F per generated token) and expected "
        "tokens per verification round for draft length &gamma;, exact given the "
        "acceptance probabilities along X. Per-stratum values and the first round's "
        "accepted-length distribution are in <code>analysis.json</code> "
        "(<code>teacher_forced</code>, <code>speculative</code>).</p>")


def readings(analysis: StudyAnalysis) -> Section:
    """One row per action, then one per contrast; a signed cell is a difference a - b."""
    if not analysis.speculative:
        return Section(TITLE, ANCHOR, ((Markup("<p>No readings along X in this analysis (they "
                                               "need complete rollouts).</p>"),),))
    gammas = sorted(analysis.speculative[0].numbers.tokens_per_round)
    headers = ("model", "action", "mean KL (nats)", "top-1 agreement (%)", "mean &Delta;p (pp)",
               "PPL ratio", "acceptance (%)",
               *(f"tokens / round, &gamma; = {g}" for g in gammas))
    tf = {(x.model, x.action): x.numbers for x in analysis.teacher_forced}
    rows = []
    for s in analysis.speculative:
        t = tf.get((s.model, s.action))
        rows.append((Text(s.model), Text(s.action),
                     Estimate(t.kl if t else None, 1.0, 4),
                     Estimate(t.top1 if t else None, digits=1),
                     Estimate(t.dp if t else None, signed=True),
                     Estimate(t.ppl_ratio if t else None, 1.0, 4),
                     Estimate(s.numbers.acceptance, digits=1),
                     *(Estimate(s.numbers.tokens_per_round[g], 1.0, 2) for g in gammas)))
    line = [Markup(NOTE), Table(headers, tuple(rows), numeric_from=2)]
    tfc = {(x.model, x.a, x.b): x.numbers for x in analysis.teacher_forced_contrasts}
    contrast_rows = []
    for c in analysis.speculative_contrasts:
        t = tfc.get((c.model, c.a, c.b))
        contrast_rows.append((
            Text(c.model), Difference(c.a, c.b),
            Estimate(t.kl if t else None, 1.0, 4, signed=True),
            Estimate(t.top1 if t else None, digits=1, signed=True),
            Estimate(t.dp if t else None, signed=True),
            Estimate(t.ppl_ratio if t else None, 1.0, 4, signed=True),
            Estimate(c.numbers.acceptance, digits=1, signed=True),
            *(Estimate(c.numbers.tokens_per_round[g], 1.0, 2, signed=True) for g in gammas)))
    if contrast_rows:
        line += [Markup("<h3>Contrasts (a &minus; b)</h3>"),
                 Table(("model", "contrast (a &minus; b)", *headers[2:]), tuple(contrast_rows),
                       numeric_from=2)]
    return Section(TITLE, ANCHOR, (tuple(line),))
