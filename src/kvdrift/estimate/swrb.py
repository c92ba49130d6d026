"""Survival-Weighted Residual Branching (SWRB), docs/method.md section 7.

One replicate: (1) scan one shared prefix ``U`` drawn from the overlaps, recording the
divergence weights ``w_s = S_{s-1} e_s``; (2) draw a branch position ``J ~ w / M``;
(3) at ``U_<J`` draw a residual pair and continue the coupling to ``H``. The outputs
are unbiased for ``R``, ``O_H``, ``Pi_H`` and for the finite-window quantities ``R_L``
and ``B_L``, with variance never above the naive estimator's.

All ``K`` replicates run as one batch; each row branches at its own ``J``, so the
continuation runs in lockstep on per-row positions ``J_i + k``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvdrift.coupling import absorb_eos, coupled_draw, sample_categorical, scan_step, tempered_probs
from kvdrift.estimate.common import (
    NonFinite,
    check_depths,
    check_horizon,
    check_replicates,
    first_nonfinite,
    make_generator,
)
from kvdrift.kernel import KernelPair


@dataclass(frozen=True)
class SWRBResult:
    """Per-replicate SWRB outputs (``K`` rows; depth-indexed outputs are ``[K, len(depths)]``).

    ``z_R``, ``z_O``, ``z_Pi`` are unbiased for ``R``, ``O_H`` and ``Pi_H``; ``z_L[:, i]``
    for ``R_L`` at ``depths[i]``, ``z_tail = z_H - z_L`` for ``R - R_L``, ``w_L`` for ``B_L``.
    ``J`` is the branch position (0 where ``M = 0``: no divergence was possible).
    ``overlap_tv``/``weights`` are the scan's ``e_s`` and ``w_s`` (``[K, H]``);
    ``shared`` the scanned prefix ``U``; ``x``/``y``/``mismatch`` the continuation
    (``[K, H]``, meaningful from ``J`` on, ``-1``/False before it).
    """

    depths: tuple[int, ...]
    z_R: torch.Tensor
    z_O: torch.Tensor
    z_Pi: torch.Tensor
    z_L: torch.Tensor
    z_tail: torch.Tensor
    w_L: torch.Tensor
    M: torch.Tensor
    J: torch.Tensor
    overlap_tv: torch.Tensor
    weights: torch.Tensor
    shared: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    mismatch: torch.Tensor
    evaluations: torch.Tensor  # [K] kernel-pair evaluations: scanned positions + (H - J)
    continuation_tv: torch.Tensor | None = None  # [K, H] the continuation's TVs (0 before J)

    def nonfinite(self) -> NonFinite | None:
        """Where a TV of the scan or the continuation is not finite, or None."""
        tvs = {"the scan's TV of P and Q": self.overlap_tv}
        if self.continuation_tv is not None:
            tvs["the continuation's TV of P and Q"] = self.continuation_tv
        return first_nonfinite(tvs)

    @property
    def replicates(self) -> int:
        return int(self.z_R.shape[0])

    @property
    def horizon(self) -> int:
        return int(self.weights.shape[1])


def unobserved_capacity(weights: torch.Tensor, depths: tuple[int, ...]) -> torch.Tensor:
    """``W_L = (1/H) sum_s w_s (H - s - L + 1)_+`` per depth: ``[K, H] -> [K, len(depths)]``."""
    H = weights.shape[1]
    s = torch.arange(1, H + 1, dtype=torch.float64)
    cols = [(weights * (H - s - L + 1).clamp(min=0)).sum(dim=1) / H for L in depths]
    return torch.stack(cols, dim=1)


def swrb(
    pair: KernelPair,
    replicates: int,
    horizon: int,
    depths: tuple[int, ...] | list[int] = (),
    temperature: float = 1.0,
    seed: int | torch.Generator = 0,
) -> SWRBResult:
    """Run ``replicates`` SWRB replicates of horizon ``H`` on ``pair`` (depths ``L`` in 1..H)."""
    K = check_replicates(replicates)
    H = check_horizon(horizon)
    depths = check_depths(tuple(depths) or (H,), H)
    gen = make_generator(seed, pair.device)
    dev = pair.device
    eos = pair.eos_token_id

    # 1. Overlap scan on one shared prefix per replicate.
    p_state, q_state = pair.start("p", K), pair.start("q", K)
    survival = torch.ones(K, dtype=torch.float64, device=dev)
    weights = torch.zeros(K, H, dtype=torch.float64, device=dev)
    overlap_tv = torch.zeros(K, H, dtype=torch.float64, device=dev)
    shared = torch.full((K, H), -1, dtype=torch.long, device=dev)
    evaluations = torch.zeros(K, dtype=torch.long, device=dev)
    u_done = torch.zeros(K, H + 1, dtype=torch.bool, device=dev)  # [:, s]: EOS within U_<=s
    # A residual pair is drawn at every scanned position; the one at J is used. Given U_<J it
    # is the residual draw of step 4, and it spares re-evaluating the pair at U_<J.
    x_res = torch.full((K, H), -1, dtype=torch.long, device=dev)
    y_res = torch.full((K, H), -1, dtype=torch.long, device=dev)
    for s in range(H):
        alive = survival > 0
        evaluations += alive.long()
        p = absorb_eos(tempered_probs(pair.logprobs(p_state), temperature), u_done[:, s], eos)
        q = absorb_eos(tempered_probs(pair.logprobs(q_state), temperature), u_done[:, s], eos)
        step = scan_step(p, q, gen)  # TV, overlap draw, residual draws (in that order)
        e = torch.where(alive, step.tv, torch.zeros_like(survival))
        overlap_tv[:, s] = e
        weights[:, s] = survival * e
        survival = torch.where(e >= 1.0, torch.zeros_like(survival), survival * (1.0 - e))
        u = step.shared
        shared[:, s] = u
        x_res[:, s], y_res[:, s] = step.x, step.y
        u_done[:, s + 1] = u_done[:, s] | ((u == eos) if eos is not None else False)
        if s + 1 == H or not bool((survival > 0).any()):
            break
        p_state, q_state = pair.advance_many([p_state, q_state], [u, u],  # one joint step
                                             checked=False)  # draws: in range

    # 2-3. Total divergence mass, capacities, and the branch position J ~ w / M.
    M = weights.sum(dim=1)
    w_L = unobserved_capacity(weights.cpu(), depths)
    diverges = M > 0
    J = torch.where(diverges, sample_categorical(weights, gen) + 1, torch.zeros_like(evaluations))

    # 4. Residual pair at U_<J, then the coupling on the two branches up to H.
    x_out = torch.full((K, H), -1, dtype=torch.long, device=dev)
    y_out = torch.full((K, H), -1, dtype=torch.long, device=dev)
    mismatch = torch.zeros(K, H, dtype=torch.bool, device=dev)
    continuation_tv = torch.zeros(K, H, dtype=torch.float64, device=dev)
    rows = torch.nonzero(diverges).squeeze(-1)
    if rows.numel() > 0:
        pos = J[rows] - 1  # 0-based column of position J; the states keep U_<J
        x = x_res[rows, pos]
        y = y_res[rows, pos]
        x_state = pair.truncate(pair.select(p_state, rows, checked=False), pos)
        y_state = pair.truncate(pair.select(q_state, rows, checked=False), pos)
        x_done, y_done = u_done[rows, pos], u_done[rows, pos].clone()
        while True:
            x_out[rows, pos] = x
            y_out[rows, pos] = y
            mismatch[rows, pos] = x != y
            if eos is not None:
                x_done, y_done = x_done | (x == eos), y_done | (y == eos)
            pos = pos + 1
            keep = torch.nonzero(pos < H).squeeze(-1)
            if keep.numel() == 0:
                break
            if keep.numel() < rows.numel():  # rows that reached H leave the batch
                x_state = pair.select(x_state, keep, checked=False)  # rows of nonzero
                y_state = pair.select(y_state, keep, checked=False)
                rows, pos, x_done, y_done = rows[keep], pos[keep], x_done[keep], y_done[keep]
                x, y = x[keep], y[keep]
            x_state, y_state = pair.advance_many([x_state, y_state], [x, y], checked=False)
            evaluations[rows] += 1
            p = absorb_eos(tempered_probs(pair.logprobs(x_state), temperature), x_done, eos)
            q = absorb_eos(tempered_probs(pair.logprobs(y_state), temperature), y_done, eos)
            draw = coupled_draw(p, q, gen)
            continuation_tv[rows, pos] = draw.tv
            x, y = draw.x, draw.y

    # 5. Outputs.
    M_cpu, J_cpu, mm = M.cpu(), J.cpu(), mismatch.cpu()
    D_J = mm.sum(dim=1).to(torch.float64) / H
    z_L = []
    for L in depths:
        offset = torch.arange(H).unsqueeze(0) - (J_cpu.unsqueeze(1) - 1)  # j = t - J
        window = (offset >= 0) & (offset < L)
        z_L.append(M_cpu * (mm & window).sum(dim=1).to(torch.float64) / H)
    z_L_t = torch.stack(z_L, dim=1)
    z_R = M_cpu * D_J
    return SWRBResult(
        depths=depths,
        z_R=z_R,
        z_O=M_cpu / H,
        z_Pi=torch.where(M_cpu > 0, M_cpu * (D_J - 1.0 / H), torch.zeros_like(M_cpu)),
        z_L=z_L_t,
        z_tail=z_R.unsqueeze(1) - z_L_t,
        w_L=w_L,
        M=M_cpu,
        J=J_cpu,
        overlap_tv=overlap_tv.cpu(),
        weights=weights.cpu(),
        shared=shared.cpu(),
        x=x_out.cpu(),
        y=y_out.cpu(),
        mismatch=mm,
        evaluations=evaluations.cpu(),
        continuation_tv=continuation_tv.cpu(),
    )
