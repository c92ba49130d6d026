"""User text made safe to print on a terminal: control characters shown as escapes.

Document ids, answers, action names, model names and paths come from users' files and
arguments. Printed raw, ``ESC ] 0 ; ... BEL`` retitles the window, ``ESC [ 2 J`` clears the
screen, and a newline or NUL forges or hides a line. :func:`printable` writes every such
character as a Python-style escape (``\\x1b``, ``\\n``, ``\\u202e``) and leaves all other
text, any script included, as it is. Every terminal print of user text goes through it.
"""

from __future__ import annotations

import re
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


def has_visible_text(text: str) -> bool:
    """Whether ``text`` holds a character a reader sees: one that is neither whitespace nor
    :data:`UNPRINTABLE` (a string of zero-width spaces or bidi marks has none)."""
    return any(not c.isspace() and unicodedata.category(c) not in UNPRINTABLE for c in text)


def page_text(html: str) -> str:
    """A whole HTML page with every :data:`UNPRINTABLE` character except newline and tab
    written as its escape, as :func:`printable` writes it: user text (a stratum name, a
    document id) reaches a page through many sections, and raw ``ESC`` bytes or bidi
    overrides there would reach whoever prints the file or opens it in a browser."""
    return _NOT_PLAIN.sub(_page_escape, html)


_NOT_PLAIN = re.compile(r"[^\t\n\x20-\x7e]")  # anything but tab, newline, printable ASCII


def _page_escape(match: re.Match[str]) -> str:
    char = match.group()
    return _escape(char) if unicodedata.category(char) in UNPRINTABLE else char
