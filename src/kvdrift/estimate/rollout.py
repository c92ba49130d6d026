"""Complete coupled rollouts: the naive estimator (docs/method.md section 7).

Each replicate runs the stepwise maximal coupling for ``H`` steps on three paths:
the reference branch ``X`` under P, the intervention branch ``Y`` under Q, and Q
forced along ``X`` (for the fixed-history TV ``f_t``). ``X`` and ``Y`` are ``K``-row
states: with equal batch shapes a language model computes bit-identical distributions
for identical inputs, so the same-path control (no eviction) gives TV exactly 0.

Before a replicate diverges its ``Y`` history equals its ``X`` history, so Q forced along
``X`` is Q on ``Y``: the forced path holds only diverged rows, each forked from its ``Y``
state at the divergence (before ``Y`` appends its own token). The three paths advance in one
joint step (:meth:`~kvdrift.kernel.KernelPair.advance_many`): a language model reads its
weights once per position for all of them. The forced rows share the Q-side matrix products
with ``Y``'s rows, so their distributions differ from a separate batch's by float32 noise
(~1e-6), not more; ``X`` and ``Y`` keep equal shapes on their own sides, so equal inputs still
give bit-identical distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvdrift.coupling import absorb_eos, coupled_draw, tempered_probs, tv_distance
from kvdrift.divergence import NEVER
from kvdrift.estimate.common import (
    NonFinite,
    check_horizon,
    check_replicates,
    first_nonfinite,
    make_generator,
)
from kvdrift.estimate.forced import forced_step
from kvdrift.kernel import KernelPair


@dataclass(frozen=True)
class RolloutResult:
    """Per replicate and position records of complete coupled rollouts.

    Tensors are ``[K, H]`` (positions ``t = 1..H`` in columns ``0..H-1``) unless noted.
    ``tau`` is the first mismatch position (1-based), :data:`~kvdrift.divergence.NEVER` when
    there is none.
    ``x_eos``/``y_eos`` flag positions at which that branch has emitted EOS (at or before t).
    """

    x: torch.Tensor
    y: torch.Tensor
    mismatch: torch.Tensor  # bool
    delta: torch.Tensor  # float64, branch-aligned TV
    f: torch.Tensor  # float64, fixed-history TV along X
    x_eos: torch.Tensor  # bool
    y_eos: torch.Tensor  # bool
    tau: torch.Tensor  # [K] long, NEVER (0) when the branches never diverged
    evaluations: int  # kernel-pair evaluations (one per replicate and position)
    # Teacher-forced along X (kvdrift.estimate.forced), float64, NaN after X's EOS:
    logp_x: torch.Tensor | None = None  # log P(X_t | X_<t) at the run's temperature
    logq_x: torch.Tensor | None = None  # log Q(X_t | X_<t)
    kl: torch.Tensor | None = None  # KL(P || Q) over the vocabulary
    top1: torch.Tensor | None = None  # 1.0 where the arg-maxes agree

    def nonfinite(self) -> NonFinite | None:
        """Where a TV is not finite (a probability of P or Q was not), or None."""
        return first_nonfinite({"the TV of P and Q": self.delta,
                                "the fixed-history TV of P and Q": self.f})

    @property
    def replicates(self) -> int:
        return int(self.x.shape[0])

    @property
    def horizon(self) -> int:
        return int(self.x.shape[1])


def first_mismatch(mismatch: torch.Tensor) -> torch.Tensor:
    """``tau`` per row of a ``[K, H]`` bool tensor: 1-based first True, :data:`NEVER` if none."""
    any_ = mismatch.any(dim=-1)
    first = mismatch.to(torch.int8).argmax(dim=-1) + 1
    return torch.where(any_, first, torch.full_like(first, NEVER))


def coupled_rollouts(
    pair: KernelPair,
    replicates: int,
    horizon: int,
    temperature: float = 1.0,
    seed: int | torch.Generator = 0,
) -> RolloutResult:
    """Run ``replicates`` complete coupled rollouts of length ``horizon`` on ``pair``."""
    K = check_replicates(replicates)
    H = check_horizon(horizon)
    gen = make_generator(seed, pair.device)
    eos = pair.eos_token_id
    # a rollout never goes back: its states may keep only what a decoding-time press keeps;
    # it advances them H - 1 times, so a full cache is allocated once (lm/engine/cache.py)
    p_state = pair.start("p", K, rewind=False, slots=H - 1)
    q_state = pair.start("q", K, rewind=False, slots=H - 1)  # Y branch
    forced = None  # Q forced along X, diverged rows only (rows `forced_rows`, in that order)
    forced_rows = torch.empty(0, dtype=torch.long, device=pair.device)

    cols = Columns(K, H)
    x_done = torch.zeros(K, dtype=torch.bool, device=pair.device)
    y_done = torch.zeros(K, dtype=torch.bool, device=pair.device)
    diverged = torch.zeros(K, dtype=torch.bool, device=pair.device)
    for t in range(H):
        p_lp, q_lp = pair.logprobs(p_state), pair.logprobs(q_state)
        p = absorb_eos(tempered_probs(p_lp, temperature), x_done, eos)
        q = absorb_eos(tempered_probs(q_lp, temperature), y_done, eos)
        x_ended = x_done.clone()  # X emitted EOS before t
        draw = coupled_draw(p, q, gen)
        # Q on X is Q on Y before divergence (equal histories and EOS flags): the forced rows
        # are written into Q's tensors in place (neither is read again), no [K, V] copies
        if forced is not None:
            forced_lp = pair.logprobs(forced)
            q.index_copy_(0, forced_rows, absorb_eos(tempered_probs(forced_lp, temperature),
                                                     x_done[forced_rows], eos))
            q_lp.index_copy_(0, forced_rows, forced_lp)
            del forced_lp
        f = tv_distance(p, q)  # over all rows, as one [K, V] pass (a row's sum may round
        del p, q  # differently in a smaller batch)
        step = forced_step(p_lp, q_lp, draw.x, temperature, x_ended)
        del p_lp, q_lp
        if eos is not None:
            x_done = x_done | (draw.x == eos)
            y_done = y_done | (draw.y == eos)
        mismatch = draw.x != draw.y
        cols.put(t, x=draw.x, y=draw.y, m=mismatch, d=draw.tv, f=f, xe=x_done, ye=y_done,
                 lp=step.logp_x, lq=step.logq_x, kl=step.kl, top1=step.top1)
        if t + 1 < H:
            new = torch.nonzero(mismatch & ~diverged).squeeze(-1)
            if new.numel() > 0:  # fork Y at its divergence, before it appends its own token
                fork = pair.select(q_state, new, checked=False)  # rows of nonzero
                forced = fork if forced is None else pair.join([forced, fork])
                forced_rows = torch.cat([forced_rows, new])
                diverged[new] = True
            # one joint step: P along X, Q along Y, Q forced along X (diverged rows)
            if forced is None:
                p_state, q_state = pair.advance_many([p_state, q_state], [draw.x, draw.y],
                                                     checked=False)
            else:
                p_state, q_state, forced = pair.advance_many(
                    [p_state, q_state, forced], [draw.x, draw.y, draw.x[forced_rows]],
                    checked=False)

    out = cols.done()
    return RolloutResult(
        x=out["x"], y=out["y"], mismatch=out["m"], delta=out["d"], f=out["f"],
        x_eos=out["xe"], y_eos=out["ye"], tau=first_mismatch(out["m"]), evaluations=K * H,
        logp_x=out["lp"], logq_x=out["lq"], kl=out["kl"], top1=out["top1"],
    )


class Columns:
    """The per-position records of ``K`` rows over ``H`` positions, held position-major: one
    ``[H, C, K]`` tensor per dtype (its ``C`` quantities), allocated at the first position and
    written one ``[C, K]`` slice per position by one ``stack`` (one operator per dtype, no
    small tensor kept per position: docs/long-generations.md)."""

    def __init__(self, rows: int, horizon: int) -> None:
        self.rows, self.horizon = rows, horizon
        self.groups: list[tuple[tuple[str, ...], torch.Tensor]] = []

    def put(self, t: int, **values: torch.Tensor) -> None:
        """Write each quantity's ``[K]`` values at position index ``t`` (0-based)."""
        if not self.groups:
            kinds: dict[tuple[torch.dtype, torch.device], list[str]] = {}
            for name, value in values.items():
                kinds.setdefault((value.dtype, value.device), []).append(name)
            self.groups = [(tuple(names), values[names[0]].new_empty(
                (self.horizon, len(names), self.rows))) for names in kinds.values()]
        for names, held in self.groups:
            torch.stack([values[name] for name in names], out=held[t])

    def done(self) -> dict[str, torch.Tensor]:
        """Every quantity ``[K, H]`` on the CPU."""
        return {name: held[:, i].T.contiguous().cpu()
                for names, held in self.groups for i, name in enumerate(names)}
