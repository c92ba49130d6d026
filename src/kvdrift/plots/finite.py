"""The finite-state check's figure, in the style of the paper's Figure 4."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import kvdrift.plots  # noqa: F401  (selects the Agg backend)
from kvdrift.finite_study import FiniteStudyResult


def plot_finite_study(result: FiniteStudyResult, path: str | Path) -> Path:
    """Left: both estimators (mean +- 2 SE) against exact risk. Right: sorted variance ratios."""
    path = Path(path)
    exact = np.array([s.exact for s in result.systems])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    lim = [0, max(exact.max(), max(s.naive_mean for s in result.systems)) * 1.1 + 1e-3]
    left.plot(lim, lim, color="0.6", lw=1, ls="--", label="estimate = exact")
    left.errorbar(exact, [s.naive_mean for s in result.systems],
                  yerr=[2 * s.naive_se for s in result.systems], fmt="o", ms=4, capsize=2,
                  label="complete coupled rollouts (naive)", color="tab:orange")
    left.errorbar(exact, [s.swrb_mean for s in result.systems],
                  yerr=[2 * s.swrb_se for s in result.systems], fmt="s", ms=4, capsize=2,
                  label="SWRB", color="tab:blue")
    left.set_xlabel("exact risk R (enumeration)")
    left.set_ylabel("estimated risk (mean ± 2 SE)")
    left.set_title(f"{len(result.systems)} binary systems, H = {result.horizon}, "
                   f"{result.replicates} replicates")
    left.legend(fontsize=8, loc="upper left")

    ratios = np.sort(result.var_ratios)
    right.bar(np.arange(1, ratios.size + 1), ratios, color="tab:blue")
    right.axhline(result.median_var_ratio, color="k", lw=1,
                  label=f"median {result.median_var_ratio:.1f}")
    right.set_yscale("log")
    undefined = len(result.systems) - ratios.size
    right.set_xlabel("system (sorted by variance ratio)" + (
        f"; {undefined} undefined (left out)" if undefined else ""))
    right.set_ylabel("variance ratio naive / SWRB (log scale)")
    right.set_title(f"cost ×{result.cost_ratio:.2f}, variance-cost advantage "
                    f"{result.advantage:.1f}")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
