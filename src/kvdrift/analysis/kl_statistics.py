"""Teacher-forced KL statistics in the shape ``llama-perplexity --kl-divergence`` prints them.

llama.cpp users choose a quant by ``llama-perplexity --kl-divergence``: the KL from the base
model's next-token distribution to the quantized one's at every position of a fixed text, then
its mean (with a standard error), maximum, percentiles and minimum, and "same top p", the share
of positions where both models' most likely tokens agree. kvdrift records the same two numbers
at every position along P's own generated text X (``kl`` = KL(P || Q), ``top1``), so the same
statistics come from its records, beside tau and R, with the same definitions; the text is P's
generation rather than a corpus. The standard errors, like llama-perplexity's, treat positions
as independent (they are not: positions of one generation are correlated), so read them as
llama.cpp's are read, and the report's intervals for inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: The percentiles llama-perplexity prints, highest first.
KL_PERCENTILES = (99.9, 99.0, 95.0, 90.0, 50.0, 10.0, 5.0, 1.0, 0.1)


@dataclass(frozen=True)
class KLStatistics:
    """One action's teacher-forced KL over every recorded position along X."""

    action: str
    positions: int
    mean: float
    mean_se: float
    maximum: float
    percentiles: dict[float, float]  # percentile (99.9, ..., 0.1) -> KL
    minimum: float
    same_top: float  # share of positions whose arg-maxes agree
    same_top_se: float


def kl_statistics(steps: pd.DataFrame) -> list[KLStatistics]:
    """Per action (in the order first seen), the statistics of ``kl`` and ``top1`` over the
    rows of ``steps`` where they are recorded (rollouts, up to X's end)."""
    if not {"action", "kl", "top1"} <= set(steps.columns):
        return []
    out = []
    for action, group in steps.groupby("action", sort=False):
        kl = group["kl"].to_numpy(dtype=float)
        top = group["top1"].to_numpy(dtype=float)
        kept = np.isfinite(kl) & np.isfinite(top)
        kl, top = kl[kept], top[kept]
        n = int(kl.size)
        if n == 0:
            continue
        same = float(top.mean())
        out.append(KLStatistics(
            action=str(action), positions=n, mean=float(kl.mean()),
            mean_se=float(kl.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
            maximum=float(kl.max()),
            percentiles={p: float(np.percentile(kl, p)) for p in KL_PERCENTILES},
            minimum=float(kl.min()), same_top=same,
            same_top_se=float(np.sqrt(same * (1 - same) / n))))
    return out


def kl_rows(stats: list[KLStatistics]) -> list[dict[str, float | str | int]]:
    """The statistics as rows of plain values (for a table or JSON)."""
    rows = []
    for s in stats:
        row: dict[str, float | str | int] = {"action": s.action, "positions": s.positions,
                                             "mean KLD": s.mean, "± (mean)": s.mean_se,
                                             "max KLD": s.maximum}
        row |= {f"{p:g}% KLD": v for p, v in s.percentiles.items()}
        row |= {"min KLD": s.minimum, "same top": s.same_top, "± (same top)": s.same_top_se}
        rows.append(row)
    return rows
