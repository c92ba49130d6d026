"""Finite-state kernel pairs and the exact truth they allow (DESIGN.md, "two worlds").

P and Q are explicit next-token tables over a small vocabulary and horizon. Here every
quantity of SPEC.md (R, O_H, E_H, Pi_H, C_H, F, p_s, rho, R_L, B_L) can be computed
exactly by enumerating the joint law of the stepwise maximal coupling, so estimators
are tested against exact values rather than against other estimators.

Contents: :class:`FinitePair` (the :class:`~kvdrift.kernel.KernelPair` of a table),
random systems (:func:`random_pair`, :func:`paper_system`), exact enumeration
(:func:`exact` -> :class:`ExactRisk`) and the extremal construction of SPEC.md
section 5 (:func:`extremal_pair`). Method: arXiv 2609.16617.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from kvdrift.coupling import check_probs
from kvdrift.kernel import Side, check_side

History = tuple[int, ...]
ProbFn = Callable[[History], Sequence[float] | np.ndarray | torch.Tensor]


def _check_int(value: Any, name: str, low: int, high: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer in ``[low, high]``, else raise."""
    allowed = f">= {low}" if high is None else f"in {low}..{high}"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer {allowed}; got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer {allowed}; got {value}")
    return int(value)


def _histories(vocab_size: int, horizon: int) -> Iterator[History]:
    """Every history that a kernel is evaluated on (lengths 0..H-1), shortest first."""
    for length in range(horizon):
        yield from itertools.product(range(vocab_size), repeat=length)


@dataclass(frozen=True)
class FinitePath:
    """Path state of a :class:`FinitePair`: the side and one generated history per row."""

    side: Side
    histories: tuple[History, ...]

    def __len__(self) -> int:
        return len(self.histories)


