"""The kernel-pair protocol: the one interface every estimator talks to.

A kernel pair is two autoregressive next-token kernels over the same vocabulary:
the reference ``P`` (side ``"p"``, e.g. the full-cache model) and the intervention
``Q`` (side ``"q"``, e.g. the same weights with an evicted prompt cache). Each is
stepped on a batch of generated histories held in an opaque *path state*.

Two worlds implement it: explicit finite tables (:mod:`kvdrift.finite`) and
language models (:mod:`kvdrift.lm.engine.pair`). Estimators never know which one runs.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import torch

from kvdrift import checks

Side = Literal["p", "q"]
SIDES: tuple[Side, ...] = ("p", "q")

PathState = Any
"""Opaque batched state: one generated history per row, owned by the kernel pair."""


@runtime_checkable
class KernelPair(Protocol):
    """Two next-token kernels stepped on batches of histories.

    Contract
    --------
    - ``start(side, n)`` returns ``n`` rows, each with the empty generated history.
      ``rewind=False`` (keyword) tells the pair that no row of the state, nor of a state made
      from it, will be truncated to a length it held long ago; a pair may then drop what only
      going back needs (a language model under a decoding-time press keeps only the entries
      the press keeps; it can go back only to lengths after each row's last compression).
      ``slots`` (keyword, 0: not known) is how many tokens the rows will be advanced by at
      most; a pair may allocate for them at once (a language model's full-cache rows do, so
      a long generation never regrows them).
    - ``logprobs(state)`` returns ``[n, vocab_size]`` float64 log-probabilities of the
      next token at temperature 1 (``-inf`` where a token is impossible), as a new tensor
      the caller may overwrite (the rollouts write Q's forced rows into Q's in place).
    - ``advance(state, tokens)`` appends ``tokens[i]`` to row ``i`` and returns the new
      state; it may reuse ``state``'s storage, so the old state must not be used again.
    - ``advance_many(states, tokens)`` advances several states (of either side) at once and
      returns the new states in order: ``[advance(s, t) for s, t in zip(states, tokens)]``,
      which is how the finite pair implements it. A language model runs every row of every
      state through one forward (the weights are read once per position, not once per path);
      rows of P and Q with equal inputs still get bit-identical distributions. Each state
      must appear once (advancing consumes it). ``checked=False`` (keyword) tells the pair
      the tokens come from its own ``[n, vocab_size]`` distributions (an estimator's draws), so
      it may skip their range check, which on an accelerator is a host synchronisation.
    - ``truncate(state, lengths)`` returns a state whose row ``i`` holds the first
      ``lengths[i]`` tokens of row ``i``'s history; it may consume ``state`` too.
    - ``select(state, rows)`` returns a state made of the given rows (in that order);
      ``checked=False`` (keyword): the rows are known to be in range (e.g. from ``nonzero``
      over the state's rows), so the pair may skip the check.
    - ``join(states)`` returns one state holding all rows of the given states of one side,
      in order (rows may have different lengths).
    - Estimators never ask for ``logprobs`` of a history of length ``H`` or more, and
      never advance past it; a pair may refuse to.

    EOS absorption is not the kernel's job: estimators apply it (see
    :func:`kvdrift.coupling.absorb_eos`), so both worlds share one rule.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def device(self) -> torch.device: ...

    def start(self, side: Side, n: int, *, rewind: bool = True, slots: int = 0
              ) -> PathState: ...

    def logprobs(self, state: PathState) -> torch.Tensor: ...

    def advance(self, state: PathState, tokens: torch.Tensor) -> PathState: ...

    def advance_many(self, states: list[PathState], tokens: list[torch.Tensor], *,
                     checked: bool = True) -> list[PathState]: ...

    def truncate(self, state: PathState, lengths: torch.Tensor) -> PathState: ...

    def select(self, state: PathState, rows: torch.Tensor, *,
               checked: bool = True) -> PathState: ...

    def join(self, states: list[PathState]) -> PathState: ...


def check_side(side: str) -> Side:
    """Return ``side`` if it names a kernel, else raise a clear error."""
    return checks.choice(side, "kernel side (p: reference, q: intervention)", SIDES)
