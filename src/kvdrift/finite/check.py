"""The paper's finite-state check: naive rollouts vs SWRB on exact systems (docs/method.md
section 11).

For each random binary system the exact risk ``R`` comes from enumeration; both
estimators run ``replicates`` times, and we compare their means against ``R`` and
their per-replicate variances and kernel-pair evaluation counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from kvdrift import limits
from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.finite.exact import exact
from kvdrift.finite.systems import paper_system

PAPER = {"min_var_ratio": 11.1, "median_var_ratio": 52.7, "max_var_ratio": 289.0,
         "cost_ratio": 1.37, "advantage": 20.0}
"""The paper's reported summary for 24 systems, H = 3, 512 replicates."""


@dataclass(frozen=True)
class SystemResult:
    """One system: exact risk, each estimator's mean and standard error, and costs."""

    system: int
    exact: float
    naive_mean: float
    naive_se: float
    swrb_mean: float
    swrb_se: float
    var_ratio: float  # naive per-replicate variance / SWRB's; NaN when undefined
    naive_evaluations: int
    swrb_evaluations: int
    var_ratio_undefined: str | None = None  # why the ratio is undefined (None: it is defined)

    @property
    def informative(self) -> bool:
        """Whether both estimators varied, so that the variance ratio says something."""
        return self.var_ratio_undefined is None

    @property
    def cost_ratio(self) -> float:
        return self.swrb_evaluations / self.naive_evaluations


@dataclass(frozen=True)
class FiniteStudyResult:
    """All systems plus the summary the paper reports.

    The min / median / max variance ratios are over the informative systems only (those
    with a defined ratio, :attr:`SystemResult.informative`); ``informative`` counts them.
    ``cost_ratio`` is SWRB's kernel-pair evaluations over the naive estimator's, pooled
    over systems. ``advantage`` is the variance-cost advantage: the naive estimator's
    per-replicate variance summed over systems, over SWRB's, divided by ``cost_ratio`` --
    how many times fewer kernel-pair evaluations SWRB needs for the same precision on
    the average risk over systems.
    """

    systems: list[SystemResult]
    horizon: int
    replicates: int
    seed: int

    @property
    def var_ratios(self) -> np.ndarray:
        """The informative systems' variance ratios (undefined ones left out)."""
        return np.array([s.var_ratio for s in self.systems if s.informative])

    @property
    def informative(self) -> int:
        """How many systems have a defined variance ratio."""
        return int(self.var_ratios.size)

    def _ratio_stat(self, stat: Callable[[np.ndarray], float]) -> float:
        ratios = self.var_ratios
        return float(stat(ratios)) if ratios.size else float("nan")

    @property
    def min_var_ratio(self) -> float:
        return self._ratio_stat(np.min)

    @property
    def median_var_ratio(self) -> float:
        return self._ratio_stat(np.median)

    @property
    def max_var_ratio(self) -> float:
        return self._ratio_stat(np.max)

    @property
    def cost_ratio(self) -> float:
        return sum(s.swrb_evaluations for s in self.systems) / sum(
            s.naive_evaluations for s in self.systems)

    @property
    def advantage(self) -> float:
        naive = sum(s.naive_se**2 for s in self.systems)
        branch = sum(s.swrb_se**2 for s in self.systems)
        return naive / branch / self.cost_ratio if branch > 0 else float("nan")

    def to_json(self) -> dict:
        return {
            "systems": [
                {k: v for k, v in asdict(s).items() if k != "system"} | {"system": s.system}
                for s in self.systems
            ],
            "informative_systems": self.informative,
            "median_var_ratio": self.median_var_ratio,
            "min_var_ratio": self.min_var_ratio,
            "max_var_ratio": self.max_var_ratio,
            "cost_ratio": self.cost_ratio,
            "advantage": self.advantage,
            "horizon": self.horizon,
            "replicates": self.replicates,
            "seed": self.seed,
            "paper": PAPER,
        }


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error (``run_finite_study`` ensures at least 2 values)."""
    return float(values.mean()), float(values.std(ddof=1)) / math.sqrt(values.size)


def variance_ratio(naive: np.ndarray, branch: np.ndarray) -> tuple[float, str | None]:
    """Naive over SWRB per-replicate sample variance, or NaN and the reason it is undefined.

    A system whose naive replicates never diverge (its mixing weight is tiny) has naive
    variance 0; the ratio 0 would read as "SWRB is infinitely worse", so it is undefined.
    """
    n_var, s_var = float(naive.var(ddof=1)), float(branch.var(ddof=1))
    if n_var == 0:
        why = ("the naive replicates never diverged" if not naive.any()
               else "the naive replicates are all equal")
        return float("nan"), f"{why} (naive variance 0)"
    if s_var == 0:
        return float("nan"), "the SWRB replicates are all equal (SWRB variance 0)"
    return n_var / s_var, None


def run_system(c: int, systems: int, horizon: int, replicates: int, seed: int) -> SystemResult:
    """Build system ``c``, enumerate its exact risk, and run both estimators on it."""
    pair = paper_system(c, n_systems=systems, H=horizon, seed=seed)
    truth = exact(pair)
    naive = coupled_rollouts(pair, replicates, horizon, seed=seed * 1_000_003 + 2 * c)
    branch = swrb(pair, replicates, horizon, seed=seed * 1_000_003 + 2 * c + 1)
    d_h = naive.mismatch.double().mean(dim=1).numpy()
    z_R = branch.z_R.numpy()
    n_mean, n_se = _mean_se(d_h)
    s_mean, s_se = _mean_se(z_R)
    ratio, undefined = variance_ratio(d_h, z_R)
    return SystemResult(
        system=c, exact=truth.R, naive_mean=n_mean, naive_se=n_se, swrb_mean=s_mean,
        swrb_se=s_se, var_ratio=ratio, naive_evaluations=int(naive.evaluations),
        swrb_evaluations=int(branch.evaluations.sum()), var_ratio_undefined=undefined,
    )


def run_finite_study(
    systems: int = 24,
    replicates: int = 512,
    horizon: int = 3,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> FiniteStudyResult:
    """Run the finite-state check on systems ``c = 1..systems``."""
    limits.finite_study(systems, replicates, horizon, seed)
    results = []
    for c in range(1, systems + 1):
        results.append(run_system(c, systems, horizon, replicates, seed))
        if progress is not None:
            progress(c)
    return FiniteStudyResult(results, horizon=horizon, replicates=replicates, seed=seed)
