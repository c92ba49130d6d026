"""How a study's records are turned into conclusions (:class:`AnalysisOptions`), checked
without numpy's analysis stack: a study file's ``[analysis]`` table is read before the
statistics (:mod:`kvdrift.analysis.study`) load."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvdrift import checks, limits
from kvdrift.analysis.endpoints import parse_endpoint

EXPLORATORY_DRAWS = 2000
CONFIRMATORY_DRAWS = 10000
"""The paper's bootstrap draws: 2,000 exploratory, 10,000 confirmatory (a study with
prespecified endpoints, and ``predict``)."""


@dataclass(frozen=True)
class AnalysisOptions:
    """How to turn records into conclusions.

    ``bootstrap`` left None takes the paper's default: :data:`CONFIRMATORY_DRAWS` when the
    study prespecifies endpoints, else :data:`EXPLORATORY_DRAWS`. ``bootstrap = 0`` asks for
    the point estimates only (``kvdrift run``'s table): no resample is drawn, and every
    bootstrap interval's ends are NaN (the estimates are those of a full analysis).
    """

    bootstrap: int | None = None
    alpha: float = 0.05
    endpoints: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.bootstrap is None:
            object.__setattr__(self, "bootstrap", CONFIRMATORY_DRAWS if self.endpoints
                               else EXPLORATORY_DRAWS)
        object.__setattr__(self, "bootstrap", limits.bootstrap(self.bootstrap))
        checks.alpha(self.alpha)
        limits.seed(self.seed)
        seen: dict[tuple, str] = {}
        for text in self.endpoints:  # each one counts in the family's adjustment: once
            e = parse_endpoint(text)
            key = (e.stat, e.action, e.minus)
            if key in seen:
                raise ValueError(f"endpoints must each be given once (each one divides alpha); "
                                 f"got {e.text!r} and {seen[key]!r}")
            seen[key] = e.text

    @classmethod
    def from_table(cls, table: Mapping[str, object]) -> AnalysisOptions:
        """The options of an ``[analysis]`` table (a study file's, or the one a study
        directory recorded); its keys are checked by the caller."""
        return cls(**(dict(table) | {"endpoints": tuple(table.get("endpoints", ()))}))


def check_overrides(bootstrap: object, alpha: object, bootstrap_name: str = "bootstrap draws",
                    alpha_name: str = "alpha") -> None:
    """ValueError (one line, naming the argument as the caller takes it) for a ``bootstrap``
    or ``alpha`` that replaces a study's own (None: the study's) and no analysis takes;
    checked before any record is read (``measure(bootstrap=-5)`` raised only after the
    whole study had run)."""
    if bootstrap is not None:
        limits.count(bootstrap, bootstrap_name, limits.MAX_BOOTSTRAP, 0)
    if alpha is not None:
        checks.number(alpha, alpha_name, 0, 1, open_lo=True, open_hi=True,
                      rule="within (0, 1)")
