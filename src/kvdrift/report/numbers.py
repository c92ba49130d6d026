"""How the report turns analysis values into text and into strict JSON.

The analysis stores every fraction in [0, 1]; the report multiplies by 100 only when it
displays a value. Differences of fractions are shown in percentage points (pp).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvdrift.analysis.interval import Interval

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


@dataclass(frozen=True)
class Quantity:
    """A scalar of :attr:`ActionResult.scalars <kvdrift.analysis.results.ActionResult.scalars>`
    as the report shows it.

    ``unit`` is ``"%"`` (a fraction of positions or of trajectories), ``"pp"`` (a difference of
    fractions) or ``"steps"``; the first two are multiplied by 100 for display.
    """

    key: str
    html: str  # column header, HTML (may use <sub>)
    text: str  # column header, plain text (terminal)
    unit: str
    digits: int = 2

    @property
    def scale(self) -> float:
        return 100.0 if self.unit in ("%", "pp") else 1.0

    def format(self, interval: Interval | None, digits: int | None = None) -> str:
        return interval_text(interval, self.scale, self.digits if digits is None else digits,
                             signed=self.unit == "pp")


#: Columns of the headline table, in order (``{H}`` is replaced by the horizon).
HEADLINE = (
    Quantity("p_diverge", "P(&tau; &le; {H})", "P(τ≤{H})", "%"),
    Quantity("mean_entry_time", "mean entry time", "entry", "steps", 1),
    Quantity("R", "R", "R", "%"),
    Quantity("R_tv", "R<sub>TV</sub>", "R_TV", "%"),
    Quantity("O", "O<sub>H</sub>", "O_H", "%"),
    Quantity("E", "E<sub>H</sub>", "E_H", "%"),
    Quantity("Pi", "&Pi;<sub>H</sub>", "Π_H", "%"),
    Quantity("C", "C<sub>H</sub>", "C_H", "%"),
    Quantity("F", "F", "F", "%"),
    Quantity("R_minus_F", "R<sub>TV</sub> &minus; F", "R_TV−F", "pp"),
    Quantity("S99", "S<sub>.99</sub>", "S.99", "%"),
    Quantity("B", "B(a)", "B(a)", "pp"),
)

#: Shown after the headline columns only when some action has it.
B_STRICT = Quantity("B_strict", "B(a) strict pre-EOS", "B strict", "pp")


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
