"""How the report turns analysis values into text and into strict JSON.

The analysis stores every fraction in [0, 1]; the report multiplies by 100 only when it
displays a value. Differences of fractions are shown in percentage points (pp).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from kvdrift.analysis import registry
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.registry import Quantity

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


def headline_quantities() -> list[Quantity]:
    """The columns of the headline table, in the registry's order (``{H}`` in a label is
    replaced by the horizon)."""
    return [q for q in registry.QUANTITIES if q.headline]


def to_json_safe(obj):
    """A copy of ``obj`` that ``json.dumps(..., allow_nan=False)`` accepts.

    NaN and infinities become None; numpy scalars and arrays become Python numbers and lists;
    tuples become lists; paths become strings; dataclasses become dicts.
    """
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return to_json_safe(obj.tolist())
    if isinstance(obj, Mapping):
        return {str(k): to_json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_json_safe(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_json_safe(dataclasses.asdict(obj))
    raise TypeError(f"analysis holds a {type(obj).__name__} ({obj!r}), which JSON cannot store")