class FinitePair:
    """A kernel pair given by two next-token functions on finite histories.

    Parameters
    ----------
    p, q
        ``history -> probs``: the reference and intervention next-token distributions
        (a length-``vocab_size`` sequence summing to 1) after a tuple of token ids.
        Each history is evaluated at most once per side (memoised), validated with
        :func:`kvdrift.coupling.check_probs` and renormalised to sum exactly to 1.
    vocab_size
        Number of tokens ``V >= 1`` (the method's bounds assume ``V >= 2``).
    horizon
        Number of generated positions ``H >= 1``; kernels are evaluated on histories of
        length ``0..H-1``.
    eos_token_id
        Absorbing end-of-sequence token, or ``None``. As the protocol says, the pair does
        not absorb: estimators (and :func:`exact`) apply the rule.
    info
        Free-form description of how the system was made (e.g. the mixing weight of
        :func:`paper_system`); read-only.
    """

    def __init__(
        self,
        p: ProbFn,
        q: ProbFn,
        vocab_size: int,
        horizon: int,
        eos_token_id: int | None = None,
        *,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        self._vocab_size = _check_int(vocab_size, "vocab_size", 1)
        self._horizon = _check_int(horizon, "horizon", 1)
        if eos_token_id is not None:
            eos_token_id = _check_int(eos_token_id, "eos_token_id", 0, self._vocab_size - 1)
        self._eos = eos_token_id
        self._fns: dict[Side, ProbFn] = {"p": p, "q": q}
        self._memo: dict[Side, dict[History, np.ndarray]] = {"p": {}, "q": {}}
        self._log_memo: dict[Side, dict[History, np.ndarray]] = {"p": {}, "q": {}}
        self.info: Mapping[str, Any] = MappingProxyType(dict(info or {}))

    @classmethod
    def from_tables(
        cls,
        p_table: Mapping[History, Sequence[float] | np.ndarray],
        q_table: Mapping[History, Sequence[float] | np.ndarray],
        vocab_size: int,
        horizon: int,
        eos_token_id: int | None = None,
        *,
        info: Mapping[str, Any] | None = None,
    ) -> FinitePair:
        """Build a pair from explicit tables ``{history: probs}``.

        Every row is validated now. A history that contains ``eos_token_id`` may be left
        out: it gets a point mass on EOS (the branch is absorbed there anyway). Any other
        missing history raises a ``ValueError`` when it is first needed.
        """
        def p(history: History) -> Any:
            return _lookup(p_table, "p_table", history, vocab_size, eos_token_id)

        def q(history: History) -> Any:
            return _lookup(q_table, "q_table", history, vocab_size, eos_token_id)

        pair = cls(p, q, vocab_size, horizon, eos_token_id, info=info)
        for side, table in (("p", p_table), ("q", q_table)):
            for history in table:
                pair.probs(side, history)
        return pair

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    @property
    def horizon(self) -> int:
        return self._horizon

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def _check_history(self, history: Any) -> History:
        try:
            history = tuple(int(tok) for tok in history)
        except (TypeError, ValueError):
            raise ValueError(f"a history must be a tuple of token ids; got {history!r}") from None
        if len(history) >= self._horizon:
            raise ValueError(
                f"history {history} has length {len(history)}; kernels are defined on histories "
                f"of length 0..{self._horizon - 1} (horizon {self._horizon})")
        if any(tok < 0 or tok >= self._vocab_size for tok in history):
            raise ValueError(f"history {history} has a token outside 0..{self._vocab_size - 1}")
        return history

    def probs(self, side: Side, history: Sequence[int]) -> np.ndarray:
        """The next-token law of ``side`` after ``history`` (float64 ``[V]``, read-only)."""
        side = check_side(side)
        history = self._check_history(history)
        memo = self._memo[side]
        if history not in memo:
            what = f"{side}{history}"
            row = check_probs(torch.as_tensor(np.asarray(self._fns[side](history), dtype=float)),
                              what=what)
            if row.shape != (1, self._vocab_size):
                raise ValueError(
                    f"{what} must have {self._vocab_size} entries (vocab_size); got shape "
                    f"{tuple(row.shape)}")
            out = row[0].numpy().copy()
            out /= out.sum()
            out.setflags(write=False)
            memo[history] = out
        return memo[history]

    def _logprobs_row(self, side: Side, history: History) -> np.ndarray:
        memo = self._log_memo[side]
        if history not in memo:
            probs = self.probs(side, history)
            with np.errstate(divide="ignore"):
                memo[history] = np.log(probs)
        return memo[history]

    # KernelPair protocol -----------------------------------------------------------

    def start(self, side: Side, n: int) -> FinitePath:
        """``n`` rows of the empty history for kernel ``side``."""
        return FinitePath(check_side(side), ((),) * _check_int(n, "n", 0))

    def logprobs(self, state: FinitePath) -> torch.Tensor:
        """Next-token log-probabilities ``[n, V]`` float64 on CPU (``-inf`` for zero mass)."""
        rows = [self._logprobs_row(state.side, self._check_history(h)) for h in state.histories]
        if not rows:
            return torch.empty(0, self._vocab_size, dtype=torch.float64)
        return torch.from_numpy(np.stack(rows))

    def advance(self, state: FinitePath, tokens: torch.Tensor) -> FinitePath:
        """Append ``tokens[i]`` (``[n]`` ints) to row ``i``."""
        toks = _as_index_list(tokens, len(state), "tokens")
        if any(t < 0 or t >= self._vocab_size for t in toks):
            raise ValueError(f"tokens must lie in 0..{self._vocab_size - 1}; got {toks}")
        if any(len(h) >= self._horizon for h in state.histories):
            raise ValueError(f"cannot advance a history already at the horizon {self._horizon}")
        return FinitePath(state.side,
                          tuple(h + (t,) for h, t in zip(state.histories, toks, strict=True)))

    def truncate(self, state: FinitePath, lengths: torch.Tensor) -> FinitePath:
        """Keep the first ``lengths[i]`` tokens (``[n]`` ints) of row ``i``."""
        lens = _as_index_list(lengths, len(state), "lengths")
        for h, k in zip(state.histories, lens, strict=True):
            if k < 0 or k > len(h):
                raise ValueError(f"cannot truncate a history of length {len(h)} to {k} tokens")
        return FinitePath(state.side,
                          tuple(h[:k] for h, k in zip(state.histories, lens, strict=True)))

    def select(self, state: FinitePath, rows: torch.Tensor) -> FinitePath:
        """The given rows (``[m]`` ints, in that order, repeats allowed)."""
        idx = _as_index_list(rows, None, "rows")
        if any(i < 0 or i >= len(state) for i in idx):
            raise ValueError(f"rows must lie in 0..{len(state) - 1}; got {idx}")
        return FinitePath(state.side, tuple(state.histories[i] for i in idx))

    def join(self, states: list[FinitePath]) -> FinitePath:
        """All rows of the given states (one side), in order."""
        if not states:
            raise ValueError("join needs at least one state")
        sides = {s.side for s in states}
        if len(sides) != 1:
            raise ValueError(f"only states of one side can be joined; got {sorted(sides)}")
        return FinitePath(states[0].side, tuple(h for s in states for h in s.histories))

    def __repr__(self) -> str:
        return (f"FinitePair(vocab_size={self._vocab_size}, horizon={self._horizon}, "
                f"eos_token_id={self._eos}, info={dict(self.info)})")


def _lookup(table: Mapping, name: str, history: History, vocab_size: int,
            eos: int | None) -> Any:
    """Row of an explicit table; absorbed histories default to a point mass on EOS."""
    if history in table:
        return table[history]
    if eos is not None and eos in history:
        return np.eye(vocab_size)[eos]
    raise ValueError(f"{name} has no row for history {history}")


def _as_index_list(values: Any, n: int | None, name: str) -> list[int]:
    """A 1-D integer tensor/sequence as a list of ints, of length ``n`` when given."""
    arr = torch.as_tensor(values)
    if arr.ndim != 1 or arr.is_floating_point() or arr.is_complex() or arr.dtype == torch.bool:
        raise ValueError(f"{name} must be a 1-D integer tensor; got dtype {arr.dtype}, "
                         f"shape {tuple(arr.shape)}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} must have one entry per row ({n}); got {arr.shape[0]}")
    return [int(v) for v in arr.tolist()]


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


# Random systems ----------------------------------------------------------------------


def _as_rng(seed: int | np.random.Generator) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(_check_int(seed, "seed", 0))


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
    vocab_size = _check_int(vocab_size, "vocab_size", 1)
    horizon = _check_int(horizon, "horizon", 1)
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must be in [0, 1]; got {mix}")
    if not concentration > 0:
        raise ValueError(f"concentration must be > 0; got {concentration}")
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
    """System ``c`` of the paper's finite-state check (SPEC.md section 6).

    Binary tokens. For every prefix (lengths ``0..H-1``, shortest first, then
    lexicographic) ``P`` and ``A`` are independent normalised ``Gamma(1.5, 1) + 0.05``
    weights (``P`` drawn first); ``Q = (1 - lambda) P + lambda A`` with
    ``lambda = (0.05 + 0.45 c / n_systems) * U * V``, ``U ~ Unif[0.5, 1]`` and
    ``V ~ Unif[0, 1]`` drawn once, before the rows. The generator is
    ``numpy.random.default_rng([seed, c])``, so a system depends only on ``(seed, c)``
    (and ``H``). ``info`` records ``c``, ``lambda``, ``u`` and ``v``.
    """
    n_systems = _check_int(n_systems, "n_systems", 1)
    c = _check_int(c, "c", 1, n_systems)
    H = _check_int(H, "H", 1)
    seed = _check_int(seed, "seed", 0)
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


# Exact enumeration --------------------------------------------------------------------


def _check_depth(L: Any, horizon: int) -> int:
    return _check_int(L, "observation depth L", 1, horizon)


@dataclass(frozen=True, eq=False)
class ExactRisk:
    """Exact population quantities of a finite pair (SPEC.md sections 3-5, 7).

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
        L = _check_depth(L, self.horizon)
        return float(self.tau_mismatch[:, :L].sum() / self.horizon)

    def B_L(self, L: int) -> float:
        """Unobserved capacity ``B_L = (1/H) sum_s p_s (H - s - L + 1)_+``."""
        L = _check_depth(L, self.horizon)
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


# Extremal construction (SPEC.md section 5) ---------------------------------------------


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
    L = _check_depth(L, H)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1]; got {alpha}")
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
