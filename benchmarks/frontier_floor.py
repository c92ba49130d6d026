"""The information floor: the fewest values any valid test needs to decide one budget.

For a law ``P`` of per-replicate values on ``[0, 1]`` with mean below the tolerance ``m``, a
test of the null "mean >= m" at level ``a`` must hold its level against every law of the null,
in particular against ``Q*``, the law of mean ``m`` nearest ``P`` in Kullback-Leibler divergence
(the KL projection; Honda & Takemura 2010, Agrawal et al. 2021):

    KL_inf(P) = min {KL(P, Q) : E_Q X >= m} = max_{0 <= lam <= 1/(1 - m)} E_P log(1 + lam (m - X)),

``dQ*/dP = 1 / (1 + lam* (m - X))`` plus an atom at 1 when ``lam*`` is at the end of its range.
Documents do not change it: the search's null is "the documents' average mean >= m", which
holds when every document's law is ``Q*``, and with every document's law ``P`` the round's
divergence is ``n KL_inf(P)``, the least over every split of the documents' means (``KL_inf``
is convex in ``m``), so the floor per *value* is the same for one document or twenty.

Floors for any test valid at level ``a`` (sequential or not, knowing ``P`` or not):

- *Wald's* (the data-processing inequality applied to the stopped sample): a test that decides
  with probability ``p`` under ``P`` draws on average at least ``kl(p, a) / KL_inf(P)`` values.
  Truncated at ``t`` values, a test that has decided by ``t`` in half the cases needs ``t >=
  kl(1/2, a) / KL_inf(P)``: a floor for the median.
- *Neyman-Pearson's* (sharper for the median, which the cost table reports): a test that has
  decided within ``t`` values in half the cases is a fixed-sample test on ``t`` values, so ``t``
  is at least the fewest values at which the most powerful test of ``Q*`` against ``P``
  (reject when ``S_t = sum log(dP/dQ*)(X_i) = sum log(1 + lam* (m - X_i))`` is large) has power
  1/2 at level ``a``. Its level at threshold ``k`` is ``E_P[exp(-S_t) 1{S_t >= k}]`` (an atom of
  ``Q*`` at 1 never rejects), so both sides are computed from draws of ``P`` alone.

A third floor, *the atom's*, for any law: the null holds the mixture ``Q' = (1 - q) P + q
delta_1`` of ``P`` and an atom at the top whose mean is exactly ``m`` (``q = (m - mu) / (1 -
mu)``), and ``Q'^t >= (1 - q)^t P^t`` as measures (a sample with no value from the atom is a
sample of ``P``), so a test that rejects with probability ``1/2`` under ``P`` at ``t`` values
rejects with at least ``(1 - q)^t / 2`` under ``Q'``: ``t >= log(1 / (2 a)) / log(1 / (1 -
q))``. Every test is as good as any other against ``Q'`` (their likelihood ratio is constant
off the atom), so Neyman and Pearson's test against ``Q*`` can ask fewer values than this: on
Beta(1, 19) the atom's floor is 63 values and Neyman and Pearson's 59. It depends on ``P``
only through its mean, and with every document of one law it is the same per value for any
number of documents. The floor is the larger of the two.

Beside the floors, a valid test that is not a bet: the *mean-only* fixed-sample test (Bentkus,
"On Hoeffding's inequalities", Ann. Probab. 2004). For independent values on ``[0, 1]`` whose
means average ``m`` or more, ``E (h - S)_+ <= E (h - B)_+`` for every ``h``, where ``S`` is their
sum and ``B`` is binomial with ``N`` trials of ``m`` (Hoeffding 1963: ``(h - x)_+`` is convex, so
coins are extremal, and decreasing, so the least mean is), and Markov's inequality gives the
p-value ``min_{h > S} E (h - B)_+ / (h - S)``. It pays a binomial tail (a normal quantile, not
``log(1/alpha)``) times at most ``e``, but knows only the mean: placed at the best single look
for the law, at the full level, it is what one fixed-sample look of the kind that does not
bet can do (:func:`mean_only_look`).

The "fails" side (mean above ``m``, null "mean <= m", the fails level) is the same on the
reflected values. The oracle of ``frontier_cost.py`` knows ``P``'s variance, which a test valid
for every law on ``[0, 1]`` cannot use (``Q*`` has a larger one), so the oracle may sit below
the floor.

    python benchmarks/frontier_floor.py
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

#: Grid of the two uniforms a law is drawn from (midpoints): the law's "exact" quadrature.
GRID_U, GRID_V = 100_000, 64


def quadrature(law, mean: float) -> np.ndarray:
    """Values of ``law`` on a midpoint grid of its two uniforms, each with equal weight (the
    integral of any smooth function of a value to about 1e-5)."""
    u = (np.arange(GRID_U) + 0.5) / GRID_U
    v = (np.arange(GRID_V) + 0.5) / GRID_V
    return law(u[:, None], v[None, :], mean).reshape(-1)


def _oriented(x: np.ndarray, tol: float, within: bool) -> tuple[np.ndarray, float]:
    """Values and tolerance turned so that the null is always "mean >= tol" on [0, 1]."""
    return (x, tol) if within else (1 - x, 1 - tol)


def kl_inf(x: np.ndarray, tol: float, within: bool) -> tuple[float, float]:
    """``(KL_inf, lam*)`` of the law whose quadrature values are ``x``, against the null on
    the side that ``within`` names (the mean is ``>= tol`` for ``within``, ``<= tol`` else);
    ``E log(1 + lam (tol - X))`` is concave in ``lam``: bisection on its derivative."""
    y, t = _oriented(x, tol, within)
    top = 1 / (1 - t)
    lo, hi = 0.0, top * (1 - 1e-12)

    def slope(lam: float) -> float:
        return float(np.mean((t - y) / (1 + lam * (t - y))))

    if slope(hi) >= 0:
        lam = hi
    else:
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if slope(mid) > 0 else (lo, mid)
        lam = (lo + hi) / 2
    return float(np.mean(np.log1p(lam * (t - y)))), lam


def bernoulli_kl(p: float, q: float) -> float:
    """``kl(p, q)``, the divergence between coins of means ``p`` and ``q``."""
    out = 0.0
    for a, b in ((p, q), (1 - p, 1 - q)):
        if a > 0:
            out += a * math.log(a / b)
    return out


def wald_floor(divergence: float, level: float, power: float = 0.5) -> float:
    """Wald's floor on the values (in expectation; with ``power = 1/2``, on the median)."""
    return bernoulli_kl(power, level) / divergence if divergence > 0 else math.inf


