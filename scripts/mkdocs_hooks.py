"""MkDocs hooks: the site reads the same opened from the disk, with no network.

- Docstrings cross-reference in Sphinx roles (``:func:`analyze```), which mkdocstrings shows
  as written; on the site the role's prefix is dropped and the name stays code.
- Math (``$...$`` inline, ``$$...$$`` displayed: pymdownx.arithmatex, generic mode) is drawn
  at build time as inline SVG by matplotlib's mathtext (a subset of TeX: no macros or
  environments), so no MathJax or KaTeX loads from a CDN when the page is read.
- The changelog page includes CHANGELOG.md, whose links are written from the repository's
  root (``docs/llama-cpp.md``); on the site they are the pages themselves.
"""

from __future__ import annotations

import functools
import html
import io
import re
from pathlib import Path

ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|obj|exc):(?=<code>)")
#: arithmatex's generic output: ``<span class="arithmatex">\(x\)</span>``, and a displayed
#: formula as ``<div class="arithmatex">\[x\]</div>``.
MATH = re.compile(r'<(span|div) class="arithmatex">\\([(\[])(.*?)\\[)\]]</\1>', re.S)
ROOT_LINK = re.compile(r"\]\(docs/")


@functools.cache
def math_svg(tex: str, display: bool) -> str:
    """``tex`` drawn as an SVG element (glyphs as paths: no font is needed to read it)."""
    import matplotlib
    from matplotlib import mathtext
    from matplotlib.font_manager import FontProperties

    with matplotlib.rc_context({"mathtext.fontset": "cm", "svg.fonttype": "path",
                                "svg.hashsalt": "kvdrift"}):
        buffer = io.BytesIO()
        mathtext.math_to_image(f"${tex}$", buffer, format="svg",
                               prop=FontProperties(size=15 if display else 12))
    svg = buffer.getvalue().decode("utf-8")
    svg = re.sub(r"<\?xml.*?\?>|<!DOCTYPE.*?>|<metadata>.*?</metadata>", "", svg, flags=re.S)
    label = html.escape(tex, quote=True)
    return svg.strip().replace(
        "<svg ", f'<svg role="img" aria-label="{label}" class="kvdrift-math" ', 1)


def _math(match: re.Match) -> str:
    tag, opening, tex = match.group(1), match.group(2), html.unescape(match.group(3))
    display = opening == "["
    svg = math_svg(" ".join(tex.split()), display)
    return f'<{tag} class="arithmatex">{svg}</{tag}>'


def on_page_markdown(markdown: str, page, config, **_: object) -> str:
    """The changelog page: CHANGELOG.md included here, its links from the repository root
    made links to the site's pages (the snippet would include them as written)."""
    include = '--8<-- "CHANGELOG.md"'
    if page.file.src_uri != "changelog.md" or include not in markdown:
        return markdown
    changelog = Path(config.config_file_path).parent / "CHANGELOG.md"
    return markdown.replace(include, ROOT_LINK.sub("](", changelog.read_text("utf-8")))


def on_page_content(html_text: str, **_: object) -> str:
    """The page's HTML with ``:role:<code>`` reduced to ``<code>`` and its math drawn."""
    return MATH.sub(_math, ROLE.sub("", html_text))
