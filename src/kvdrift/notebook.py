"""Results that show as tables in a notebook, as pandas' and scipy's do.

Jupyter shows an object by calling its ``_repr_html_``; a result with a ``to_frame()`` (one row
per model x action, per family x budget, ...) shows that frame, headed by the result's kind.
"""

from __future__ import annotations

import html

#: Most rows a result's table shows in a notebook (pandas elides the middle of longer ones).
MAX_ROWS = 60


class HtmlTable:
    """Mixin: ``_repr_html_`` is ``to_frame()`` as an HTML table under the result's name."""

    def _repr_html_(self) -> str:
        frame = self.to_frame()  # type: ignore[attr-defined]
        title = html.escape(type(self).__name__)
        return (f"<div><p><b>{title}</b></p>"
                f"{frame.to_html(max_rows=MAX_ROWS, na_rep='', border=0)}</div>")
