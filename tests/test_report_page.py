"""The report's page model and its one renderer: every cell type, block and section layout."""

from __future__ import annotations

import math
import re

from test_report import make_analysis, typed

from kvdrift.analysis.interval import Interval
from kvdrift.report.numbers import MISSING
from kvdrift.report.page import render_blocks, render_page, render_section
from kvdrift.report.page_model import (
    Bullets,
    Definitions,
    Difference,
    Estimate,
    Markup,
    Number,
    Page,
    Range,
    Section,
    Table,
    Text,
)
from kvdrift.report.sections.bounds import bounds
from kvdrift.report.sections.contrasts import contrasts
from kvdrift.report.sections.headline import headline
from kvdrift.report.sections.strata import strata


def cell(c) -> str:
    """One cell as the renderer writes it (through a one-cell table)."""
    html = render_blocks([Table(("x",), ((c,),), numeric_from=0)])
    return re.search(r'<td class="num">(.*?)</td>', html).group(1)


def test_estimate_cell_scales_signs_and_drops_an_open_bracket():
    iv = Interval(0.1234, 0.1, 0.15, 0.95)
    assert cell(Estimate(iv, signed=True)) == (
        '<span class="est">+12.34</span><br><span class="ci">[+10.00, +15.00]</span>')
    assert cell(Estimate(iv, 1.0, 4, suffix=" pp")) == (
        '<span class="est">0.1234 pp</span><br><span class="ci">[0.1000, 0.1500]</span>')
    half_open = Interval(0.5, math.nan, 0.6, 0.95)
    assert cell(Estimate(half_open)) == '<span class="est">50.00</span>'
    assert cell(Estimate(None)) == MISSING
    assert cell(Estimate(Interval(math.nan, 0.1, 0.2, 0.95))) == MISSING


def test_text_and_number_cells_mark_what_is_missing():
    assert cell(Text("<b>&</b>")) == "&lt;b&gt;&amp;&lt;/b&gt;"
    assert cell(Text(0)) == "0" and cell(Text(0.05)) == "0.05"
    assert cell(Text(None)) == MISSING and cell(Text(math.nan)) == MISSING
    assert cell(Text(None, " steps")) == MISSING + " steps"  # a missing value keeps its words
    assert cell(Number(2.25, digits=1, suffix="&times;")) == "2.2&times;"
    assert cell(Number(math.inf, suffix="&times;")) == MISSING  # no unit on a missing number
    assert cell(Number(0.125, 100, 1, signed=True)) == "+12.5"


def test_range_difference_and_markup_cells():
    assert cell(Range(0.1, 0.2)) == "[10.00, 20.00]"
    assert cell(Range(math.nan, 0.2)) == f"[{MISSING}, 20.00]"
    assert cell(Range(math.nan, math.nan)) == MISSING
    assert cell(Difference("a<1", "b&")) == "a&lt;1 &minus; b&amp;"
    assert cell(Markup("<em>as written</em>")) == "<em>as written</em>"


def test_a_section_writes_its_lines_one_under_another():
    s = Section("T", "t", ((Markup("a"), Markup("b")), (), (Markup("c"),)))
    assert render_section(s) == '<section id="t">\n<h2>T</h2>\nab\n\nc\n</section>'
    page = render_page(Page("x < y", (s, s)))
    assert "<title>x &lt; y</title>" in page
    assert "</section>\n<section" in page


def test_tables_lists_and_definitions():
    t = Table(("name", "n"), ((Text("a"), Number(1.0)), (Text("b"), Number(2.0)),
                              (Text(""), Number(3.0))), numeric_from=1,
              group_starts=frozenset({0, 2}))
    html = render_blocks([t])
    assert '<th>name</th><th class="num">n</th>' in html
    assert html.count('class="group-start"') == 1  # never on the first row
    assert '<tr class="group-start"><td></td><td class="num">3.00</td></tr>' in html
    assert render_blocks([Bullets("notes", (Text("<x>"),))]) == (
        '<ul class="notes"><li>&lt;x&gt;</li></ul>')
    assert render_blocks([Definitions("meta", (("&alpha;", Text(0.05, " (level)")),))]) == (
        '<dl class="meta"><dt>&alpha;</dt><dd>0.05 (level)</dd></dl>')


def test_sections_leave_every_number_to_the_renderer():
    """No table of the fake analysis's sections holds a measured number as text: a float is a
    Number or an Estimate cell, never a Text, and no Markup cell holds a decimal."""
    analysis = typed(make_analysis())
    decimal = re.compile(r"\d\.\d")
    for section in (headline(analysis), contrasts(analysis), bounds(analysis),
                    strata(analysis)):
        tables = [b for line in section.lines for b in line if isinstance(b, Table)]
        assert tables
        cells = [c for t in tables for row in t.rows for c in row]
        assert any(isinstance(c, (Number, Estimate, Range)) for c in cells)
        for c in cells:
            assert not (isinstance(c, Text) and isinstance(c.value, float)), (section.title, c)
            assert not (isinstance(c, Markup) and decimal.search(c.html)), (section.title, c)
