"""The report's last two sections: the figures, embedded, and the glossary of symbols."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvdrift.report.figures import Figure
from kvdrift.report.page_model import Definitions, EmbeddedFigure, Markup, Section

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


def figures(drawn: Sequence[tuple[Figure, Path]]) -> Section:
    """Each drawn figure, numbered from 1, with its caption and its file's name."""
    if not drawn:
        return Section("Figures", "figures",
                       ((Markup("<p>No curves in this analysis to draw.</p>"),),))
    return Section("Figures", "figures", tuple(
        (EmbeddedFigure(i, figure.name, figure.caption, path),)
        for i, (figure, path) in enumerate(drawn, start=1)))


def glossary() -> Section:
    """Every symbol of the report, defined in a line or two."""
    return Section("Glossary", "glossary",
                   ((Definitions("glossary", tuple((s, Markup(t)) for s, t in GLOSSARY)),),))
