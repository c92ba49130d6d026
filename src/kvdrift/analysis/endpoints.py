"""Prespecified endpoints: named quantities or differences, e.g. ``B(snapkv-90) - B(recent-90)``.

Endpoints are fixed before a study runs and get family-adjusted (Bonferroni) intervals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENDPOINT_STATS = ("p_diverge", "mean_entry_time", "R", "O", "E", "Pi", "C", "F", "R_minus_F",
                  "S99", "B", "B_strict")
_TERM = r"\s*([A-Za-z_0-9]+)\s*\(\s*([^()]+?)\s*\)\s*"
_PATTERN = re.compile(rf"^{_TERM}(?:-{_TERM})?$")


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


def parse_endpoint(text: str) -> Endpoint:
    """Parse ``STAT(action)`` or ``STAT(a) - STAT(b)``; STAT is one of :data:`ENDPOINT_STATS`."""
    match = _PATTERN.match(text)
    if not match:
        raise ValueError(f"cannot read endpoint {text!r}; write STAT(action) or "
                         "STAT(action) - STAT(action), e.g. 'B(snapkv-90) - B(recent-90)'")
    stat, action, stat2, action2 = match.groups()
    for s in (stat, stat2):
        if s is not None and s not in ENDPOINT_STATS:
            raise ValueError(f"unknown statistic {s!r} in endpoint {text!r}; allowed: "
                             f"{', '.join(ENDPOINT_STATS)}")
    minus = (stat2, action2) if stat2 is not None else None
    return Endpoint(text=text.strip(), stat=stat, action=action, minus=minus)
