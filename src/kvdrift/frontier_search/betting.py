"""Time-uniform confidence bounds for the mean over documents of a bounded measure, by betting.

The estimand is ``mu = (1/n) sum_d mu_d``, the average over the ``n`` given documents of each
document's expected per-replicate value, for values known to lie in ``[low, high]``. A *round*
is one new value of every document. To test ``mu >= m`` a gambler starts with wealth 1 and, at
round ``r``, stakes a fraction ``s_r`` of the most it may stake, ``1 / (high - m)``, on every
document's value falling short of ``m`` (``s_r`` chosen from earlier rounds only)::

    W_t(m) = prod_{r <= t} prod_d (1 + s_r (m - X_{d,r}) / (high - m)),   0 <= s_r <= c < 1.

When ``mu >= m`` the expected factor of a round is ``prod_d (1 + lam (m - mu_d))`` with
``lam = s_r / (high - m)``, at most ``(1 + lam (m - mu))^n <= 1`` by the inequality of
arithmetic and geometric means, whatever each document's distribution; a factor is never below
``1 - c``. So ``W(m)`` is a nonnegative supermartingale, and so is any fixed mixture of such
wealths: by Ville's inequality it ever reaches ``1/alpha`` with probability at most ``alpha``,
and ``{m : W_s(m) < 1/alpha for every s <= t}`` is a confidence sequence, valid at every round
at once (Waudby-Smith & Ramdas, "Estimating means of bounded random variables by betting",
JRSS-B 2024; docs/method.md section 12). Each factor rises with ``m``, so the bound is the one
point where the wealth first reaches ``1/alpha``. The lower bound is the upper bound of the
reflected values.

The stakes (:class:`Bet`) mix two of the paper's strategies: with weight ``1 - hedge``, the
growth-rate-optimal plug-in stake tuned to the tolerance (the fraction that would have grown
the wealth at the tolerance most on the rounds seen), its prior ``prior_values`` pseudo-values
of the least favourable law (``{low, high}`` values) whose mean lies halfway between the
tolerance and the good end, or nearer the tolerance when the bad end is nearer still
(:meth:`Bet.prior_mean`), so the first round already bets on either side; with weight
``hedge``, constant fractions (the paper's diversified Kelly bet), so the bound also moves for
values near the tolerance, where the tuned stake is small. Scaling stakes by ``1 / (high - m)``
(the paper's truncation) rather than ``1 / (high - low)`` lets a round of values at the good
end gain ``log(1 + c (m - low) / (high - m))`` instead of ``log(1 + c (m - low) / (high -
low))``. Every function takes any leading batch axes (``[..., rounds, documents]``), so
simulations run the same bets as the search.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: Bisection steps for a bound (the range halved each step; 40 steps reach 1e-12 of it).
BISECTION_STEPS = 40
#: Above this many values x stakes, the plug-in stakes are found one round at a time.
VECTOR_LIMIT = 2_000_000


@dataclass(frozen=True)
class Bet:
    """How the stakes are chosen (see the module docstring): a plug-in stake tuned to the
    tolerance, mixed with constant fractions; ``max_fraction`` is ``c``."""

    max_fraction: float = 0.95
    prior_values: float = 24.0
    hedge: float = 0.05
    hedge_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)
    grid: int = 96  # fractions the plug-in stake chooses from, 0 to max_fraction

    def __post_init__(self) -> None:
        if not 0 < self.max_fraction < 1 or not 0 <= self.hedge < 1:
            raise ValueError(f"a bet needs 0 < max_fraction < 1 and 0 <= hedge < 1; got "
                             f"{self.max_fraction}, {self.hedge}")
        if any(not 0 < f <= self.max_fraction for f in self.hedge_fractions):
            raise ValueError(f"hedge fractions must lie in (0, {self.max_fraction}]; got "
                             f"{self.hedge_fractions}")

    def prior_mean(self, target: float, low: float, high: float) -> float:
        """The mean of the plug-in stake's prior law: the target moved towards the good end
        (``low``) halfway, but no farther than the bad end (``high``) is from it. Moved
        halfway always (issue 44), a side whose good end is far (the "beyond" side of a small
        tolerance) started from stakes fit for values far past the tolerance, and every small
        value early on halved its wealth (issue 50)."""
        return target - min((target - low) / 2, high - target)

    def fractions(self, values: np.ndarray, target: float, low: float, high: float
                  ) -> np.ndarray:
        """``[..., rounds]`` the plug-in fractions ``s_r`` for testing ``mu >= target`` with
        ``values`` of shape ``[..., rounds, documents]``, each from the rounds before it."""
        values = np.asarray(values, dtype=np.float64)
        grid = np.linspace(0.0, self.max_fraction, self.grid)  # [G]
        lam = grid / _room(target, low, high)
        p = (self.prior_mean(target, low, high) - low) / (high - low)  # prior's share at high
        prior = self.prior_values * ((1 - p) * np.log1p(lam * (target - low))
                                     + p * np.log1p(lam * (target - high)))
        if values.size * grid.size <= VECTOR_LIMIT:  # every round's gains at once
            steps = np.log1p(lam * (target - values[..., None])).sum(axis=-2)  # [..., R, G]
            gains = np.cumsum(steps, axis=-2) - steps + prior
            return grid[np.argmax(gains, axis=-1)]
        gains = np.array(np.broadcast_to(prior, values.shape[:-2] + grid.shape))
        out = np.empty(values.shape[:-1])
        for r in range(values.shape[-2]):  # large batches: one round at a time
            out[..., r] = grid[np.argmax(gains, axis=-1)]
            gains += np.log1p(lam[:, None] * (target - values[..., r, None, :])).sum(axis=-1)
        return out

    def log_wealth(self, values: np.ndarray, m: np.ndarray | float, target: float,
                   low: float, high: float) -> np.ndarray:
        """``[..., rounds]`` log ``W_t(m)`` after each round of ``values`` (``[..., rounds,
        documents]``); ``m`` is a number or broadcasts against ``[..., rounds]`` (one point
        per round: each round's own ``m`` applied to every round)."""
        values = np.asarray(values, dtype=np.float64)
        return self.mixture(values, m, self.fractions(values, target, low, high), high)

    def mixture(self, values: np.ndarray, m: np.ndarray | float, fractions: np.ndarray,
                high: float) -> np.ndarray:
        """:meth:`log_wealth` with the plug-in ``fractions`` already chosen."""
        if not self.hedge:
            return _log_wealth(values, m, fractions, high)
        k = len(self.hedge_fractions)
        axes = (...,) + (None,) * fractions.ndim  # [K] -> [K, 1, ..., 1]
        constant = np.broadcast_to(np.array(self.hedge_fractions)[axes], (k,) + fractions.shape)
        stacked = np.concatenate([fractions[None], constant])  # [K + 1, ..., rounds]
        weights = np.array([1 - self.hedge] + [self.hedge / k] * k)
        parts = _log_wealth(values, m, stacked, high)  # [K + 1, ..., rounds]
        return np.logaddexp.reduce(parts + np.log(weights)[axes], axis=0)


#: The search's bet.
BET = Bet()


def _room(m: np.ndarray | float, low: float, high: float) -> np.ndarray | float:
    """``high - m``, kept away from 0 (a stake scales as its inverse)."""
    return np.maximum(high - np.asarray(m, dtype=np.float64), 1e-12 * (high - low))


def _log_wealth(values: np.ndarray, m: np.ndarray | float, fractions: np.ndarray,
                high: float) -> np.ndarray:
    """``[..., rounds]`` log wealth with ``fractions`` ``[..., rounds]`` of ``1/(high - m)``."""
    m = np.asarray(m, dtype=np.float64)
    lam = fractions / np.maximum(high - m, 1e-300)  # broadcasts [..., rounds]
    factors = np.log1p(lam[..., None] * (m[..., None] - values))
    return np.cumsum(factors.sum(axis=-1), axis=-1)


def rounds_of(per_look: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    """``[rounds, documents]``: each look's complete rounds, looks in order.

    Within a look, a document's ``r``-th value goes into round ``r``; NaN marks a value absent
    by design (a document without an answer) and is left out. A look gives as many rounds as
    its document with the fewest values has; the rest of that look is left out. Replicates are
    independent and identically distributed within a document, so the rounds are too, and the
    rounds of a look depend on nothing the search saw before it chose to run that look.
    """
    if not per_look:
        return np.zeros((0, 0))
    docs = sorted(per_look[0])
    blocks = []
    for look in per_look:
        if sorted(look) != docs:
            raise ValueError("every look must hold the same documents")
        present = [np.asarray(look[d], dtype=np.float64) for d in docs]
        present = [v[~np.isnan(v)] for v in present]
        k = min(v.size for v in present)
        blocks.append(np.stack([v[:k] for v in present], axis=1))
    return np.concatenate(blocks, axis=0)


def _reflect(values, m, target, low, high, upper: bool):
    """The lower side as the upper side of the reflected values."""
    values = np.asarray(values, dtype=np.float64)
    if upper:
        return values, m, target, low, high
    return -values, -np.asarray(m, dtype=np.float64), -target, -high, -low


def log_wealth_at(values: np.ndarray, m: float, target: float, low: float, high: float,
                  upper: bool = True, bet: Bet = BET) -> np.ndarray:
    """``[..., rounds]`` the log wealth against ``m`` on the side that ``upper`` names: for
    the upper bound, of the bet that ``mu < m``; for the lower, that ``mu > m``."""
    values, m, target, low, high = _reflect(values, m, target, low, high, upper)
    return bet.log_wealth(values, m, target, low, high)


def first_round_beyond(values: np.ndarray, m: float, alpha: float, target: float,
                       low: float, high: float, upper: bool = True, bet: Bet = BET
                       ) -> np.ndarray:
    """``[...]`` the first round (1-based) at which the running bound passed ``m`` (the upper
    bound fell to ``m`` or below, or the lower bound rose to ``m`` or above), 0 if none."""
    hit = log_wealth_at(values, m, target, low, high, upper, bet) >= np.log(1 / alpha)
    return np.where(hit.any(axis=-1), hit.argmax(axis=-1) + 1, 0)


def ever_beyond(values: np.ndarray, m: float, alpha: float, target: float, low: float,
                high: float, upper: bool = True, bet: Bet = BET) -> np.ndarray:
    """``[...]`` whether the running bound ever passed ``m`` within the rounds of ``values``
    (``[..., rounds, documents]``), the bets tuned to ``target``. At ``m = mu`` this is a
    miss, which happens with probability at most ``alpha``."""
    return first_round_beyond(values, m, alpha, target, low, high, upper, bet) > 0


def bound(values: np.ndarray, alpha: float, target: float, low: float, high: float,
          upper: bool = True, bet: Bet = BET) -> float:
    """The running bound after the last round of ``values`` (``[rounds, documents]``): the
    upper bound (``upper``) or the lower; at every round at once, ``mu`` lies on its side of
    it with probability at least ``1 - alpha``. No rounds: the end of the range."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape[0] == 0:
        return float(high if upper else low)
    v, _, t, lo, hi = _reflect(values, 0.0, target, low, high, upper)
    threshold = np.log(1 / alpha)
    fractions = bet.fractions(v, t, lo, hi)
    a, b = lo, hi  # working coordinates: the upper bound lies in [a, b]
    for _ in range(BISECTION_STEPS):
        mid = (a + b) / 2
        if (bet.mixture(v, mid, fractions, hi) >= threshold).any():
            b = mid
        else:
            a = mid
    return float(b if upper else -b)


def bound_path(values: np.ndarray, alpha: float, target: float, low: float, high: float,
               upper: bool = True, bet: Bet = BET) -> np.ndarray:
    """``[rounds]`` the running bound after each round (for figures and tests)."""
    return np.array([bound(values[:t], alpha, target, low, high, upper, bet)
                     for t in range(1, len(values) + 1)])


def rounds_to_certify(documents: int, alpha: float, target: float, low: float, high: float,
                      limit: int, bet: Bet = BET) -> int | None:
    """The fewest rounds after which the upper bound reaches ``target`` when every value is
    ``low`` (the best any data can do), or None if more than ``limit`` are needed."""
    rounds = 64
    while True:  # doubling: a few short computations, not one of ``limit`` rounds
        rounds = min(rounds, limit)
        values = np.full((rounds, documents), float(low))
        hit = bet.log_wealth(values, target, target, low, high) >= np.log(1 / alpha)
        if hit.any():
            return int(hit.argmax()) + 1
        if rounds == limit:
            return None
        rounds *= 4


def rounds_suggested(values: np.ndarray, alpha: float, target: float, low: float, high: float,
                     upper: bool = True, bet: Bet = BET) -> float:
    """Roughly how many more rounds the values so far suggest the certifying bound needs to
    reach ``target``: the wealth still missing over the best constant stake's growth per
    round on these values (inf when no stake grows: the estimate is not within)."""
    v, m, t, lo, hi = _reflect(values, target, target, low, high, upper)
    if v.shape[0] == 0:
        return float("nan")
    missing = np.log(1 / alpha) - float(bet.log_wealth(v, m, t, lo, hi)[-1])
    if missing <= 0:
        return 0.0
    grid = np.linspace(0.0, bet.max_fraction, bet.grid)[1:]
    lam = grid / _room(m, lo, hi)
    growth = np.log1p(lam[:, None] * (m - v.reshape(-1))).mean(axis=1) * v.shape[1]
    best = float(growth.max())
    return missing / best if best > 0 else float("inf")
