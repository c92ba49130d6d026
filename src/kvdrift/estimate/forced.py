"""Teacher-forced numbers along the reference path X (docs/method.md section 10).

At each position t the rollouts already compute P's next-token distribution on ``X_<t`` and
Q's on ``X_<t`` (before divergence Q along Y, after it Q forced along X). From the two
temperature-1 log-probabilities ``[n, V]`` and the drawn ``X_t`` this module computes, at the
run's temperature (llama.cpp ``perplexity --kl-divergence`` definitions, on X):

- ``logp_x = log p_t(X_t)`` and ``logq_x = log q_t(X_t)``;
- ``kl = KL(p_t || q_t) = sum_u p(u) (log p(u) - log q(u))`` (``0 log 0 = 0``; infinite where
  q misses mass of p, e.g. at temperature 0 when the greedy choices differ);
- ``top1``: 1.0 where the two arg-maxes agree (lowest index among ties), else 0.0.

Positions after X's first EOS (P absorbed in EOS) are not predictions of either model: every
number there is NaN. The EOS position itself counts (the models' probability of EOS there is a
prediction like any other).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvdrift import checks


def tempered_logprobs(logprobs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probabilities ``[n, V]`` at ``temperature`` (float64; 0: log of a greedy point mass).

    ``logprobs`` are temperature-1 log-probabilities (each row's exponentials sum to 1), so at
    temperature 1 they are returned as they are (float64, not copied)."""
    checks.number(temperature, "temperature", 0, rule="a finite number >= 0 (0 = greedy)")
    logprobs = logprobs.to(torch.float64)
    if temperature == 0:
        out = torch.full_like(logprobs, float("-inf"))
        out.scatter_(-1, logprobs.argmax(dim=-1, keepdim=True), 0.0)
        return out
    if temperature == 1:  # already normalised: log_softmax would only add rounding
        return logprobs
    return torch.log_softmax(logprobs / temperature, dim=-1)


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per row from log-probabilities ``[n, V]`` (float64, ``0 log 0 = 0``)."""
    p = logp.exp()
    terms = (logp - logq).mul_(p)  # in place: the same values, one [n, V] buffer fewer
    terms.masked_fill_(~(p > 0), 0.0)
    return terms.sum(dim=-1).clamp_min(0.0)


@dataclass(frozen=True)
class ForcedStep:
    """Teacher-forced numbers at one position, one entry per row (``[n]`` float64)."""

    logp_x: torch.Tensor
    logq_x: torch.Tensor
    kl: torch.Tensor
    top1: torch.Tensor  # 1.0 / 0.0 (NaN after X's EOS)


def forced_step(
    p_logprobs: torch.Tensor, q_logprobs: torch.Tensor, x: torch.Tensor, temperature: float,
    after_eos: torch.Tensor | None = None,
) -> ForcedStep:
    """The numbers at one position.

    Parameters
    ----------
    p_logprobs, q_logprobs : ``[n, V]``
        Temperature-1 log-probabilities of P and Q on the same history ``X_<t`` (as the kernel
        pair returns them, before EOS absorption).
    x : ``[n]`` long
        The reference tokens ``X_t``.
    temperature : float
        The run's temperature.
    after_eos : ``[n]`` bool, optional
        Rows whose X emitted EOS before t: their numbers are NaN.
    """
    logp = tempered_logprobs(p_logprobs, temperature)
    logq = tempered_logprobs(q_logprobs, temperature)
    idx = x.to(logp.device).long().unsqueeze(-1)
    out = {
        "logp_x": logp.gather(-1, idx).squeeze(-1),
        "logq_x": logq.gather(-1, idx).squeeze(-1),
        "kl": kl_divergence(logp, logq),
        "top1": (p_logprobs.argmax(-1) == q_logprobs.argmax(-1)).to(torch.float64),
    }
    if after_eos is not None:  # NaN after X's EOS (no host read of after_eos.any())
        mask = after_eos.to(logp.device)
        out = {k: v.masked_fill(mask, float("nan")) for k, v in out.items()}
    return ForcedStep(**out)
