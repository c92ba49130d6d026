"""MkDocs hook: docstrings cross-reference in Sphinx roles (``:func:`analyze```), which
mkdocstrings shows as written; on the site the role's prefix is dropped and the name stays
code."""

import re

ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|obj|exc):(?=<code>)")


def on_page_content(html: str, **_: object) -> str:
    """The page's HTML with ``:role:<code>`` reduced to ``<code>``."""
    return ROLE.sub("", html)
