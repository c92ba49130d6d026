"""The stepwise maximal coupling of two next-token distributions (docs/method.md section 2).

All functions are batched over rows: distributions enter as ``[n, V]`` tensors and
tokens leave as ``[n]`` long tensors. Overlaps and TV are computed in float64.
Every sampler takes an explicit ``torch.Generator`` so that runs are reproducible;
each call consumes a fixed number of random draws whatever the inputs, so two runs
with the same seed stay in lockstep.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvdrift import checks

PROB_TOLERANCE = 1e-6


def check_probs(probs: torch.Tensor, what: str = "probabilities") -> torch.Tensor:
    """Validate rows of probabilities (non-negative, finite, summing to 1) and return float64."""
    probs = torch.as_tensor(probs, dtype=torch.float64)
    if probs.ndim == 1:
        probs = probs.unsqueeze(0)
    if probs.ndim != 2 or probs.shape[-1] < 1:
        raise ValueError(f"{what} must have shape [rows, vocab]; got {tuple(probs.shape)}")
    if not torch.isfinite(probs).all():
        bad = probs[(~torch.isfinite(probs)).any(dim=-1)][0, :8].tolist()
        raise ValueError(f"{what} must be finite; got a row starting {bad}")
    if (probs < 0).any():
        bad = probs[(probs < 0).any(dim=-1)][0].tolist()
        raise ValueError(f"{what} must be non-negative; got row {bad}")
    sums = probs.sum(dim=-1)
    if ((sums - 1).abs() > PROB_TOLERANCE).any():
        bad = sums[((sums - 1).abs() > PROB_TOLERANCE)][0].item()
        raise ValueError(f"{what} must sum to 1 (within {PROB_TOLERANCE}); a row sums to {bad:.6g}")
    return probs


def tempered_probs(logprobs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Turn temperature-1 log-probabilities ``[n, V]`` into float64 probabilities.

    ``temperature = 0`` means greedy decoding: a point mass on the arg-max token
    (the lowest index among ties), so the coupling compares the two greedy choices.
    """
    checks.number(temperature, "temperature", 0, rule="a finite number >= 0 (0 = greedy)")
    logprobs = logprobs.to(torch.float64)
    if temperature == 0:
        out = torch.zeros_like(logprobs)
        out.scatter_(-1, logprobs.argmax(dim=-1, keepdim=True), 1.0)
        return out
    if temperature != 1:  # x / 1 is x exactly: skip a pass over the vocabulary
        logprobs = logprobs / temperature
    return torch.softmax(logprobs, dim=-1)


def absorb_eos(
    probs: torch.Tensor, absorbed: torch.Tensor, eos_token_id: int | None
) -> torch.Tensor:
    """Replace the rows of branches that already emitted EOS by a point mass on EOS.

    Reads nothing back from the device (no ``absorbed.any()``): every row goes through one
    ``where``, which keeps the other rows' values exactly."""
    if eos_token_id is None or eos_token_id >= probs.shape[-1]:  # no row can draw it
        return probs
    point = torch.zeros_like(probs[:1])
    point[0, eos_token_id] = 1.0
    return torch.where(absorbed.to(probs.device)[:, None], point, probs)


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total-variation distance per row, ``0.5 * ||p - q||_1`` in float64, clipped to [0, 1]."""
    return _tv_of_difference(p.to(torch.float64) - q.to(torch.float64))


def _tv_of_difference(d: torch.Tensor) -> torch.Tensor:
    """``0.5 * ||d||_1`` per row of the float64 difference ``d = p - q``, clipped to [0, 1]."""
    return (0.5 * d.abs().sum(dim=-1)).clamp(0.0, 1.0)


def sample_categorical(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one index per row with probability proportional to non-negative ``weights``.

    Inverse-CDF sampling with one uniform per row. Rows whose weights are all zero
    return the last index (callers mask them); zero-weight indices are never returned
    otherwise.
    """
    return _sample_cdf(weights.to(torch.float64).cumsum(dim=-1), generator)


