"""Time-uniform confidence bounds for the mean over documents of a bounded measure, by betting.

The estimand is ``mu = (1/n) sum_d mu_d``, the average over the ``n`` given documents of each
document's expected per-replicate value, for values known to lie in ``[low, high]``. A *round*
is one new value of every document. To test ``mu >= m`` a gambler starts with wealth 1 and, at
round ``r``, stakes a fraction ``lam_r`` (chosen from earlier rounds only) on every document's
value falling short of ``m``::

    W_t(m) = prod_{r <= t} prod_d (1 + lam_r (m - X_{d,r})),   0 <= lam_r <= c / (high - low).

When ``mu >= m`` the expected factor of a round is ``prod_d (1 + lam (m - mu_d))``, at most
``(1 + lam (m - mu))^n <= 1`` by the inequality of arithmetic and geometric means, whatever
each document's distribution: ``W(m)`` is a nonnegative supermartingale, and by Ville's
inequality it ever reaches ``1/alpha`` with probability at most ``alpha``. So ``{m : W_s(m) <
1/alpha for every s <= t}`` is a confidence sequence: it holds at every round at once, and
may be looked at after every round and stopped whenever (Waudby-Smith & Ramdas, "Estimating
means of bounded random variables by betting", JRSS-B 2024; docs/method.md section 12).

One stake sequence, tuned to the tolerance (the growth-rate-adaptive bet: the stake that
would have grown the wealth most on the rounds seen, with one pseudo-value at the middle of the
range), serves every ``m``; with ``lam >= 0`` the wealth rises with ``m``, so the bound is the
one point where it crosses ``1/alpha``. The lower bound is the upper bound of the reflected
values. :func:`stakes`, :func:`log_wealth` and :func:`ever_beyond` take any leading batch axes
(``[..., rounds, documents]``), so simulations run the same bets as the search.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

#: The largest stake, as a fraction of ``1 / (high - low)``: a round can lose at most this
#: share of the wealth per document.
MAX_STAKE = 0.9
#: The grid of stakes the adaptive bet chooses from.
STAKES = np.linspace(0.0, MAX_STAKE, 91)
#: Bisection steps for a bound (the range halved each step; 50 steps reach 1e-15 of it).
BISECTION_STEPS = 50


def rounds_of(per_look: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    """``[rounds, documents]``: each look's complete rounds, looks in order.

    Within a look, a document's ``r``-th finite value goes into round ``r``; a look gives as
    many rounds as its document with the fewest finite values has, the rest of that look is
    left out. Replicates are independent and identically distributed within a document, so
    the rounds are too (each document's values given that they are finite), and the rounds of
    a look depend on nothing the search saw before it chose to run that look.
    """
    if not per_look:
        return np.zeros((0, 0))
    docs = sorted(per_look[0])
    blocks = []
    for look in per_look:
        if sorted(look) != docs:
            raise ValueError("every look must hold the same documents")
        finite = [np.asarray(look[d], dtype=np.float64) for d in docs]
        finite = [v[np.isfinite(v)] for v in finite]
        k = min(v.size for v in finite)
        blocks.append(np.stack([v[:k] for v in finite], axis=1))
    return np.concatenate(blocks, axis=0)


def stakes(values: np.ndarray, target: float, low: float, high: float) -> np.ndarray:
    """``[..., rounds]`` stakes ``lam_r`` for testing ``mu >= target`` with ``values`` of shape
    ``[..., rounds, documents]``: each one chosen from the rounds before it only."""
    values = np.asarray(values, dtype=np.float64)
    span = high - low
    grid = STAKES / span  # [G]
    shape = values.shape[:-2]
    gains = np.broadcast_to(np.log1p(grid * (target - (low + high) / 2)), shape + grid.shape)
    gains = np.array(gains)  # the pseudo-value at the middle of the range
    out = np.empty(values.shape[:-1])
    for r in range(values.shape[-2]):
        out[..., r] = grid[np.argmax(gains, axis=-1)]
        step = target - values[..., r, None, :]  # [..., 1, n]
        gains += np.log1p(grid[:, None] * step).sum(axis=-1)
    return out


def log_wealth(values: np.ndarray, m: np.ndarray | float, bets: np.ndarray) -> np.ndarray:
    """``[..., rounds]`` log ``W_t(m)`` after each round (``m`` broadcasts over the rounds)."""
    factors = np.log1p(bets[..., None] * (np.asarray(m)[..., None] - values))
    return np.cumsum(factors.sum(axis=-1), axis=-1)


def ever_beyond(values: np.ndarray, m: float, alpha: float, target: float, low: float,
                high: float, upper: bool = True) -> np.ndarray:
    """``[...]`` whether the running bound ever passed ``m`` within the rounds of ``values``
    (``[..., rounds, documents]``): the upper bound fell below ``m`` (``upper``), or the lower
    bound rose above it; the bets tuned to ``target``. At ``m = mu`` this is a miss, which
    happens with probability at most ``alpha``."""
    values = np.asarray(values, dtype=np.float64)
    if not upper:
        values, m, target, low, high = -values, -m, -target, -high, -low
    bets = stakes(values, target, low, high)
    return (log_wealth(values, m, bets) >= np.log(1 / alpha)).any(axis=-1)


def upper_path(values: np.ndarray, alpha: float, target: float, low: float, high: float
               ) -> np.ndarray:
    """``[rounds]`` the running upper bound after each round for ``values`` of shape
    ``[rounds, documents]``: at every round at once, ``mu`` is below it with probability at
    least ``1 - alpha``."""
    values = np.asarray(values, dtype=np.float64)
    bets = stakes(values, target, low, high)
    threshold = np.log(1 / alpha)
    rounds = values.shape[0]
    below = np.tril(np.ones((rounds, rounds), dtype=bool))  # [t, r]: round r counts at t
    lo, hi = np.full(rounds, float(low)), np.full(rounds, float(high))
    for _ in range(BISECTION_STEPS):  # each round's own crossing point of 1/alpha
        mid = (lo + hi) / 2
        # [t, r] the log factor of round r at round t's point mid_t
        factors = np.log1p(bets[None, :, None] * (mid[:, None, None] - values[None])).sum(-1)
        over = np.where(below, factors, 0.0).sum(axis=1) >= threshold
        hi, lo = np.where(over, mid, hi), np.where(over, lo, mid)
    return np.minimum.accumulate(hi)


def lower_path(values: np.ndarray, alpha: float, target: float, low: float, high: float
               ) -> np.ndarray:
    """``[..., rounds]`` the running lower bound after each round (the reflected upper)."""
    return -upper_path(-np.asarray(values, dtype=np.float64), alpha, -target, -high, -low)


def first_crossing(path: np.ndarray, beyond) -> int | None:
    """The first round (1-based) at which ``beyond(bound)`` holds, or None."""
    hits = np.nonzero(beyond(path))[0]
    return int(hits[0]) + 1 if hits.size else None
