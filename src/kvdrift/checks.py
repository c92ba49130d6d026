"""Argument checks with one message shape: ``"<what> must be <rule>; got <value>"``.

Every user-facing setting (K, H, depths, budgets, seeds, counts, levels) is checked with
these, so a mistake reads the same wherever it is made and names the value and what is
allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real
from typing import Any


def refuse(what: str, rule: str, value: Any) -> ValueError:
    """The error for ``value`` breaking ``rule`` (to raise), for a rule none of the checks
    below states: a device name, a cluster address."""
    return ValueError(f"{what} must be {rule}; got {value!r}")


def is_integer(value: Any) -> bool:
    """True for Python and numpy integers, never for booleans."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for finite real numbers (integers included), never for booleans."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _bounds_rule(kind: str, lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"{kind} within {lo}..{hi}"
    if lo is not None:
        return f"{kind} >= {lo}"
    if hi is not None:
        return f"{kind} <= {hi}"
    return kind


def integer(value: Any, what: str, lo: int | None = None, hi: int | None = None,
            rule: str | None = None) -> int:
    """``value`` as an int if it is an integer within ``[lo, hi]``; else one clear error.

    ``rule`` replaces the generated rule text (e.g. ``"an integer within 1..H = 1..8"``).
    """
    if not is_integer(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        raise refuse(what, rule or _bounds_rule("an integer", lo, hi), value)
    return int(value)


def number(value: Any, what: str, lo: float | None = None, hi: float | None = None, *,
           open_lo: bool = False, open_hi: bool = False, rule: str | None = None) -> float:
    """``value`` as a float if it is a finite number within the bounds; else one clear error.

    Bounds are closed unless ``open_lo``/``open_hi`` say otherwise.
    """
    ok = is_number(value)
    if ok and lo is not None:
        ok = value > lo if open_lo else value >= lo
    if ok and hi is not None:
        ok = value < hi if open_hi else value <= hi
    if not ok:
        if rule is None:
            if lo is not None and hi is not None:
                rule = (f"a number within {'(' if open_lo else '['}{lo}, {hi}"
                        f"{')' if open_hi else ']'}")
            elif lo is not None:
                rule = f"a finite number {'>' if open_lo else '>='} {lo}"
            elif hi is not None:
                rule = f"a finite number {'<' if open_hi else '<='} {hi}"
            else:
                rule = "a finite number"
        raise refuse(what, rule, value)
    return float(value)


def choice(value: Any, what: str, allowed: Iterable[Any], where: str | None = None) -> Any:
    """``value`` if it is one of ``allowed`` (names, or a fixed set of numbers such as bit
    widths); else an error that lists them (``where``: the table or file it was read from,
    named after ``what``: ``"key in [study] must be one of ...; got 'x'"``)."""
    allowed = tuple(allowed)
    if isinstance(value, bool) or value not in allowed:
        place = "" if where is None else f" in {where}"
        raise refuse(f"{what}{place}", f"one of {', '.join(map(str, allowed))}", value)
    return value


def named_action(name: str, where: str, source: str, actions: Iterable[str]) -> str:
    """``name``, an action that ``where`` (a target, a contrast, an endpoint) names, if it is
    one of the ``actions`` of ``source`` (the run, the cohorts, a model, the study); else an
    error listing them."""
    actions = tuple(actions)
    if name not in actions:
        raise refuse(f"action in {where}", f"one of the actions of {source}: "
                     f"{', '.join(actions)}", name)
    return name


def distinct_items(values: Iterable[Any], what: str, rule: str | None = None) -> tuple:
    """``values`` as a tuple if it holds at least one item and none twice; else one clear error
    (``rule`` replaces the generated rule text, e.g. to list what is allowed)."""
    items = tuple(values)
    if not items or len(set(items)) != len(items):
        raise refuse(what, rule or "one or more distinct values", list(items))
    return items


def text(value: Any, what: str, *, visible: bool = False, rule: str | None = None) -> str:
    """``value`` if it is a non-empty string; else one clear error.

    ``visible`` also refuses a string of whitespace, control and zero-width characters only
    (a prompt, an answer: text a reader or a model must see); ``rule`` replaces the
    generated rule text (e.g. to say what the string should look like).
    """
    from kvdrift.text import has_visible_text

    ok = isinstance(value, str) and (has_visible_text(value) if visible else bool(value))
    if not ok:
        raise refuse(what, rule or ("a string with visible text" if visible
                                     else "a non-empty string"), value)
    return value


def within_horizon(value: Any, what: str, horizon: int) -> int:
    """A count of positions or a position within ``1..H`` (a depth, an early window)."""
    return integer(value, what, 1, horizon, rule=f"an integer within 1..H = 1..{horizon}")


def depth(L: Any, horizon: int) -> int:
    """An observation depth ``L`` within ``1..H``."""
    return within_horizon(L, "depth L", horizon)


def depths(values: Iterable[Any], horizon: int) -> tuple[int, ...]:
    """Observation depths, each within ``1..H``, sorted and without repeats."""
    return tuple(sorted({depth(d, horizon) for d in values}))


def alpha(value: Any) -> Any:
    """A significance level ``alpha`` within (0, 1), returned unchanged; else one clear error.

    The level of an interval is ``1 - alpha``; 0 and 1 (and NaN) are refused.
    """
    number(value, "alpha", 0, 1, open_lo=True, open_hi=True, rule="within (0, 1)")
    return value
