"""The numbers of a run's settings, checked without torch: a typo in ``--horizon`` or
``replicates`` is refused before the estimators (and torch) load. :class:`RunConfig
<kvdrift.run.runner.RunConfig>` checks its numbers here, so each rule is stated once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvdrift import checks, limits


def check_run_numbers(*, replicates: Any, horizon: Any, depths: Iterable[Any], batch: Any,
                      temperature: Any, seed: Any) -> tuple[int, ...]:
    """Raise ValueError (one line) for a number outside its rule or limit; return the
    observation depths sorted and without repeats."""
    limits.replicates(replicates)
    limits.horizon(horizon)
    limits.unit_steps(replicates, horizon)  # the records a unit holds
    depths = checks.depths(depths, horizon)
    checks.integer(batch, "batch", 0, rule="an integer >= 0 (0 = all replicates at once)")
    checks.number(temperature, "temperature", 0, rule="a finite number >= 0 (0 = greedy)")
    limits.seed(seed)
    return depths
