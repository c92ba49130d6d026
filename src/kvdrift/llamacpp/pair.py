"""The kernel-pair protocol over two llama.cpp contexts (:mod:`kvdrift.kernel`).

P's side is a context of P's GGUF file with an f16 cache; Q's a context of Q's file with the
action's cache types and flash attention. A state's rows are token histories with the sequence
each was last held in; :meth:`LlamaCppPair.advance_many` decodes every row of each side's
states in one ``llama_decode`` call, and :meth:`logprobs` reads the logits it left (a row not
decoded yet, after ``start``, ``truncate`` or ``select``, is decoded then, in one call per
state). Log-probabilities are llama.cpp's float32 logits, normalised in float64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvdrift.kernel import Side, check_side
from kvdrift.llamacpp.cache_types import LlamaAction
from kvdrift.llamacpp.sequences import SequencePool


@dataclass
class Rows:
    """A batch of generated histories on one side, and the sequence each was last held in."""

    side: Side
    histories: list[tuple[int, ...]]
    seqs: list[int]

    def __len__(self) -> int:
        return len(self.histories)


class LlamaCppPair:
    """P and Q as two llama.cpp contexts (:class:`~kvdrift.llamacpp.sequences.SequencePool`).

    ``horizon``: rows never get longer (the estimators' promise), so a row of that length is
    not decoded ahead."""

    device = torch.device("cpu")

    def __init__(self, p: SequencePool, q: SequencePool, action: LlamaAction,
                 eos_token_id: int | None, horizon: int, kv_bytes: tuple[float, float],
                 weights_bytes: tuple[float, float] = (float("nan"), float("nan"))):
        if p.vocab_size != q.vocab_size or p.n_prompt != q.n_prompt:
            raise ValueError("P and Q must share the vocabulary and the prompt")
        self.pools = {"p": p, "q": q}
        self.action = action
        self._eos = eos_token_id
        self.horizon = int(horizon)
        self.n_prompt = p.n_prompt
        self._kv = kv_bytes  # (Q's prompt cache bytes, as a fraction of P's)
        self._weights = weights_bytes  # (Q's file bytes, as a fraction of P's)

    @property
    def vocab_size(self) -> int:
        return self.pools["p"].vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    def kv_memory(self) -> tuple[float, float]:
        """Q's prompt cache in bytes at its cache types, and as a fraction of P's f16 cache."""
        return self._kv

    def weights_memory(self) -> tuple[float, float]:
        """Q's model file in bytes, and as a fraction of P's file."""
        return self._weights

    def start(self, side: Side, n: int, *, rewind: bool = True, slots: int = 0) -> Rows:
        """``n`` empty rows (llama.cpp's context is sized when the pair is built: ``rewind``
        and ``slots`` change nothing)."""
        side = check_side(side)
        return Rows(side, [()] * int(n), [-1] * int(n))

    def logprobs(self, state: Rows) -> torch.Tensor:
        logits = self._ensure(state.side, [state])[0]
        out = torch.from_numpy(np.stack(logits) if logits else
                               np.zeros((0, self.vocab_size), np.float32)).to(torch.float64)
        return torch.log_softmax(out, dim=-1)

    def _ensure(self, side: Side, states: Sequence[Rows]) -> list[list[np.ndarray]]:
        """Every row's logits, by state; one decode call per ``slots // 2`` histories."""
        pool = self.pools[side]
        rows = [(s, i) for s, state in enumerate(states) for i in range(len(state))]
        found: list[list[np.ndarray | None]] = [[None] * len(state) for state in states]
        chunk = max(1, pool.slots // 2)
        start = 0
        while start < len(rows):
            # as many rows as hold at most ``chunk`` different histories
            stop, seen = start, set()
            while stop < len(rows):
                s, i = rows[stop]
                h = states[s].histories[i]
                if h and h not in seen:
                    if len(seen) == chunk:
                        break
                    seen.add(h)
                stop += 1
            part = rows[start:stop]
            seqs, logits = pool.ensure([states[s].histories[i] for s, i in part],
                                       [states[s].seqs[i] for s, i in part])
            for (s, i), seq, row in zip(part, seqs, logits, strict=True):
                states[s].seqs[i] = seq
                found[s][i] = row
            start = stop
        return found  # type: ignore[return-value]

    def _checked(self, state: Rows, tokens: torch.Tensor) -> list[int]:
        values = torch.as_tensor(tokens).reshape(-1)
        if values.numel() != len(state):
            raise ValueError(f"tokens must have one entry per row ({len(state)}); got "
                             f"{values.numel()}")
        out = [int(t) for t in values.tolist()]
        if any(t < 0 or t >= self.vocab_size for t in out):
            raise ValueError(f"tokens must be in [0, {self.vocab_size}); got {out}")
        return out

    def advance(self, state: Rows, tokens: torch.Tensor) -> Rows:
        return self.advance_many([state], [tokens])[0]

    def advance_many(self, states: list[Rows], tokens: list[torch.Tensor], *,
                     checked: bool = True) -> list[Rows]:
        if len(states) != len(tokens):
            raise ValueError("advance_many needs one token tensor per state")
        out = []
        for state, t in zip(states, tokens, strict=True):
            values = self._checked(state, t)
            out.append(Rows(state.side, [h + (v,) for h, v in zip(state.histories, values,
                                                                    strict=True)],
                            list(state.seqs)))
        for side in ("p", "q"):  # one decode for every row held in this side's context
            ahead = [s for s in out if s.side == side
                     and any(len(h) < self.horizon for h in s.histories)]
            if ahead:
                self._ensure(side, ahead)
        return out

    def truncate(self, state: Rows, lengths: torch.Tensor) -> Rows:
        values = [int(v) for v in torch.as_tensor(lengths).reshape(-1).tolist()]
        if len(values) != len(state) or any(
                v < 0 or v > len(h) for v, h in zip(values, state.histories, strict=True)):
            raise ValueError(f"lengths must give each row a length between 0 and its own; got "
                             f"{values}")
        return Rows(state.side, [h[:v] for h, v in zip(state.histories, values, strict=True)],
                    list(state.seqs))

    def select(self, state: Rows, rows: torch.Tensor, *, checked: bool = True) -> Rows:
        index = [int(r) for r in torch.as_tensor(rows).reshape(-1).tolist()]
        if any(r < 0 or r >= len(state) for r in index):
            raise ValueError(f"rows must be in [0, {len(state)}); got {index}")
        return Rows(state.side, [state.histories[r] for r in index],
                    [state.seqs[r] for r in index])

    def join(self, states: list[Rows]) -> Rows:
        if not states:
            raise ValueError("join needs at least one state")
        sides = {s.side for s in states}
        if len(sides) != 1:
            raise ValueError("join needs states of one side")
        return Rows(states[0].side, [h for s in states for h in s.histories],
                    [q for s in states for q in s.seqs])
