"""A long generation folded around what matters: the start, the divergence with its context,
each decoding-time compression, the end; the positions between are folded into one line each
that says how many positions, mismatches and compressions it holds.

``kvdrift show`` and the report's Examples read a generation of thousands of tokens this way;
a view of at most :data:`FOLD_ABOVE` positions is shown whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: Views with more positions than this are folded.
FOLD_ABOVE = 96
#: Positions kept at the start and at the end.
HEAD = 8
TAIL = 8
#: Positions kept before and after the divergence (tau inclusive).
BEFORE = 8
AFTER = 24
#: Positions kept either side of each compression's first position.
AROUND = 1
#: More compressions than this are counted in the folds, not each shown with its context.
MAX_SHOWN_COMPRESSIONS = 24
#: A token repeated more than this many times in a row is written once with its count in a
#: generation's text (an EOS repeated to H after a branch ended).
MAX_RUN = 3


class HasPosition(Protocol):
    t: int
    mismatch: bool


@dataclass(frozen=True)
class Folded:
    """Positions ``first..last`` (inclusive, those the records hold) folded into one line."""

    first: int
    last: int
    count: int
    mismatches: int
    compressions: int

    def summary(self) -> str:
        """``… 212 positions folded (t = 40–251; 3 mismatches, 2 compressions) …``"""
        parts = [f"{self.mismatches} mismatch{'es' if self.mismatches != 1 else ''}"]
        if self.compressions:
            parts.append(f"{self.compressions} compression{'s' if self.compressions != 1 else ''}")
        return (f"… {self.count} position{'s' if self.count != 1 else ''} folded "
                f"(t = {self.first}–{self.last}; {', '.join(parts)}) …")


@dataclass(frozen=True)
class Fold:
    """A generation's rows as shown: positions and :class:`Folded` lines in order, and how
    many positions were folded away of how many."""

    items: tuple[object, ...]
    folded: int
    total: int

    def summary(self) -> str | None:
        """``folded 3,968 of 4,096 positions; shown: ...`` (within 80 columns); None when
        nothing was folded."""
        if not self.folded:
            return None
        return (f"folded {self.folded:,} of {self.total:,} positions; shown: start, tau "
                "with context, each ✂, end")


def shown_positions(ts: Sequence[int], tau: int, compressions: Sequence[int]) -> set[int]:
    """The positions of ``ts`` a folded view keeps (module docstring)."""
    ts = sorted(ts)
    keep = set(ts[:HEAD]) | set(ts[-TAIL:])
    if tau > 0:
        keep |= set(range(tau - BEFORE, tau + AFTER))
    if len(compressions) <= MAX_SHOWN_COMPRESSIONS:
        for c in compressions:
            keep |= set(range(c - AROUND, c + AROUND + 1))
    return keep & set(ts)


def fold(positions: Sequence[HasPosition], tau: int, compressions: Sequence[int],
         above: int = FOLD_ABOVE) -> Fold:
    """``positions`` (ascending ``t``) folded around what matters when there are more than
    ``above``; else all of them."""
    if len(positions) <= above:
        return Fold(tuple(positions), 0, len(positions))
    keep = shown_positions([p.t for p in positions], tau, compressions)
    marks = set(compressions)
    items: list[object] = []
    run: list[HasPosition] = []

    def close() -> None:
        if run:
            items.append(Folded(run[0].t, run[-1].t, len(run), sum(p.mismatch for p in run),
                                sum(p.t in marks for p in run)))
            run.clear()

    for p in positions:
        if p.t in keep:
            close()
            items.append(p)
        else:
            run.append(p)
    close()
    folded = sum(f.count for f in items if isinstance(f, Folded))
    return Fold(tuple(items), folded, len(positions))


def joined_text(pieces: Sequence[str]) -> str:
    """The generation's text: its token pieces joined, each run of one piece repeated more than
    :data:`MAX_RUN` times written once and followed by ``⟨×N⟩``."""
    out: list[str] = []
    i = 0
    while i < len(pieces):
        j = i
        while j < len(pieces) and pieces[j] == pieces[i]:
            j += 1
        n = j - i
        out.append(pieces[i] + f"⟨×{n}⟩" if n > MAX_RUN else pieces[i] * n)
        i = j
    return "".join(out)
