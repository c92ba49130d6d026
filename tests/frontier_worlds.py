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

    def evaluate(self, budgets: Sequence[Budget], look: int) -> dict[Budget, Sample]:
        out = {}
        for b in budgets:
            values = {}
            for d in range(self.documents):
                digest = hashlib.sha256(f"{self.seed}/{d}/{look}".encode()).digest()
                seed = int.from_bytes(digest[:7], "little")
                r = coupled_rollouts(self.pair(b.family, b, d), self.replicates, HORIZON,
                                     seed=seed)
                values[f"doc{d}"] = r.delta.numpy().mean(axis=1)
            calls = self.documents * self.replicates * HORIZON
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
