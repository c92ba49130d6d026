"""Matching refusal messages whole in tests (``pytest.raises(..., match=whole(message))``)."""

import re


def whole(message: str) -> str:
    """A pattern that matches exactly ``message``: no more, no less, no regex meaning."""
    return f"^{re.escape(message)}$"
