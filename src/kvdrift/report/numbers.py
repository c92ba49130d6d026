"""How the report turns analysis values into text (strict JSON: :mod:`kvdrift.json_values`).

The analysis stores every fraction in [0, 1]; the report multiplies by 100 only when it
displays a value. Differences of fractions are shown in percentage points (pp).
"""

from __future__ import annotations

import math

from kvdrift.analysis import registry
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.registry import Quantity
from kvdrift.analysis.results import StudyAnalysis

MISSING = "—"


def number_text(value: float | None, scale: float = 1.0, digits: int = 2,
                signed: bool = False) -> str:
    """One number, scaled and rounded; :data:`MISSING` when it is None or not finite."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value * scale:{'+' if signed else ''}.{digits}f}"


def interval_text(interval: Interval | None, scale: float = 1.0, digits: int = 2,
                  signed: bool = False) -> str:
    """``"estimate [lo, hi]"``; the bracket is left off when either end is missing."""
    if interval is None or not interval.defined:
        return MISSING
    text = number_text(interval.estimate, scale, digits, signed)
    if math.isfinite(interval.lo) and math.isfinite(interval.hi):
        ends = (number_text(v, scale, digits, signed) for v in (interval.lo, interval.hi))
        text += " [{}, {}]".format(*ends)
    return text


def quantity_header(q: Quantity, H: int) -> str:
    """A quantity's HTML column header with its unit (``{H}`` replaced by the horizon)."""
    return f"{q.html.format(H=H)} ({q.unit})"


def headline_quantities() -> list[Quantity]:
    """The columns of the headline table, in the registry's order (``{H}`` in a label is
    replaced by the horizon)."""
    return [q for q in registry.QUANTITIES if q.headline]


def decodes(analysis: StudyAnalysis) -> bool:
    """Whether some action's cache was compressed during generation: then Q's cache averaged
    over the generation (``kv_fraction_generation``) is shown beside the prompt cache's."""
    return any(a.compressions for a in analysis.actions)
