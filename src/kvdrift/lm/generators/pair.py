"""The kernel pair of two models on one tokenizer: each side stepped by its own model.

P's side is P's model with its full prompt cache; Q's side is Q's model (another checkpoint,
dtype, attention or weight type: :mod:`~kvdrift.lm.generators.build`) with whatever the action
does to its cache. Each side is a one-model :class:`~kvdrift.lm.engine.pair.LMKernelPair` over
its own model (each side's rows still share its prompt); this pair routes a path state to the
side it belongs to. A joint step (``advance_many``) runs one forward per side and position:
P's rows in P's model, Q's rows (along Y, and along X where Q is forced) in Q's.
Estimators see the same protocol as for one model (:mod:`kvdrift.kernel`).
"""

from __future__ import annotations

from typing import Any

import torch

from kvdrift.kernel import Side, check_side
from kvdrift.lm.actions.spec import Action
from kvdrift.lm.engine.pair import LMKernelPair, LMPathState
from kvdrift.lm.generators.build import Generator


class GeneratorPair:
    """P's model with its full cache against Q's model under an action (module docstring).

    Parameters
    ----------
    p : one-model pair over P's model; its side ``"p"`` is used (the full cache).
    q : one-model pair over Q's model for the action's cache part; its side ``"q"`` is used.
    action : the whole action (``<cache action>@<model>``, or a model handed over by name).
    generator : Q's model and what it is.
    """

    def __init__(self, p: LMKernelPair, q: LMKernelPair, action: Action,
                 generator: Generator) -> None:
        if p.vocab_size != q.vocab_size:
            raise ValueError(f"Q's model {generator.label!r} scores {q.vocab_size} tokens and "
                             f"P's {p.vocab_size}; the two must score one vocabulary")
        if p.eos_token_id != q.eos_token_id:
            raise ValueError(f"Q's model {generator.label!r} ends text with token "
                             f"{q.eos_token_id} and P's with {p.eos_token_id}; the two must "
                             f"share their end-of-text token")
        if p.n_prompt != q.n_prompt:
            raise ValueError(f"P's prompt has {p.n_prompt} tokens and Q's {q.n_prompt}; the "
                             f"two sides read one prompt")
        self.sides = {"p": p, "q": q}
        self.action = action
        self.generator = generator
        self.n_prompt = p.n_prompt

    # --- protocol properties -------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.sides["p"].vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self.sides["p"].eos_token_id

    @property
    def device(self) -> torch.device:
        return self.sides["p"].device

    @property
    def q_is_p(self) -> bool:
        """Never: two models (equal weights still run as two forwards)."""
        return False

    # --- what the runner reads of Q's side -----------------------------------------------------
    @property
    def memory_pair(self) -> LMKernelPair:
        """The one-model pair whose Q cache the memory records describe (Q's, on Q's model:
        its ``kv_fraction`` is of Q's own full cache in Q's dtype)."""
        return self.sides["q"]

    @property
    def decoding_rule(self) -> Any:
        return self.sides["q"].decoding_rule

    def kv_memory(self) -> tuple[float, float]:
        return self.sides["q"].kv_memory()

    @property
    def kv_measure(self) -> str:
        return self.sides["q"].kv_measure

    def weights_memory(self) -> tuple[float, float]:
        """``(weights_bytes, weights_fraction)`` of Q's model: its weights as built (a weight
        type: as that type stores them) and their fraction of P's weights at their dtype."""
        p_bytes, _ = self.sides["p"].weights_memory()
        return float(self.generator.weights_bytes), self.generator.weights_bytes / p_bytes

    def key_merges(self, key: int) -> None:
        self.sides["q"].key_merges(key)

    def prompt_cache(self, side: Side) -> Any:
        """The side's prompt cache, each on its own model."""
        return self.sides[check_side(side)].prompt_cache(side)

    # --- protocol methods ----------------------------------------------------------------------
    def _of(self, state: LMPathState) -> LMKernelPair:
        return self.sides[state.side]

    def start(self, side: Side, n: int, *, rewind: bool = True, slots: int = 0) -> LMPathState:
        return self.sides[check_side(side)].start(side, n, rewind=rewind, slots=slots)

    def logprobs(self, state: LMPathState) -> torch.Tensor:
        return self._of(state).logprobs(state)

    def advance(self, state: LMPathState, tokens: torch.Tensor) -> LMPathState:
        return self._of(state).advance(state, tokens)

    def advance_many(self, states: list[LMPathState], tokens: list[torch.Tensor], *,
                     checked: bool = True) -> list[LMPathState]:
        """One forward per side: each side's states in its own model's joint step."""
        if len(states) != len(tokens):
            raise ValueError(f"need one token tensor per state; got {len(states)} states and "
                             f"{len(tokens)} token tensors")
        out: list[Any] = [None] * len(states)
        for side, pair in self.sides.items():
            mine = [i for i, s in enumerate(states) if s.side == side]
            if not mine:
                continue
            done = pair.advance_many([states[i] for i in mine], [tokens[i] for i in mine],
                                     checked=checked)
            for i, state in zip(mine, done, strict=True):
                out[i] = state
        return out

    def truncate(self, state: LMPathState, lengths: torch.Tensor) -> LMPathState:
        return self._of(state).truncate(state, lengths)

    def select(self, state: LMPathState, rows: torch.Tensor, *,
               checked: bool = True) -> LMPathState:
        return self._of(state).select(state, rows, checked=checked)

    def join(self, states: list[LMPathState]) -> LMPathState:
        if not states:
            raise ValueError("join needs at least one state")
        return self._of(states[0]).join(states)
