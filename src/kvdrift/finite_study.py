"""The paper's finite-state check (SPEC.md section 6): naive rollouts vs SWRB on exact systems.

For each random binary system the exact risk ``R`` comes from enumeration; both
estimators run ``replicates`` times, and we compare their means against ``R`` and
their per-replicate variances and kernel-pair evaluation counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.estimate.common import check_horizon, check_replicates
from kvdrift.finite import exact, paper_system

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
    var_ratio: float  # naive per-replicate variance / SWRB per-replicate variance
    naive_evaluations: int
    swrb_evaluations: int

    @property
    def cost_ratio(self) -> float:
        return self.swrb_evaluations / self.naive_evaluations


@dataclass(frozen=True)
class FiniteStudyResult:
    """All systems plus the summary the paper reports.

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
        return np.array([s.var_ratio for s in self.systems])

    @property
    def min_var_ratio(self) -> float:
        return float(self.var_ratios.min())

    @property
    def median_var_ratio(self) -> float:
        return float(np.median(self.var_ratios))

    @property
    def max_var_ratio(self) -> float:
        return float(self.var_ratios.max())

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


def _mean_se(values: np.ndarray) -> tuple[float, float, float]:
    var = float(values.var(ddof=1)) if values.size > 1 else float("nan")
    return float(values.mean()), math.sqrt(var / values.size), var


def run_system(c: int, systems: int, horizon: int, replicates: int, seed: int) -> SystemResult:
    """Build system ``c``, enumerate its exact risk, and run both estimators on it."""
    pair = paper_system(c, n_systems=systems, H=horizon, seed=seed)
    truth = exact(pair)
    naive = coupled_rollouts(pair, replicates, horizon, seed=seed * 1_000_003 + 2 * c)
    branch = swrb(pair, replicates, horizon, seed=seed * 1_000_003 + 2 * c + 1)
    d_h = naive.mismatch.double().mean(dim=1).numpy()
    n_mean, n_se, n_var = _mean_se(d_h)
    s_mean, s_se, s_var = _mean_se(branch.z_R.numpy())
    ratio = n_var / s_var if s_var > 0 else (float("inf") if n_var > 0 else float("nan"))
    return SystemResult(
        system=c, exact=truth.R, naive_mean=n_mean, naive_se=n_se, swrb_mean=s_mean,
        swrb_se=s_se, var_ratio=ratio, naive_evaluations=int(naive.evaluations),
        swrb_evaluations=int(branch.evaluations.sum()),
    )


def run_finite_study(
    systems: int = 24,
    replicates: int = 512,
    horizon: int = 3,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> FiniteStudyResult:
    """Run the finite-state check on systems ``c = 1..systems``."""
    check_replicates(replicates)
    check_horizon(horizon)
    if isinstance(systems, bool) or not isinstance(systems, int) or systems < 1:
        raise ValueError(f"systems must be an integer >= 1; got {systems!r}")
    if replicates < 2:
        raise ValueError(f"replicates must be >= 2 to estimate a variance; got {replicates}")
    results = []
    for c in range(1, systems + 1):
        results.append(run_system(c, systems, horizon, replicates, seed))
        if progress is not None:
            progress(c)
    return FiniteStudyResult(results, horizon=horizon, replicates=replicates, seed=seed)
