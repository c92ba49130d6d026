"""The ``key=value`` fields of an action spec: how they are split, and the values allowed;
and how ``--actions`` splits into specs. Nothing here imports kvpress, so a command line is
split and its other arguments checked before the press library loads.

A bad spec raises :class:`ActionError` (a ``ValueError``) with one line in the shape of
:mod:`kvdrift.checks`: ``"<what> must be <rule>; got <value>"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from kvdrift.checks import is_integer, is_number
from kvdrift.limits import MAX_PRESS_INT, shown


class ActionError(ValueError):
    """An action spec that kvdrift cannot run: an unknown name, a field given twice or a field
    value outside what its press allows."""


def split_fields(tail: str, whole: str) -> list[tuple[str, str]]:
    """``"ratio=0.5,window_size=4"`` -> ``[("ratio", "0.5"), ("window_size", "4")]``.

    ActionError for an item that is not ``key=value`` or a key given twice (``whole`` is the
    action spec, for the message).
    """
    fields: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in tail.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise ActionError(f"action {whole!r}: each field must be key=value; got {item!r}")
        if key in fields:
            raise ActionError(f"action {whole!r}: {key} must be given once; got {key}="
                              f"{fields[key]} and {key}={value}")
        fields[key] = value
    return list(fields.items())


def _int_at_least(lo: int) -> Callable[[Any], bool]:
    return lambda v: is_integer(v) and v >= lo


def _within(lo: float, hi: float, open_lo: bool = False) -> Callable[[Any], bool]:
    return lambda v: is_number(v) and (v > lo if open_lo else v >= lo) and v <= hi


#: CURPress's leverage types (the ``Literal`` of its ``leverage_type`` field; any other fails
#: only when the press first scores, mid-run).
LEVERAGE_TYPES = ("key", "value", "kv_avg", "kv_product")

# spec field -> (rule, test): the values kvdrift runs (kvpress asserts or fails mid-prompt
# on the others, e.g. SnapKV's pooling on an even kernel_size)
FIELD_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "window_size": ("an integer >= 1", _int_at_least(1)),
    "kernel_size": ("an odd integer >= 1", lambda v: is_integer(v) and v >= 1 and v % 2 == 1),
    "n_sink": ("an integer >= 0", _int_at_least(0)),
    "num_sinks": ("an integer >= 0", _int_at_least(0)),
    "beta": ("an integer >= 1", _int_at_least(1)),
    "interval": ("an integer >= 1", _int_at_least(1)),
    "target": ("an integer >= 1", _int_at_least(1)),
    "block_size": ("an integer >= 1", _int_at_least(1)),
    "chunk_length": ("an integer >= 1", _int_at_least(1)),
    "chunk_size": ("an integer >= 1", _int_at_least(1)),
    "lag_size": ("an integer >= 1", _int_at_least(1)),
    "local_window_size": ("an integer >= 1", _int_at_least(1)),
    "sketch_dimension": ("an integer >= 1", _int_at_least(1)),
    "n_future_positions": ("an integer >= 0", _int_at_least(0)),
    "buffer": ("an integer >= 0", _int_at_least(0)),
    "merge": ("an integer >= 1", _int_at_least(1)),
    "alpha_safeguard": ("a number within [0, 1]", _within(0.0, 1.0)),
    "first_stage_ratio": ("a number within (0, 1]", _within(0.0, 1.0, open_lo=True)),
    "epsilon": ("a finite number >= 0", lambda v: is_number(v) and v >= 0),
    # torch's manual_seed takes an integer (a float or text fails at the first compression)
    "seed": ("an integer, or none", lambda v: v is None or is_integer(v)),
    "leverage_type": (f"one of {', '.join(LEVERAGE_TYPES)}", lambda v: v in LEVERAGE_TYPES),
}


def check_field_name(label: str, key: str, budgets: Iterable[str], names: Iterable[str]
                     ) -> None:
    """ActionError unless ``key`` is one of the ``names`` of the fields a stage of ``label``
    takes besides its budget (its ``budgets``, e.g. ``ratio=``, read before the fields, are
    listed first)."""
    names = tuple(names)
    if key not in names:
        raise ActionError(f"{label} field must be one of "
                          f"{', '.join((*budgets, *names))}; got {key!r}")


def check_field(label: str, key: str, value: Any) -> None:
    """ActionError unless ``value`` is allowed for the press field ``key`` of ``label``: its
    rule (:data:`FIELD_RULES`), and for every field a number kvpress can take (an integer
    within a C int, :data:`kvdrift.limits.MAX_PRESS_INT`; a finite float), so that a run
    never starts with a value that fails inside kvpress or torch."""
    rule = FIELD_RULES.get(key)
    if rule is not None and not rule[1](value):
        raise ActionError(f"{label}: {key} must be {rule[0]}; got {value!r}")
    if is_integer(value) and abs(value) > MAX_PRESS_INT:
        raise ActionError(f"{label}: {key} must be at most {MAX_PRESS_INT:_} in size "
                          f"(kvdrift's limit: what kvpress's C integers hold); got "
                          f"{shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ActionError(f"{label}: {key} must be a finite number; got {value!r}")


def split_actions(text: str) -> tuple[str, ...]:
    """Split a comma list of action specs (the command line's ``--actions``).

    A piece that starts with ``key=`` (no ``:`` before its first ``=``) continues the spec
    before it; any other piece (a named action, ``<press>:...``, ``kivi:...``) starts a new
    one. So ``snapkv-half,snapkv:budget=256,window_size=32+kivi:bits=4`` ->
    ``("snapkv-half", "snapkv:budget=256,window_size=32+kivi:bits=4")``. ActionError for a
    list with no action.
    """
    specs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        head, eq, _ = part.partition("=")
        if specs and eq and ":" not in head:
            specs[-1] = f"{specs[-1]},{part}"
        else:
            specs.append(part)
    if not specs:
        raise ActionError(f"--actions must be a comma list of at least one action (e.g. "
                          f"snapkv-half,knorm:ratio=0.5; 'help' lists them); got {text!r}")
    return tuple(specs)
