"""The study report as one self-contained HTML file (figures embedded as base64 PNGs).

``write_report(analysis, out_dir)`` writes::

    out_dir/report.html      the report; can be mailed on its own
    out_dir/analysis.json    every number of the analysis, strict JSON (NaN -> null)
    out_dir/figures/*.png    the figures, also embedded in the HTML

The way there is one line: the sections (:mod:`kvdrift.report.sections`, and the paper's
tables) turn the analysis into a page model (:mod:`kvdrift.report.page_model`), and
:func:`kvdrift.report.page.render_page` writes that model as HTML.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvdrift import output
from kvdrift.analysis.results import StudyAnalysis
from kvdrift.json_values import to_json_safe
from kvdrift.report.figures import FIGURES
from kvdrift.report.page import render_page
from kvdrift.report.page_model import Page, Section
from kvdrift.report.paper import paper_section
from kvdrift.report.sections.agreement import local_agreement
from kvdrift.report.sections.bounds import bounds
from kvdrift.report.sections.closing import figures, glossary
from kvdrift.report.sections.contrasts import contrasts
from kvdrift.report.sections.endpoints import endpoints
from kvdrift.report.sections.eos import eos_split
from kvdrift.report.sections.headline import headline
from kvdrift.report.sections.readings import readings
from kvdrift.report.sections.run import what_was_run
from kvdrift.report.sections.strata import strata
from kvdrift.report.sections.task import task_outcomes

DEFAULT_TITLE = "KV-cache compression: divergence timing and cumulative disagreement"


def write_report(analysis: StudyAnalysis, out_dir: str | Path | output.OutputDir, *,
                 title: str = DEFAULT_TITLE, examples: Section | None = None) -> Path:
    """Write ``report.html``, ``analysis.json`` and ``figures/*.png`` into ``out_dir``.

    Parameters
    ----------
    analysis : StudyAnalysis
        A study analysis; NaN marks quantities that were not measured. ``analysis.json`` is
        its ``to_json()``, with NaN written as null.
    out_dir : path or OutputDir
        Created if needed (marked a kvdrift report), and held while the report is written:
        every file is written and deleted through it, never through a link. Figures of an
        earlier report that this analysis cannot draw are removed, so ``figures/`` always
        matches the HTML.
    examples : Section, optional
        The "Examples" section (:func:`~kvdrift.report.sections.examples.examples_section`:
        it reads the records, not the analysis), placed before the figures.

    Returns
    -------
    Path of ``report.html``.
    """
    if not isinstance(analysis, StudyAnalysis):
        raise TypeError("analysis must be a StudyAnalysis (from kvdrift.analysis.study."
                        f"analyze), got {type(analysis).__name__}")
    folder = (out_dir if isinstance(out_dir, output.OutputDir) else
              output.OutputDir(out_dir, marker="report"))
    folder.write_text("analysis.json",
                      json.dumps(to_json_safe(analysis.to_json()), indent=1, allow_nan=False)
                      + "\n")
    fig_dir = folder.subdir("figures")
    fig_dir.fd  # noqa: B018 - made if missing, held

    drawn = []
    for figure in FIGURES:
        fig_dir.unlink(f"{figure.name}.png")  # a name in the held folder, never a path
        path = figure.draw(analysis, fig_dir / f"{figure.name}.png")
        if path is not None:
            drawn.append((figure, path))

    page = Page(title, (
        what_was_run(analysis),
        headline(analysis),
        paper_section(analysis),
        contrasts(analysis),
        endpoints(analysis),
        bounds(analysis),
        eos_split(analysis),
        local_agreement(analysis),
        task_outcomes(analysis),
        readings(analysis),
        strata(analysis),
        *(() if examples is None else (examples,)),
        figures(drawn),
        glossary(),
    ))
    return folder.write_text("report.html", render_page(page))
