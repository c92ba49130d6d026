"""Finite systems: random pairs, the paper's systems and the extremal construction.

:func:`random_pair` (Dirichlet rows), :func:`paper_system` (system ``c`` of the paper's
finite-state check, docs/method.md section 11) and :func:`extremal_pair` (the pair that attains
``R = R_L + alpha * B_L``, docs/method.md section 6). Method: arXiv 2609.16617.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from kvdrift import checks
from kvdrift.finite.pair import FinitePair, History


def _histories(vocab_size: int, horizon: int) -> Iterator[History]:
    """Every history that a kernel is evaluated on (lengths 0..H-1), shortest first."""
    for length in range(horizon):
        yield from itertools.product(range(vocab_size), repeat=length)



def _as_rng(seed: int | np.random.Generator) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(checks.integer(seed, "seed", 0))


def random_pair(
    vocab_size: int,
    horizon: int,
    seed: int | np.random.Generator,
    *,
    mix: float = 0.5,
    concentration: float = 1.0,
    eos_token_id: int | None = None,
) -> FinitePair:
    """A random finite system: ``Q = (1 - mix) P + mix A`` with Dirichlet rows ``P``, ``A``.

    For every history of length ``0..H-1`` (shortest first, then lexicographic), ``P`` and
    ``A`` are independent ``Dirichlet(concentration)`` rows, so ``mix`` sets how far the
    intervention drifts (0: identical kernels). Small ``concentration`` gives sparse rows
    (useful to exercise zero-probability tokens). With ``eos_token_id`` the rows give EOS
    mass as any other token, and histories containing EOS get a point mass on EOS.
    """
    vocab_size = checks.integer(vocab_size, "vocab_size", 1)
    horizon = checks.integer(horizon, "horizon", 1)
    checks.number(mix, "mix", 0, 1)
    checks.number(concentration, "concentration", 0, open_lo=True)
    rng = _as_rng(seed)
    p_table: dict[History, np.ndarray] = {}
    q_table: dict[History, np.ndarray] = {}
    for history in _histories(vocab_size, horizon):
        p_row = rng.dirichlet(np.full(vocab_size, float(concentration)))
        a_row = rng.dirichlet(np.full(vocab_size, float(concentration)))
        if eos_token_id is not None and eos_token_id in history:
            continue  # absorbed: from_tables supplies the point mass
        p_table[history] = p_row
        q_table[history] = (1.0 - mix) * p_row + mix * a_row
    return FinitePair.from_tables(p_table, q_table, vocab_size, horizon, eos_token_id,
                                  info={"kind": "random", "mix": mix,
                                        "concentration": concentration})


def paper_system(c: int, n_systems: int = 24, H: int = 3, seed: int = 0) -> FinitePair:
    """System ``c`` of the paper's finite-state check (docs/method.md section 11).

    Binary tokens. For every prefix (lengths ``0..H-1``, shortest first, then
    lexicographic) ``P`` and ``A`` are independent normalised ``Gamma(1.5, 1) + 0.05``
    weights (``P`` drawn first); ``Q = (1 - lambda) P + lambda A`` with
    ``lambda = (0.05 + 0.45 c / n_systems) * U * V``, ``U ~ Unif[0.5, 1]`` and
    ``V ~ Unif[0, 1]`` drawn once, before the rows. The generator is
    ``numpy.random.default_rng([seed, c])``, so a system depends only on ``(seed, c)``
    (and ``H``). ``info`` records ``c``, ``lambda``, ``u`` and ``v``.
    """
    n_systems = checks.integer(n_systems, "n_systems", 1)
    c = checks.integer(c, "c", 1, n_systems)
    H = checks.integer(H, "H", 1)
    seed = checks.integer(seed, "seed", 0)
    rng = np.random.default_rng([seed, c])
    u = float(rng.uniform(0.5, 1.0))
    v = float(rng.uniform(0.0, 1.0))
    lam = (0.05 + 0.45 * c / n_systems) * u * v
    p_table: dict[History, np.ndarray] = {}
    q_table: dict[History, np.ndarray] = {}
    for history in _histories(2, H):
        p_w = rng.gamma(1.5, 1.0, size=2) + 0.05
        a_w = rng.gamma(1.5, 1.0, size=2) + 0.05
        p_row, a_row = p_w / p_w.sum(), a_w / a_w.sum()
        p_table[history] = p_row
        q_table[history] = (1.0 - lam) * p_row + lam * a_row
    info = {"kind": "paper", "c": c, "n_systems": n_systems, "seed": seed,
            "lambda": lam, "u": u, "v": v}
    return FinitePair.from_tables(p_table, q_table, 2, H, info=info)



def extremal_pair(
    p_tau: Sequence[float] | np.ndarray,
    rho: Sequence[Sequence[float]] | np.ndarray,
    L: int,
    alpha: float,
) -> FinitePair:
    """The binary pair that attains ``R = R_L + alpha * B_L`` for given ``(p, rho)``.

    ``P_t(0|.) = 1``, so ``X_t = 0`` and ``I_t = Y_t``. With ``Sbar_t = 1 - sum_{j<t} p_j``
    and ``eta_t = p_t / Sbar_t`` (0 if ``Sbar_t = 0``), and ``s(y)`` the first position
    with ``y = 1``: ``Q_t(1|y_<t) = eta_t`` before any 1; ``rho_{s,t-s}`` while
    ``t - s < l_s = min(L, H - s + 1)``; ``alpha`` after. Sweeping ``alpha`` over
    ``[0, 1]`` sweeps the sharp interval ``[R_L, R_L + B_L]``.

    Parameters
    ----------
    p_tau
        ``[H]`` first-mismatch probabilities ``p_s``, non-negative, summing to at most 1.
    rho
        ``[H, >= L]`` with ``rho[s-1, j] = rho_{s,j}``. Entries with ``j < l_s`` of rows
        with ``p_s > 0`` are used and must lie in ``[0, 1]`` with ``rho_{s,0} = 1``; other
        entries are ignored and may be ``nan`` (as in :attr:`ExactRisk.rho`).
    L
        Observation depth in ``1..H``.
    alpha
        Post-window mismatch rate in ``[0, 1]``.
    """
    p_arr = np.asarray(p_tau, dtype=float)
    if p_arr.ndim != 1 or p_arr.size < 1:
        raise ValueError(f"p_tau must be a non-empty 1-D array; got shape {p_arr.shape}")
    H = p_arr.size
    tol = 1e-12
    if not np.isfinite(p_arr).all() or (p_arr < 0).any() or p_arr.sum() > 1 + tol:
        raise ValueError(f"p_tau must be finite, non-negative and sum to at most 1; got "
                         f"{p_arr.tolist()} (sum {p_arr.sum():.6g})")
    L = checks.depth(L, H)
    checks.number(alpha, "alpha (post-window mismatch rate)", 0, 1)
    rho_arr = np.asarray(rho, dtype=float)
    if rho_arr.ndim != 2 or rho_arr.shape[0] != H or rho_arr.shape[1] < L:
        raise ValueError(f"rho must have shape [H, >= L] = [{H}, >= {L}]; got {rho_arr.shape}")
    if (rho_arr < 0).any() or (rho_arr > 1).any():  # nan compares False: allowed here
        raise ValueError(f"rho entries must lie in [0, 1]; got {rho_arr.tolist()}")
    depth = [min(L, H - s + 1) for s in range(1, H + 1)]
    for s in np.flatnonzero(p_arr) + 1:  # only rows with p_s > 0 are used
        used = rho_arr[s - 1, : depth[s - 1]]
        if np.isnan(used).any():
            raise ValueError(f"rho[{s - 1}, :{depth[s - 1]}] is used (p_{s} > 0) and must not "
                             f"be nan; got {used.tolist()}")
        if abs(used[0] - 1.0) > tol:
            raise ValueError(f"rho_{{s,0}} must be 1 (a mismatch at tau); rho[{s - 1}, 0] = "
                             f"{used[0]}")
    survive = 1.0 - np.concatenate([[0.0], np.cumsum(p_arr)[:-1]])
    eta = np.divide(p_arr, survive, out=np.zeros(H), where=survive > 0)
    eta = np.minimum(eta, 1.0)  # p_t / Sbar_t can round to 1 + 2^-52
    alpha = float(alpha)

    def q(history: History) -> list[float]:
        t = len(history) + 1
        if 1 in history:
            s = history.index(1) + 1
            one = float(rho_arr[s - 1, t - s]) if t - s < depth[s - 1] else alpha
            if math.isnan(one):  # unreachable row (p_s = 0): any value is compatible
                one = 0.0
        else:
            one = float(eta[t - 1])
        return [1.0 - one, one]

    info = {"kind": "extremal", "L": L, "alpha": alpha}
    return FinitePair(lambda history: [1.0, 0.0], q, 2, H, info=info)
