"""Finite-state worlds for the frontier search: families whose exact risk curves are known."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvdrift.estimate.rollout import coupled_rollouts
from kvdrift.finite.exact import exact
from kvdrift.finite.systems import random_pair
from kvdrift.frontier_search.betting import Bet
from kvdrift.frontier_search.families import Budget, Family, parse_family
from kvdrift.frontier_search.search import Sample

VOCAB, HORIZON = 3, 4


def drift(family: Family, budget: Budget, strength: float) -> float:
    """The mixing weight of a budget: ``strength`` times the share of cache removed."""
    return min(1.0, strength * (budget.index + 1) / (len(family.budgets) + 1))


def kv_fraction(family: Family, budget: Budget) -> float:
    return 1 - (budget.index + 1) / (len(family.budgets) + 1)


@dataclass
class FiniteEvaluator:
    """Each document a random system; a family's budget mixes ``drift`` of a far kernel into
    Q. Rollout TV per replicate is the measure; each document's seed depends on the run's
    seed, the document and the look only (common random numbers across budgets)."""

    families: dict[str, tuple[Family, float]]  # name -> (family, strength)
    documents: int
    replicates: int
    seed: int = 0
    calls: int = 0

    def pair(self, name: str, budget: Budget, doc: int):
        family, strength = self.families[name]
        return random_pair(VOCAB, HORIZON, 1000 + doc, mix=drift(family, budget, strength))

    def truth(self, name: str, budget: Budget) -> float:
        """The exact mean risk over the documents (enumeration; the same for every seed)."""
        return _truth(self.strength_of(name), len(self.families[name][0].budgets),
                      budget.index, self.documents)

    def strength_of(self, name: str) -> float:
        return self.families[name][1]

    def evaluate(self, budgets: Sequence[Budget], look: int, replicates: int
                 ) -> dict[Budget, Sample]:
        out = {}
        for b in budgets:
            values = {}
            for d in range(self.documents):
                digest = hashlib.sha256(f"{self.seed}/{d}/{look}".encode()).digest()
                seed = int.from_bytes(digest[:7], "little")
                r = coupled_rollouts(self.pair(b.family, b, d), replicates, HORIZON, seed=seed)
                values[f"doc{d}"] = r.delta.numpy().mean(axis=1)
            calls = self.documents * replicates * HORIZON
            self.calls += calls
            out[b] = Sample(values, kv_fraction(self.families[b.family][0], b), calls)
        return out


@functools.cache
def _truth(strength: float, budgets: int, index: int, documents: int) -> float:
    mix = min(1.0, strength * (index + 1) / (budgets + 1))
    return float(np.mean([exact(random_pair(VOCAB, HORIZON, 1000 + d, mix=mix)).R
                          for d in range(documents)]))


def world(strengths: dict[str, float], documents: int = 3, replicates: int = 8,
          seed: int = 0) -> FiniteEvaluator:
    return FiniteEvaluator({n: (parse_family(n), s) for n, s in strengths.items()},
                           documents, replicates, seed)


# Synthetic per-replicate values with known means: what a bound must survive.

def rare_large(u: np.ndarray, v: np.ndarray, mean: float) -> np.ndarray:
    """Mostly small values (37% in [0, 0.05], the rest 0) and rare large ones in [0.5, 1],
    with the given mean; ``u`` picks the kind, ``v`` the value (both uniform)."""
    big = (mean - 0.37 * 0.025) / 0.75
    if not 0 <= big <= 0.63:
        raise ValueError(f"rare_large cannot have mean {mean}")
    return np.where(u < big, 0.5 + 0.5 * v, np.where(u < big + 0.37, 0.05 * v, 0.0))


def zero_one(u: np.ndarray, v: np.ndarray, mean: float) -> np.ndarray:
    """Values in {0, 1} with the given mean."""
    return (u < mean).astype(float)


def rare_spread(u: np.ndarray, v: np.ndarray, mean: float) -> np.ndarray:
    """A second rare-large law: values spread over [0, 0.02], a rare few over [0.2, 1] (wider
    large values and no zeros, unlike :func:`rare_large`), with the given mean."""
    big = (mean - 0.01) / 0.59
    if not 0 <= big <= 1:
        raise ValueError(f"rare_spread cannot have mean {mean}")
    return np.where(u < big, 0.2 + 0.8 * v, 0.02 * v)


def beta_1_19(u: np.ndarray, v: np.ndarray, mean: float) -> np.ndarray:
    """Beta(1, 19) values (mean 0.05; ``mean`` is ignored), by the inverse of its law."""
    return 1 - (1 - u) ** (1 / 19)


def near(u: np.ndarray, v: np.ndarray, mean: float) -> np.ndarray:
    """Values spread evenly over [mean - 0.02, mean + 0.02] (concentrated near the mean)."""
    return mean - 0.02 + 0.04 * v


def near_rare_one(u: np.ndarray, v: np.ndarray, mean: float) -> np.ndarray:
    """Values near the mean (spread over 0.04) with a rare 1 (2% of values): near the
    tolerance, the tuned stake is small and one 1 costs it most."""
    base = (mean - 0.02) / 0.98
    if base < 0.02:
        raise ValueError(f"near_rare_one cannot have mean {mean}")
    return np.where(u < 0.02, 1.0, base - 0.02 + 0.04 * v)


@dataclass(frozen=True)
class SyntheticCase:
    """Per-document means and a value distribution; ``missing`` is each document's chance
    of a value left out (NaN). ``one_document`` puts all the risk in the first document."""

    name: str
    law: object  # (u, v, mean) -> values
    mean: float
    documents: int = 6
    one_document: bool = False
    missing: tuple[float, ...] = ()

    def doc_means(self, mean: float | None = None) -> np.ndarray:
        mean = self.mean if mean is None else mean
        if self.one_document:
            return np.array([mean * self.documents] + [0.0] * (self.documents - 1))
        return np.full(self.documents, mean)

    def draw(self, u: np.ndarray, v: np.ndarray, mean: float | None = None,
             w: np.ndarray | None = None) -> np.ndarray:
        """``[documents, K]`` values from uniforms of that shape (``w``: for missing)."""
        means = self.doc_means(mean)
        values = np.stack([self.law(u[d], v[d], means[d]) for d in range(self.documents)])
        if self.missing and w is not None:
            gone = w < np.array(self.missing)[:, None]
            values = np.where(gone, np.nan, values)
        return values


@dataclass
class SyntheticEvaluator:
    """Families whose budget ``j`` has mean ``curves[family][j]``, values of ``case``'s law;
    each look draws fresh uniforms that every budget of the look shares (common random
    numbers: budgets are dependent, as on a language model)."""

    families: dict[str, Family]
    curves: dict[str, Sequence[float]]
    case: SyntheticCase
    replicates: int
    seed: int = 0
    calls: int = 0

    def evaluate(self, budgets: Sequence[Budget], look: int, replicates: int
                 ) -> dict[Budget, Sample]:
        rng = np.random.default_rng([self.seed, look])
        shape = (self.case.documents, replicates)
        u, v, w = rng.random(shape), rng.random(shape), rng.random(shape)
        out = {}
        for b in budgets:
            values = self.case.draw(u, v, self.curves[b.family][b.index], w)
            self.calls += values.size
            out[b] = Sample({f"doc{d}": values[d] for d in range(len(values))},
                            1 - (b.index + 1) / (len(self.families[b.family].budgets) + 1),
                            values.size)
        return out


@dataclass(frozen=True)
class Issue44Bet(Bet):
    """The bet of issue 44, for comparison: its prior's mean halfway between the tolerance
    and the good end of the range, on either side."""

    def prior_mean(self, target: float, low: float, high: float) -> float:
        return (target + low) / 2


@dataclass(frozen=True)
class TodaysBet(Bet):
    """The bet before issue 44, for comparison: ``fractions`` are absolute stakes on the grid
    0..0.9 / (high - low), chosen by the growth they would have had on the rounds seen with one
    pseudo-value at the middle of the range; no hedge."""

    hedge: float = 0.0

    def fractions(self, values, target, low, high):
        values = np.asarray(values, dtype=np.float64)
        grid = np.linspace(0.0, 0.9, 91) / (high - low)
        gains = np.array(np.broadcast_to(np.log1p(grid * (target - (low + high) / 2)),
                                         values.shape[:-2] + grid.shape))
        out = np.empty(values.shape[:-1])
        for r in range(values.shape[-2]):
            out[..., r] = grid[np.argmax(gains, axis=-1)]
            gains += np.log1p(grid[:, None] * (target - values[..., r, None, :])).sum(axis=-1)
        return out

    def mixture(self, values, m, fractions, high):
        m = np.asarray(m, dtype=np.float64)
        factors = np.log1p(fractions[..., None] * (m[..., None] - values))
        return np.cumsum(factors.sum(axis=-1), axis=-1)
