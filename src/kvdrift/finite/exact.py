"""Exact enumeration: every quantity of docs/method.md for a finite pair, by enumeration.

:func:`exact` walks the joint law of the stepwise maximal coupling and returns
:class:`ExactRisk` (R, O_H, E_H, Pi_H, C_H, F, p_s, rho, R_L, B_L), so estimators are tested
against exact values rather than against other estimators.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvdrift import checks
from kvdrift.finite.pair import FinitePair, History
from kvdrift.kernel import Side


def _effective(pair: FinitePair, side: Side, history: History) -> np.ndarray:
    """The kernel after the EOS rule: a point mass on EOS once ``history`` contains it."""
    eos = pair.eos_token_id
    if eos is not None and eos in history:
        out = np.zeros(pair.vocab_size)
        out[eos] = 1.0
        return out
    return pair.probs(side, history)


def _tv(p: np.ndarray, q: np.ndarray) -> float:
    return min(1.0, 0.5 * float(np.abs(p - q).sum()))


@dataclass(frozen=True, eq=False)
class ExactRisk:
    """Exact population quantities of a finite pair (docs/method.md sections 3, 4, 6 and 8).

    Arrays are read-only; position ``t`` (1-based) is index ``t - 1``.
    """

    R: float  # risk E[D_H] = (1/H) sum_t E[delta_t]
    O: float  # noqa: E741  first-mismatch contribution P(tau <= H) / H
    E: float  # post-divergence exposure (1/H) sum_s p_s (H - s)
    Pi: float  # post-divergence occupation (1/H) sum_t E[I_t 1{tau < t}]
    C: float  # post-divergence mismatch rate Pi / E (0 if E = 0)
    F: float  # fixed-history risk (1/H) sum_t E[f_t]
    p_tau: np.ndarray  # [H] p_s = P(tau = s)
    expected_delta: np.ndarray  # [H] E[delta_t]
    expected_fixed: np.ndarray  # [H] E[f_t]
    tau_mismatch: np.ndarray  # [H, H] at [s-1, j]: P(tau = s, I_{s+j} = 1), 0 for j > H - s
    horizon: int

    @property
    def rho(self) -> np.ndarray:
        """``[H, H]`` at ``[s-1, j]``: ``rho_{s,j} = P(I_{s+j} = 1 | tau = s)``.

        ``nan`` where ``p_s = 0`` or ``j > H - s`` (undefined).
        """
        H = self.horizon
        out = np.full((H, H), np.nan)
        for s in range(1, H + 1):
            if self.p_tau[s - 1] > 0:
                out[s - 1, : H - s + 1] = self.tau_mismatch[s - 1, : H - s + 1] / self.p_tau[s - 1]
        return out

    def R_L(self, L: int) -> float:
        """Observed contribution ``R_L = (1/H) sum_s sum_{j < l_s} P(tau=s, I_{s+j}=1)``."""
        L = checks.depth(L, self.horizon)
        return float(self.tau_mismatch[:, :L].sum() / self.horizon)

    def B_L(self, L: int) -> float:
        """Unobserved capacity ``B_L = (1/H) sum_s p_s (H - s - L + 1)_+``."""
        L = checks.depth(L, self.horizon)
        H = self.horizon
        s = np.arange(1, H + 1)
        return float((self.p_tau * np.maximum(H - s - L + 1, 0)).sum() / H)


def exact(pair: FinitePair) -> ExactRisk:
    """Enumerate the joint law of the stepwise maximal coupling of ``pair`` exactly.

    Walks every reachable pair of branch histories ``(x, y)`` up to the horizon with its
    probability (zero-probability branches pruned). At histories ``(x, y)`` the step law
    is ``P(a, a) = c(a)`` and ``P(a, b) = (p - c)(a) (q - c)(b) / e`` for ``a != b``, with
    ``p``, ``q`` the kernels after the EOS rule (a branch whose history contains EOS
    puts all its mass on EOS). Cost grows like ``V^(2H)`` in the worst case.
    """
    if not isinstance(pair, FinitePair):
        raise TypeError(f"exact() needs a FinitePair; got {type(pair).__name__}")
    H = pair.horizon
    expected_delta = np.zeros(H)
    tau_mismatch = np.zeros((H, H))
    # (x, y, tau, mass); tau = 0 while the branches have not diverged (then x == y).
    level: list[tuple[History, History, int, float]] = [((), (), 0, 1.0)]
    for t in range(1, H + 1):
        children: list[tuple[History, History, int, float]] = []
        for x, y, tau, mass in level:
            p = _effective(pair, "p", x)
            q = _effective(pair, "q", y)
            e = _tv(p, q)
            expected_delta[t - 1] += mass * e
            if tau == 0:
                tau_mismatch[t - 1, 0] += mass * e
            else:
                tau_mismatch[tau - 1, t - tau] += mass * e
            if t == H:
                continue
            c = np.minimum(p, q)
            for a in np.flatnonzero(c):
                children.append((x + (int(a),), y + (int(a),), tau, mass * float(c[a])))
            rp, rq = p - c, q - c
            res = float(rp.sum())  # = e; rp is all 0 (no parting pairs) when res is 0
            for a in np.flatnonzero(rp):
                for b in np.flatnonzero(rq):
                    children.append((x + (int(a),), y + (int(b),), tau or t,
                                     mass * float(rp[a]) * float(rq[b]) / res))
        level = children

    # Fixed-history TV depends on X alone: enumerate the reference marginal.
    expected_fixed = np.zeros(H)
    marginal: list[tuple[History, float]] = [((), 1.0)]
    for t in range(1, H + 1):
        nxt: list[tuple[History, float]] = []
        for x, mass in marginal:
            p = _effective(pair, "p", x)
            expected_fixed[t - 1] += mass * _tv(p, _effective(pair, "q", x))
            if t < H:
                nxt.extend((x + (int(a),), mass * float(p[a])) for a in np.flatnonzero(p))
        marginal = nxt

    p_tau = tau_mismatch[:, 0].copy()
    s = np.arange(1, H + 1)
    R = float(expected_delta.sum() / H)
    first = float(p_tau.sum() / H)
    E = float((p_tau * (H - s)).sum() / H)
    Pi = float(tau_mismatch[:, 1:].sum() / H)
    C = Pi / E if E > 0 else 0.0
    for arr in (p_tau, expected_delta, expected_fixed, tau_mismatch):
        arr.setflags(write=False)
    return ExactRisk(R=R, O=first, E=E, Pi=Pi, C=C, F=float(expected_fixed.sum() / H),
                     p_tau=p_tau, expected_delta=expected_delta, expected_fixed=expected_fixed,
                     tau_mismatch=tau_mismatch, horizon=H)


def exact_rho(pair: FinitePair) -> np.ndarray:
    """``rho_{s,j} = P(I_{s+j} = 1 | tau = s)`` at ``[s-1, j]`` (see :attr:`ExactRisk.rho`)."""
    return exact(pair).rho

