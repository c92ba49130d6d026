"""The numbers of a run's settings, checked without torch: a typo in ``--horizon`` or
``replicates`` is refused before the estimators (and torch) load. :class:`RunConfig
<kvdrift.run.runner.RunConfig>` checks its numbers here, so each rule is stated once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvdrift import checks, limits

#: How the command line names each setting (``kvdrift run``), for its messages.
FLAGS = {"replicates": "--replicates", "horizon": "--horizon", "batch": "--batch",
         "temperature": "--temperature", "seed": "--seed"}


def check_run_numbers(*, replicates: Any, horizon: Any, depths: Iterable[Any], batch: Any,
                      temperature: Any, seed: Any, names: Mapping[str, str] | None = None
                      ) -> tuple[int, ...]:
    """Raise ValueError (one line) for a number outside its rule or limit; return the
    observation depths sorted and without repeats. ``names``: how the user named each
    setting (e.g. :data:`FLAGS`), where not by its key."""
    named = {"replicates": "replicates K", "horizon": "horizon H", "batch": "batch",
             "temperature": "temperature", "seed": "seed"} | dict(names or {})
    limits.replicates(replicates, named["replicates"])
    limits.horizon(horizon, named["horizon"])
    limits.unit_steps(replicates, horizon, (named["replicates"], named["horizon"]))
    depths = checks.depths(depths, horizon)
    checks.integer(batch, named["batch"], 0, rule="an integer >= 0 (0 = all replicates at once)")
    checks.number(temperature, named["temperature"], 0,
                  rule="a finite number >= 0 (0 = greedy)")
    limits.seed(seed, named["seed"])
    return depths


#: The estimators a study may name (:data:`kvdrift.run.estimators.ESTIMATORS`, compared by a
#: test), and those whose records hold complete coupled rollouts (what attribution needs).
ESTIMATOR_NAMES = ("rollout", "swrb")
COMPLETE_ESTIMATORS = ("rollout",)


def check_estimator_name(name: Any, attribution: bool = False) -> None:
    """ValueError unless ``name`` names an estimator (and one that attribution can follow,
    where it is asked for); the messages :class:`RunConfig <kvdrift.run.runner.RunConfig>`
    gives, before torch loads."""
    checks.choice(name, "estimator", ESTIMATOR_NAMES)
    if attribution and name not in COMPLETE_ESTIMATORS:
        raise ValueError(f"attribution must be false with estimator {name!r}; it needs "
                         "complete coupled rollouts (estimator = \"rollout\")")