def fewest(decides, limit: int) -> int:
    """The least ``t`` (up to ``limit``) at which ``decides(t)`` holds, for a ``decides`` that
    holds from some ``t`` on: doubling from 16, then bisection."""
    hi = 16
    while hi < limit and not decides(hi):
        hi *= 2
    lo, hi = hi // 2 + 1 if hi > 16 else 1, min(hi, limit)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decides(mid) else (mid + 1, hi)
    return lo


def neyman_pearson_floor(law, mean: float, tol: float, level: float, within: bool,
                         draws: int = 10_000, seed: int = 5, limit: int = 20_000) -> int:
    """The fewest values ``t`` at which the most powerful test of ``Q*`` against ``P`` at
    ``level`` decides in half the cases (bisection over ``t``, the same draws at every ``t``:
    ``draws`` sums of ``t`` log-likelihood ratios)."""
    _, lam = kl_inf(quadrature(law, mean), tol, within)

    def decides(t: int) -> bool:
        rng = np.random.default_rng(seed)
        sums = np.zeros(draws)
        for start in range(0, t, max(1, 4_000_000 // draws)):
            k = min(t - start, max(1, 4_000_000 // draws))
            x = law(rng.random((draws, k)), rng.random((draws, k)), mean)
            y, m = _oriented(x, tol, within)
            sums += np.log1p(lam * (m - y)).sum(axis=1)
        # power exactly 1/2: reject the half of the draws with the largest sums (ties split
        # at random, as the randomised test does); its size under Q* is their mean exp(-S)
        top = np.partition(sums, draws // 2)[draws // 2:]
        return float(np.exp(-top).sum() / draws) <= level

    return fewest(decides, limit)


def mean_only_p_values(sums: np.ndarray, n: int, tol: float) -> np.ndarray:
    """Bentkus's p-values of the null "mean >= tol" for sums of ``n`` values on ``[0, 1]``:
    ``min_{h > S} E (h - B)_+ / (h - S)``, ``B`` binomial with ``n`` trials of ``tol`` (see the
    module docstring). Both numerator and denominator are linear in ``h`` between integers, so
    the least ratio over ``h > S`` is at an integer."""
    k = np.arange(n + 1)
    pmf = stats.binom.pmf(k, n, tol)
    h = np.arange(1, n + 1)
    below = np.cumsum(pmf)[:-1]  # P(B <= h - 1)
    partial = np.cumsum(k * pmf)[:-1]  # E[B; B <= h - 1]
    expected = h * below - partial  # E (h - B)_+
    gap = h - np.asarray(sums, dtype=np.float64)[..., None]
    ratio = np.where(gap > 0, expected / np.where(gap > 0, gap, 1.0), np.inf)
    return np.minimum(ratio.min(axis=-1), 1.0)


def mean_only_look(law, mean: float, tol: float, level: float, within: bool,
                   draws: int = 4_000, seed: int = 9, limit: int = 20_000) -> int:
    """The fewest values ``N`` at which the mean-only test (:func:`mean_only_p_values`), at
    ``level`` on one look of ``N`` values, decides in half the cases (bisection, the same
    draws at every ``N``)."""

    def decides(n: int) -> bool:
        rng = np.random.default_rng(seed)
        x = law(rng.random((draws, n)), rng.random((draws, n)), mean)
        y, m = _oriented(x, tol, within)
        return float(np.mean(mean_only_p_values(y.sum(axis=1), n, m) <= level)) >= 0.5

    return fewest(decides, limit)


def atom_floor(mean: float, tol: float, level: float, within: bool) -> int:
    """The atom's floor (module docstring): the fewest values at which a test valid at
    ``level`` can decide in half the cases of a law of mean ``mean``, from the null's mixture
    of that law and an atom at the end of the range past the tolerance."""
    mu, m = (mean, tol) if within else (1 - mean, 1 - tol)
    q = (m - mu) / (1 - mu)
    return math.ceil(math.log(1 / (2 * level)) / -math.log1p(-q) - 1e-9)


def floors(law, mean: float, tol: float, level: float) -> dict[str, float]:
    """The floors of a law, in values (the side its mean lies on; ``median``: the largest),
    and the mean-only test's best single look."""
    within = mean < tol
    divergence, lam = kl_inf(quadrature(law, mean), tol, within)
    out = {"kl_inf": divergence, "lam": lam,
           "wald_median": wald_floor(divergence, level),
           "np_median": float(neyman_pearson_floor(law, mean, tol, level, within)),
           "atom_median": float(atom_floor(mean, tol, level, within)),
           "mean_only": float(mean_only_look(law, mean, tol, level, within))}
    out["median"] = max(out["np_median"], out["atom_median"])
    return out


def main() -> None:
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from frontier_laws import LAWS, SCHEME, TOL  # noqa: PLC0415

    for name, law, mean in LAWS:
        level = SCHEME.certify_level if mean < TOL else SCHEME.fail_level
        f = floors(law, mean, TOL, level)
        print(f"{name}: KL_inf {f['kl_inf']:.5f} per value (lam* {f['lam']:.3f}), "
              f"Wald's median floor {f['wald_median']:.0f}, Neyman-Pearson's "
              f"{f['np_median']:.0f}, the atom's {f['atom_median']:.0f} values; the mean-only "
              f"test at its best single look {f['mean_only']:.0f}", flush=True)


if __name__ == "__main__":
    main()