def _sample_cdf(cdf: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """:func:`sample_categorical` from the float64 cumulative sums ``cdf`` of its weights."""
    total = cdf[:, -1:]
    u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=torch.float64,
                   device=generator.device).to(cdf.device)
    # Keep the target strictly below the total, so rounding never lands past the last
    # positive weight (trailing zero weights have cdf == total and are never chosen).
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp_(max=cdf.shape[-1] - 1)


@dataclass(frozen=True)
class CoupledDraw:
    """One step of the coupling: the two tokens and the TV ``e`` per row."""

    x: torch.Tensor  # [n] long, drawn from p
    y: torch.Tensor  # [n] long, drawn from q
    tv: torch.Tensor  # [n] float64, e = P(x != y | past)


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The overlap measure ``c = min(p, q)`` (float64)."""
    return torch.minimum(p.to(torch.float64), q.to(torch.float64))


def overlap_draw(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw a shared token from ``c / (1 - e)`` (rows with no overlap return the last index)."""
    return sample_categorical(overlap(p, q), generator)


def residual_draw(
    p: torch.Tensor, q: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``X ~ (p - c)/e`` and ``Y ~ (q - c)/e`` independently (they differ where e > 0)."""
    return _residual_draw(p.to(torch.float64) - q.to(torch.float64), generator)


def _residual_draw(
    d: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`residual_draw` from the float64 difference ``d = p - q``: ``p - min(p, q)`` is
    ``max(d, 0)`` and ``q - min(p, q)`` is ``max(-d, 0)``, bit for bit (IEEE subtraction is
    exact in sign: ``q - p == -(p - q)``), so the draws are the same."""
    x = _sample_cdf(d.clamp_min(0.0).cumsum_(dim=-1), generator)
    y = _sample_cdf(d.neg().clamp_min_(0.0).cumsum_(dim=-1), generator)
    return x, y


@dataclass(frozen=True)
class Step:
    """Everything :func:`coupled_draw` computes from ``p`` and ``q`` besides the tokens
    (:func:`scan_step` returns it for SWRB's scan)."""

    tv: torch.Tensor  # [n] float64, e = TV(p, q)
    shared: torch.Tensor  # [n] long, a draw from the overlap
    x: torch.Tensor  # [n] long, residual draw of p
    y: torch.Tensor  # [n] long, residual draw of q


def coupled_draw(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator) -> CoupledDraw:
    """One draw of the stepwise maximal coupling of ``p`` and ``q`` (``[n, V]`` each).

    With probability ``1 - e`` both tokens equal a draw from the overlap; otherwise each
    comes from its own residual. Marginals are exactly ``p`` and ``q`` and
    ``P(X != Y) = e = TV(p, q)``.
    """
    if p.shape != q.shape:
        raise ValueError(
            f"p and q must have the same shape; got {tuple(p.shape)} and {tuple(q.shape)}")
    p, q = p.to(torch.float64), q.to(torch.float64)
    d = p - q  # one pass shared by the TV and both residuals
    e = _tv_of_difference(d)
    u = torch.rand(p.shape[0], generator=generator, dtype=torch.float64,
                   device=generator.device).to(p.device)
    z, xr, yr = _overlap_and_residual_draws(p, q, d, generator)
    split = u < e
    return CoupledDraw(x=torch.where(split, xr, z), y=torch.where(split, yr, z), tv=e)


def scan_step(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator) -> Step:
    """``tv_distance``, then ``overlap_draw``, then ``residual_draw`` of ``p`` and ``q``, in that
    order (the same values and random draws), sharing one pass for ``p - q``."""
    p, q = p.to(torch.float64), q.to(torch.float64)
    d = p - q
    e = _tv_of_difference(d)
    z, x, y = _overlap_and_residual_draws(p, q, d, generator)
    return Step(tv=e, shared=z, x=x, y=y)


def _overlap_and_residual_draws(
    p: torch.Tensor, q: torch.Tensor, d: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A shared draw from the overlap, then the residual pair from ``d = p - q`` (float64
    rows), in that order: the draws both :func:`coupled_draw` and :func:`scan_step` make."""
    z = _sample_cdf(overlap(p, q).cumsum_(dim=-1), generator)
    x, y = _residual_draw(d, generator)
    return z, x, y
