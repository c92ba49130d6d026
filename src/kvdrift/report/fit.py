"""Terminal lines within a width (80 columns: ``kvdrift show``), counted in cells as a
terminal draws them: an East Asian wide character takes two, a combining mark none.

Prose and text (a heading, the prompt's end, a generation) are wrapped at spaces, a word
wider than a line folded, continuation lines indented; a table cell is cut with ``…``.
The text must already be printable (:func:`kvdrift.text.printable`): a control character
has no width to count.
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.text import Text

#: The width ``kvdrift show`` writes within.
WIDTH = 80
ELLIPSIS = "…"

# a word with its trailing spaces; a lone "·" stays with the word before it (a heading's
# "model · doc · action" breaks after a dot, never before); leading spaces are a chunk
_CHUNK = re.compile(r"\S+(?:[ ]+·(?=\s|$))?\s*|\s+")
# what a folded word is never cut inside: a repeat count ("⟨×837⟩", examples/folding.py)
_ATOM = re.compile(r"⟨×\d+⟩|.", re.S)


def clip(text: str, width: int) -> str:
    """``text`` if it fits ``width`` cells, else its longest start that fits with ``…``."""
    if cell_len(text) <= width:
        return text
    out, used = [], cell_len(ELLIPSIS)
    for char in text:
        used += cell_len(char)
        if used > width:
            break
        out.append(char)
    return "".join(out) + ELLIPSIS


def clip_around(text: str, width: int, start: int, end: int) -> str:
    """``text`` within ``width`` cells, keeping ``text[start:end]`` (a marked token) and as
    much on either side of it as fits, each cut side marked ``…``; the kept span itself
    cut at its end where even it does not fit."""
    if cell_len(text) <= width:
        return text

    def shown(lo: int, hi: int) -> int:
        return cell_len(text[lo:hi]) + cell_len(ELLIPSIS) * ((lo > 0) + (hi < len(text)))

    lo, hi = start, end
    if shown(lo, hi) > width:
        return (ELLIPSIS if lo > 0 else "") + clip(text[lo:], width - (lo > 0))
    grown = True
    while grown:  # a character on each side in turn, the right side first
        grown = False
        if hi < len(text) and shown(lo, hi + 1) <= width:
            hi, grown = hi + 1, True
        if lo > 0 and shown(lo - 1, hi) <= width:
            lo, grown = lo - 1, True
    return (ELLIPSIS if lo > 0 else "") + text[lo:hi] + (ELLIPSIS if hi < len(text) else "")


def break_offsets(text: str, width: int, indent: int = 0) -> list[int]:
    """Where ``text`` (one line) breaks to fit ``width`` cells, continuation lines starting
    after ``indent`` cells: after a word's trailing spaces, or inside a word wider than a
    line (folded from where it starts)."""
    offsets: list[int] = []
    used, room = 0, width
    for chunk in _CHUNK.finditer(text):
        word = chunk.group().rstrip()
        if used and room - used < cell_len(word) <= width - indent:
            offsets.append(chunk.start())  # to the next line, where it fits
            used, room = 0, width - indent
        if cell_len(word) <= room - used:
            used += cell_len(chunk.group())
            continue
        for at, atom in _atoms(word, width - indent):  # fold a word wider than a line
            if used and used + cell_len(atom) > room:
                offsets.append(chunk.start() + at)
                used, room = 0, width - indent
            used += cell_len(atom)
        used += cell_len(chunk.group()) - cell_len(word)
    return offsets


def wrapped(text: Text, width: int = WIDTH, indent: int = 0) -> Text:
    """One line of styled ``text`` wrapped to ``width`` cells (:func:`break_offsets`), each
    continuation line indented by ``indent`` spaces, the lines joined with newlines; the
    styles kept."""
    lines = text.divide(break_offsets(text.plain, width, indent))
    out = Text()
    for i, line in enumerate(lines):
        line.rstrip()
        if i:
            out.append("\n" + " " * indent)
        out.append_text(line)
    return out


def _atoms(word: str, most: int) -> list[tuple[int, str]]:
    """``word``'s pieces with their indices: repeat counts whole where they fit ``most``
    cells, every other character alone."""
    out: list[tuple[int, str]] = []
    for atom in _ATOM.finditer(word):
        if cell_len(atom.group()) <= most:
            out.append((atom.start(), atom.group()))
        else:
            out.extend((atom.start() + i, char) for i, char in enumerate(atom.group()))
    return out
