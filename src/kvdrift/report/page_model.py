"""What a report page says, as typed values: sections of blocks, tables of cells.

The sections (:mod:`kvdrift.report.sections`, :mod:`kvdrift.report.paper`) turn an analysis
into this model without formatting a number; :func:`kvdrift.report.page.render_page` writes
the whole model as HTML, every cell type in one place. Fields named ``html`` or ``suffix``
hold HTML the section wrote itself (markup, entities); every other text is escaped when
written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvdrift.analysis.interval import Interval
from kvdrift.analysis.registry import Quantity
from kvdrift.examples.views import ExampleView

# ------------------------------------------------------------------------------ cells


@dataclass(frozen=True)
class Text:
    """A value written as text (a name, a count, a setting); missing when None or a number
    that is not finite."""

    value: object
    suffix: str = ""


@dataclass(frozen=True)
class Number:
    """One number, times ``scale``, with ``digits`` decimals (a sign when ``signed``)."""

    value: float | None
    scale: float = 1.0
    digits: int = 2
    signed: bool = False
    suffix: str = ""


@dataclass(frozen=True)
class Estimate:
    """An estimate with its interval beneath it, times ``scale`` (percent by default)."""

    interval: Interval | None
    scale: float = 100.0
    digits: int = 2
    signed: bool = False
    suffix: str = ""

    @classmethod
    def of(cls, q: Quantity, interval: Interval | None) -> Estimate:
        """A quantity's estimate in its unit and digits (a difference signed)."""
        return cls(interval, q.scale, q.digits, signed=q.unit == "pp")


@dataclass(frozen=True)
class Range:
    """``[lo, hi]`` of two fractions, in percent; missing when both ends are."""

    lo: float
    hi: float


@dataclass(frozen=True)
class Difference:
    """The name of a contrast ``a - b``: the minuend first, as the analysis names them."""

    a: str
    b: str


@dataclass(frozen=True)
class Markup:
    """HTML the section wrote itself (a note, a heading, a composed cell)."""

    html: str


Cell = Text | Number | Estimate | Range | Difference | Markup

# ----------------------------------------------------------------------------- blocks


@dataclass(frozen=True)
class Table:
    """Rows of cells under HTML ``headers``; columns from ``numeric_from`` align right, and a
    rule marks the start of each row group."""

    headers: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    numeric_from: int = 1
    group_starts: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Definitions:
    """A definition list: (HTML term, cell) pairs."""

    css_class: str
    items: tuple[tuple[str, Cell], ...]


@dataclass(frozen=True)
class Bullets:
    """A bulleted list of cells."""

    css_class: str
    items: tuple[Cell, ...]


@dataclass(frozen=True)
class Details:
    """A folded block of preformatted text under a summary line."""

    summary: str
    text: str


@dataclass(frozen=True)
class EmbeddedFigure:
    """A drawn figure, embedded in the page, numbered and captioned."""

    number: int
    name: str
    caption: str
    path: Path


@dataclass(frozen=True)
class Generations:
    """One replicate's two generations side by side, token by token (P's and Q's text,
    escaped when written, with the divergence marked, mismatches highlighted and each
    position's TV as a background shade)."""

    view: ExampleView


Block = Markup | Table | Definitions | Bullets | Details | EmbeddedFigure | Generations


@dataclass(frozen=True)
class Section:
    """A titled section; each line is blocks written side by side, lines one under another."""

    title: str
    anchor: str
    lines: tuple[tuple[Block, ...], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Page:
    """A whole page: its title and its sections, in order."""

    title: str
    sections: tuple[Section, ...]
