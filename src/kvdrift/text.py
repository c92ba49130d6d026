"""User text made safe to print on a terminal: control characters shown as escapes.

Document ids, answers, action names, model names and paths come from users' files and
arguments. Printed raw, ``ESC ] 0 ; ... BEL`` retitles the window, ``ESC [ 2 J`` clears the
screen, and a newline or NUL forges or hides a line. :func:`printable` writes every such
character as a Python-style escape (``\\x1b``, ``\\n``, ``\\u202e``) and leaves all other
text, any script included, as it is. Every terminal print of user text goes through it.
"""

from __future__ import annotations

import unicodedata

#: Unicode categories never printed raw: controls (C0, DEL, C1), format characters (bidi
#: overrides, zero-width joiners), line and paragraph separators, surrogates, unassigned.
UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _escape(char: str) -> str:
    code = ord(char)
    if char in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(value: object) -> str:
    """``str(value)`` with every control, format or separator character escaped."""
    text = str(value)
    if text.isprintable() and text.isascii():
        return text
    return "".join(_escape(c) if unicodedata.category(c) in UNPRINTABLE else c for c in text)
