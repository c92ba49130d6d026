"""Fitting a synthetic prompt to a token budget, and the length labels used for strata.

A task renders its prompt from a number of filler units (sentences, list items, words). We
look for the largest unit count whose prompt is not above the target: a first guess from
characters per token, then interpolation between the closest counts known to be under and
over the target, with a bisection fallback. Tokenizer calls dominate the cost, so they are
capped; the result is always a measured count at or below the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TokenCounter = Callable[[str], int]

_PROBE_UNITS = 64  # units rendered (without tokenizing) to estimate characters per unit


def token_counter(tokenizer: Any) -> TokenCounter:
    """A ``str -> int`` token counter from a Hugging Face tokenizer or a plain callable.

    Counts exclude special tokens (BOS, chat template): the budget is for the raw prompt text.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # fast HF tokenizer: call the Rust tokenizer directly
        return lambda text: len(backend.encode(text, add_special_tokens=False).ids)
    if hasattr(tokenizer, "encode"):
        def count(text: str) -> int:
            out = tokenizer.encode(text, add_special_tokens=False)
            return len(out.ids) if hasattr(out, "ids") else len(out)

        return count
    if callable(tokenizer):
        return tokenizer
    raise TypeError(
        f"expected a tokenizer with .encode or a callable str -> int; got {type(tokenizer)!r}"
    )


def length_band(target_tokens: int) -> str:
    """Short label of a target length for strata: 1000 -> "1k", 4096 -> "4k", 1500 -> "1.5k"."""
    if target_tokens < 1000:
        return str(target_tokens)
    for unit in (1024, 1000):
        if target_tokens % unit == 0:
            return f"{target_tokens // unit}k"
    return f"{target_tokens / 1000:.1f}".rstrip("0").rstrip(".") + "k"


@dataclass(frozen=True)
class Fit:
    """A prompt fitted to a budget: its text, filler units, and measured token count."""

    text: str
    units: int
    tokens: int


def fit_to_length(
    render: Callable[[int], str],
    count_tokens: TokenCounter,
    target_tokens: int,
    *,
    tolerance: float = 0.03,
    max_calls: int = 12,
) -> Fit:
    """Largest-unit prompt with at most ``target_tokens`` tokens, aiming within ``tolerance``.

    ``render(n)`` must build the full prompt from ``n`` filler units, growing (roughly
    linearly) with ``n``. Stops once the prompt is within ``tolerance`` below the target, when
    no unit count lies between the best under and the best over, or after ``max_calls``
    tokenizer calls. Raises ValueError when the prompt without any filler is over the target.
    """
    text0 = render(0)
    tokens0 = count_tokens(text0)
    if tokens0 > target_tokens:
        raise ValueError(
            f"the task's fixed text alone is {tokens0} tokens, above the target of "
            f"{target_tokens}; use a larger target length"
        )
    best = Fit(text0, 0, tokens0)  # largest count known to fit
    over: tuple[int, int] | None = None  # smallest (units, tokens) known to exceed
    floor = (1.0 - tolerance) * target_tokens
    aim = (1.0 - tolerance / 2) * target_tokens

    chars_per_token = max(len(text0), 1) / max(tokens0, 1)
    chars_per_unit = max((len(render(_PROBE_UNITS)) - len(text0)) / _PROBE_UNITS, 1.0)
    n = max(1, round((aim - tokens0) * chars_per_token / chars_per_unit))
    calls, last_side, streak = 1, "", 0
    while calls < max_calls and best.tokens < floor:
        if over is not None and over[0] - best.units <= 1:
            break
        text = render(n)
        tokens = count_tokens(text)
        calls += 1
        side = "under" if tokens <= target_tokens else "over"
        if side == "under":
            best = Fit(text, n, tokens)
        else:
            over = (n, tokens)
        streak = streak + 1 if side == last_side else 1
        last_side = side
        n = _next_guess(best, over, tokens0, aim, bisect=over is not None and streak >= 2)
    return best


def _next_guess(
    best: Fit, over: tuple[int, int] | None, tokens0: int, aim: float, *, bisect: bool
) -> int:
    """Next unit count to try: interpolate towards ``aim``; bisect when progress stalls."""
    if over is None:  # no upper bracket yet: extrapolate from (0, tokens0) through best
        slope = (best.tokens - tokens0) / best.units if best.units else 0.0
        step = math.ceil((aim - best.tokens) / slope) if slope > 0 else best.units + 1
        return best.units + min(max(step, 1), 8 * best.units + 8)
    lo, hi = best.units, over[0]
    if bisect:
        return (lo + hi) // 2 if hi - lo > 1 else lo
    slope = (over[1] - best.tokens) / (hi - lo)
    guess = lo + round((aim - best.tokens) / slope) if slope > 0 else (lo + hi) // 2
    return min(max(guess, lo + 1), hi - 1)
