"""Exact laws of the two estimators' per-replicate outputs on a finite pair.

On a small finite system the naive estimator's per-replicate value ``D_H`` and SWRB's
``Z^R = M * D_J`` take finitely many values, so their laws (and hence means, variances
and expected costs) can be enumerated. Tests use this to check estimators and the
finite-state summary against exact variances; ``docs/finite-state.md`` uses it to explain
the variance ratios of ``kvdrift finite-state``. EOS is not supported (the paper's systems
have none). Cost grows like ``V^(3H)``: meant for binary systems with ``H <= 4``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdrift.finite.pair import FinitePair, History


@dataclass(frozen=True)
class Law:
    """A finite law: ``values[i]`` with probability ``probs[i]``."""

    values: np.ndarray
    probs: np.ndarray

    @classmethod
    def from_dict(cls, law: dict[float, float]) -> Law:
        keys = sorted(law)
        return cls(np.array(keys), np.clip(np.array([law[k] for k in keys]), 0.0, None))

    @property
    def mean(self) -> float:
        return float((self.values * self.probs).sum())

    @property
    def var(self) -> float:
        return float((self.values**2 * self.probs).sum() - self.mean**2)

    @property
    def fourth_central(self) -> float:
        return float(((self.values - self.mean) ** 4 * self.probs).sum())

    def sample_var_se(self, n: int) -> float:
        """Standard error of the ``ddof=1`` sample variance of ``n`` draws (large-n formula)."""
        return float(np.sqrt(max(self.fourth_central - self.var**2, 0.0) / n))


@dataclass(frozen=True)
class EstimatorLaws:
    """Per-replicate laws of the naive ``D_H``, of ``(1/H) sum_t delta_t`` along the same
    rollouts, and of SWRB's ``Z^R``, with SWRB's expected kernel-pair evaluations."""

    naive: Law
    naive_delta: Law
    swrb: Law
    swrb_evaluations: float
    horizon: int


def _step(pair: FinitePair, x: History, y: History):
    if pair.eos_token_id is not None:
        raise ValueError("estimator laws are enumerated for pairs without EOS only")
    p, q = pair.probs("p", x), pair.probs("q", y)
    c = np.minimum(p, q)
    return p, q, c, min(1.0, 0.5 * float(np.abs(p - q).sum()))


def _add(law: dict[float, float], value: float, mass: float) -> None:
    key = round(value, 12)
    law[key] = law.get(key, 0.0) + mass


def _rollout_laws(pair: FinitePair, x: History, y: History, t: int, count: int,
                  delta_sum: float, mass: float, d_law: dict, g_law: dict) -> None:
    """Laws of the mismatch fraction and mean TV of the coupling run from position ``t``
    (histories of length ``t - 1``, ``count`` mismatches and ``delta_sum`` so far)."""
    H = pair.horizon
    if t > H:
        _add(d_law, count / H, mass)
        _add(g_law, delta_sum / H, mass)
        return
    p, q, c, e = _step(pair, x, y)
    for a in np.flatnonzero(c):
        _rollout_laws(pair, x + (int(a),), y + (int(a),), t + 1, count, delta_sum + e,
                      mass * c[a], d_law, g_law)
    if e > 0:
        rp, rq = p - c, q - c
        for a in np.flatnonzero(rp):
            for b in np.flatnonzero(rq):
                _rollout_laws(pair, x + (int(a),), y + (int(b),), t + 1, count + 1,
                              delta_sum + e, mass * rp[a] * rq[b] / e, d_law, g_law)


def estimator_laws(pair: FinitePair) -> EstimatorLaws:
    """Enumerate both estimators' per-replicate laws on ``pair`` (docs/method.md section 7)."""
    H = pair.horizon
    d_law: dict[float, float] = {}
    g_law: dict[float, float] = {}
    _rollout_laws(pair, (), (), 1, 0, 0.0, 1.0, d_law, g_law)

    z_law: dict[float, float] = {}
    cost = 0.0
    # Shared prefixes U of the overlap scan: (U, probability, survival, weights so far).
    stack: list[tuple[History, float, float, list[float]]] = [((), 1.0, 1.0, [])]
    while stack:
        u, mass, survival, w = stack.pop()
        if len(u) < H and survival > 0:
            p, q, c, e = _step(pair, u, u)
            w_next, s_next = w + [survival * e], survival * (1.0 - e) if e < 1 else 0.0
            if len(u) + 1 == H or s_next == 0 or e == 1:
                stack.append((u, mass, 0.0, w_next))  # the scan stops here
                continue
            for a in np.flatnonzero(c):
                stack.append((u + (int(a),), mass * c[a] / (1.0 - e), s_next, w_next))
            continue
        M, scanned = float(sum(w)), len(w)
        if M == 0:
            _add(z_law, 0.0, mass)
            cost += mass * scanned
            continue
        for j, wj in enumerate(w, start=1):
            if wj == 0:
                continue
            pj = mass * wj / M
            cost += pj * (scanned + H - j)
            prefix = u[: j - 1]
            p, q, c, e = _step(pair, prefix, prefix)
            rp, rq = p - c, q - c
            for a in np.flatnonzero(rp):
                for b in np.flatnonzero(rq):
                    cont: dict[float, float] = {}
                    _rollout_laws(pair, prefix + (int(a),), prefix + (int(b),), j + 1, 1, 0.0,
                                  1.0, cont, {})
                    for d, pd in cont.items():
                        _add(z_law, M * d, pj * rp[a] * rq[b] / (e * e) * pd)
    return EstimatorLaws(Law.from_dict(d_law), Law.from_dict(g_law), Law.from_dict(z_law),
                         swrb_evaluations=cost, horizon=H)
