"""Self-speculative decoding read off the coupling (docs/method.md section 10).

Target P (full cache), drafter Q (the action's cache, computing its own entries for the
accepted tokens), Leviathan et al. 2023, Algorithm 1 (https://arxiv.org/abs/2211.17192): a
round drafts up to ``gamma`` tokens from Q, accepts draft ``y`` with probability
``min(1, p(y)/q(y))``, resamples the first rejected position from ``norm((p - q)_+)``, and adds
a bonus token from P when all ``gamma`` drafts are accepted. The generation stops after X's
first EOS or at the horizon: ``N = min(e_X, H)`` tokens.

Given the whole accepted path X, the draft at position t was accepted with probability
``a_t = min(p_t(X_t), q_t(X_t)) / p_t(X_t)``, independently across positions (see
``docs/method.md``), so the expected number of verification rounds given X follows from the
``a_t`` by a recursion over round starts (:func:`expected_rounds`); no simulation.

Arrays are numpy, ``[n, H]`` with positions ``t = 1..H`` in columns ``0..H-1``.
"""

from __future__ import annotations

import numpy as np

from kvdrift import checks
from kvdrift.divergence import diverged

#: Draft lengths reported for tokens per round.
GAMMAS = (1, 2, 4, 8, 16)
#: The first round's accepted-length survival ``P(A >= k)`` is reported for ``k = 1..16``.
FIRST_ROUND_MAX = 16


def acceptance_probs(logp_x: np.ndarray, logq_x: np.ndarray) -> np.ndarray:
    """``a_t = min(1, q_t(X_t) / p_t(X_t))`` from the log-probabilities of ``X_t`` (NaN stays)."""
    logp_x, logq_x = np.asarray(logp_x, dtype=float), np.asarray(logq_x, dtype=float)
    with np.errstate(invalid="ignore", over="ignore"):
        ratio = np.exp(np.minimum(logq_x - logp_x, 0.0))
    return np.where(np.isnan(logp_x) | np.isnan(logq_x), np.nan, ratio)


def generated_lengths(x_eos: np.ndarray) -> np.ndarray:
    """``N = min(e_X, H)`` per row: X's first EOS position (inclusive), else the horizon.

    ``x_eos[..., t - 1]`` flags that X emitted EOS at or before t.
    """
    x_eos = np.asarray(x_eos, dtype=bool)
    H = x_eos.shape[-1]
    return np.where(x_eos.any(axis=-1), x_eos.argmax(axis=-1) + 1, H)


def before_end(x_eos: np.ndarray) -> np.ndarray:
    """``[..., H]`` True at positions ``t <= N`` (X has not emitted EOS before t)."""
    x_eos = np.asarray(x_eos, dtype=bool)
    return ~np.concatenate([np.zeros_like(x_eos[..., :1]), x_eos[..., :-1]], axis=-1)


def expected_rounds(accept: np.ndarray, lengths: np.ndarray, gamma: int) -> np.ndarray:
    """Expected verification rounds to generate ``N`` tokens with draft length ``gamma``.

    ``accept`` ``[n, H]`` holds ``a_t`` (only ``t <= N`` are read), ``lengths`` ``[n]`` holds
    ``N``. With ``r(s)`` the expected rounds from a round starting at position s (``r(s) = 0``
    for ``s > N``) and ``g = min(gamma, N - s + 1)`` drafts::

        r(s) = 1 + sum_{j<g} (prod_{i<j} a_{s+i}) (1 - a_{s+j}) r(s + j + 1)
                 + (prod_{i<g} a_{s+i}) r(s + g + 1)

    (a rejection at ``s + j`` resamples that token; all ``g`` accepted add a bonus token at
    ``s + g`` when it is within N). Returns ``r(1)`` per row.
    """
    checks.integer(gamma, "draft length gamma", 1)
    accept = np.asarray(accept, dtype=float)
    n, H = accept.shape
    N = np.asarray(lengths, dtype=np.int64).reshape(n)
    if ((N < 1) | (N > H)).any():
        raise ValueError(f"generated lengths must be within 1..{H}")
    a = np.ones((n, H + gamma + 3))
    a[:, 1:H + 1] = np.nan_to_num(accept, nan=1.0)
    r = np.zeros((n, H + gamma + 3))  # r[:, s] for s = 1..H (+ zeros past N)
    rows = np.arange(n)
    for s in range(H, 0, -1):
        live = s <= N
        g = np.minimum(gamma, N - s + 1)
        total = np.ones(n)
        surv = np.ones(n)
        for j in range(gamma):
            step = j < g
            a_j = a[:, s + j]
            total += np.where(step, surv * (1 - a_j) * r[:, s + j + 1], 0.0)
            surv = np.where(step, surv * a_j, surv)
        total += surv * r[rows, np.clip(s + g + 1, 0, r.shape[1] - 1)]
        r[:, s] = np.where(live, total, 0.0)
    return r[:, 1]


def first_round_survival(tau: np.ndarray, x_eos: np.ndarray, kmax: int) -> np.ndarray:
    """``[..., kmax]`` indicators of ``A >= k``, k = 1..kmax, for the first round's accepted length.

    The first round drafts along the accepted text from the prompt, so its first rejection is
    the coupling's divergence ``tau``: ``A >= k`` iff no rejection at 1..k and the generation
    reaches k, i.e. ``tau > k`` (or never) and X has not emitted EOS before k. For draft length
    ``gamma >= k`` this is gamma-free; ``P(A = k) = P(A >= k) - P(A >= k + 1)`` for ``k < gamma``
    and ``P(A = gamma) = P(A >= gamma)``.
    """
    tau = np.asarray(tau)
    H = np.asarray(x_eos).shape[-1]
    k = np.arange(1, kmax + 1)
    alive = before_end(x_eos)  # [..., H]
    reach = alive[..., np.minimum(k, H) - 1] & (k <= H)
    later = ~diverged(tau)[..., None] | (tau[..., None] > k)
    return (reach & later).astype(np.float64)
