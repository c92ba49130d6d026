"""The one grammar for quantities and contrasts: ``STAT(action)`` or ``STAT(a) - STAT(b)``.

``a - b`` (spaces around the minus; action names may contain hyphens) is shorthand for
``R(a) - R(b)``. Study endpoints (fixed before a study runs; family-adjusted intervals),
``kvdrift plan --target`` and ``kvdrift predict --contrast`` all read it with
:func:`parse_endpoint`; a term minus itself (``R(a) - R(a)``, always 0) is refused. The
contrasts an analysis computes between a model's actions are named the same way, minuend
first (:func:`action_pairs`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvdrift import checks
from kvdrift.analysis import registry

_TERM = r"\s*([A-Za-z_0-9]+)\s*\(\s*([^()]+?)\s*\)\s*"
_PATTERN = re.compile(rf"^{_TERM}(?:-{_TERM})?$")
_SHORTHAND = re.compile(r"^\s*([^()\s]+)\s+-\s+([^()\s]+)\s*$")  # "a - b": R(a) - R(b)


@dataclass(frozen=True)
class Endpoint:
    """``stat(action)``, or ``stat(action) - stat(other)`` when ``minus`` is set."""

    text: str
    stat: str
    action: str
    minus: tuple[str, str] | None = None

    @property
    def actions(self) -> tuple[str, ...]:
        return (self.action,) if self.minus is None else (self.action, self.minus[1])


def endpoint_stats() -> tuple[str, ...]:
    """The statistics an endpoint may name: the registry's quantities that endpoints take."""
    return tuple(q.name for q in registry.QUANTITIES if q.endpoint)


def parse_endpoint(text: str) -> Endpoint:
    """Parse ``STAT(action)``, ``STAT(a) - STAT(b)`` or ``a - b`` (``R(a) - R(b)``); STAT is
    a quantity of the registry that endpoints take (:func:`endpoint_stats`)."""
    match = _PATTERN.match(text)
    if match:
        stat, action, stat2, action2 = match.groups()
    elif short := _SHORTHAND.match(text):
        stat, action, stat2, action2 = "R", short[1], "R", short[2]
    else:
        raise ValueError(f"cannot read {text!r}; write STAT(action), STAT(action) - "
                         "STAT(action), or 'a - b' for R(a) - R(b), e.g. "
                         "'B(snapkv-90) - B(recent-90)'")
    allowed = endpoint_stats()
    for s in (stat, stat2):
        if s is not None:
            checks.choice(s, "statistic", allowed, where=f"endpoint {text!r}")
    minus = (stat2, action2) if stat2 is not None else None
    if minus == (stat, action):
        raise ValueError(f"{text.strip()!r} subtracts {stat}({action}) from itself, which is "
                         "always 0; name two different actions (or statistics)")
    return Endpoint(text=text.strip(), stat=stat, action=action, minus=minus)


def action_pairs(actions: list[str]) -> list[tuple[str, str]]:
    """Every contrast ``(a, b)``, reported as ``a - b``: each action ``a`` against each action
    ``b`` run before it, ordered by ``b``, then ``a``, as the actions were run (for actions
    x, y, z: ``y - x``, ``z - x``, ``z - y``)."""
    return [(a, b) for i, b in enumerate(actions) for a in actions[i + 1:]]
