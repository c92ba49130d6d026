"""The finite kernel pair: P and Q as explicit next-token tables (DESIGN.md, "two worlds").

:class:`FinitePair` is the :class:`~kvdrift.kernel.KernelPair` of two tables (or two functions)
over a small vocabulary and horizon; :class:`FinitePath` is its path state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from kvdrift import checks
from kvdrift.coupling import check_probs
from kvdrift.kernel import Side, check_side

History = tuple[int, ...]
ProbFn = Callable[[History], Sequence[float] | np.ndarray | torch.Tensor]



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
        self._vocab_size = checks.integer(vocab_size, "vocab_size", 1)
        self._horizon = checks.integer(horizon, "horizon", 1)
        if eos_token_id is not None:
            eos_token_id = checks.integer(eos_token_id, "eos_token_id", 0, self._vocab_size - 1)
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

    def start(self, side: Side, n: int, *, rewind: bool = True, slots: int = 0) -> FinitePath:
        """``n`` rows of the empty history for kernel ``side`` (``rewind`` and ``slots``
        change nothing: a table keeps no cache)."""
        return FinitePath(check_side(side), ((),) * checks.integer(n, "n", 0))

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

    def advance_many(self, states: list[FinitePath], tokens: list[torch.Tensor], *,
                     checked: bool = True) -> list[FinitePath]:
        """``advance`` of each state (tables have no forward pass to share; the tokens are
        always checked: a host list costs no synchronisation)."""
        if len(states) != len(tokens):
            raise ValueError(f"need one token tensor per state; got {len(states)} states and "
                             f"{len(tokens)} token tensors")
        return [self.advance(s, t) for s, t in zip(states, tokens, strict=True)]

    def truncate(self, state: FinitePath, lengths: torch.Tensor) -> FinitePath:
        """Keep the first ``lengths[i]`` tokens (``[n]`` ints) of row ``i``."""
        lens = _as_index_list(lengths, len(state), "lengths")
        for h, k in zip(state.histories, lens, strict=True):
            if k < 0 or k > len(h):
                raise ValueError(f"cannot truncate a history of length {len(h)} to {k} tokens")
        return FinitePath(state.side,
                          tuple(h[:k] for h, k in zip(state.histories, lens, strict=True)))

    def select(self, state: FinitePath, rows: torch.Tensor, *,
               checked: bool = True) -> FinitePath:
        """The given rows (``[m]`` ints, in that order, repeats allowed; always checked)."""
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
