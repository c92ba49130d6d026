"""A user's scorer checked where its scores are used: one line, not ``topk``'s traceback.

kvpress's ``ScorerPress.compress`` (and kvdrift's replay of a decoding press,
:mod:`kvdrift.lm.engine.decoding`) keep each KV head's best entries by ``scores.topk`` along the
last axis, so a ``score`` of one's own must return one floating-point score per entry, shaped
``(batch, kv_heads, seq_len)`` like the keys it was given, on their device. Scores of another
shape end in ``RuntimeError: selected index k out of range`` deep inside kvpress, or silently
keep the wrong entries (scores per query head, broadcast by ``topk``); here they are refused
as :class:`WrongScores`, naming the class, what it returned and what was expected, which the
press path and the decoding replay report as the unit's one line. kvpress's own scorers are
not checked (their tests do).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import kvpress
import torch

from kvdrift.lm.actions.attention_use import nested_presses


class WrongScores(ValueError):
    """A scorer's scores that cannot rank its keys (one line: the class, what, expected)."""


def own_scorer(press: Any) -> bool:
    """Whether ``press`` is a ``ScorerPress`` whose ``score`` is not kvpress's own."""
    method = getattr(type(press), "score", None)
    return isinstance(press, kvpress.ScorerPress) and method is not None and \
        str(getattr(method, "__module__", "")).split(".")[0] != "kvpress"


def check_scores(press: Any, scores: Any, keys: torch.Tensor) -> None:
    """Raise :class:`WrongScores` unless ``scores`` are ``keys``' ``(batch, kv_heads,
    seq_len)`` floating-point scores on their device (``press``'s, a scorer of one's own:
    kvpress's own are not checked)."""
    expected = tuple(keys.shape[:3])
    if not own_scorer(press) or (
            isinstance(scores, torch.Tensor) and tuple(scores.shape) == expected
            and scores.is_floating_point() and scores.device == keys.device):
        return
    got = (f"{tuple(scores.shape)} {scores.dtype} on {scores.device}"
           if isinstance(scores, torch.Tensor) else f"a {type(scores).__name__}")
    raise WrongScores(f"{type(press).__name__}.score() returned {got}; expected (batch, "
                      f"kv_heads, seq_len) = {expected} floating point on {keys.device}")


@contextlib.contextmanager
def checked_scorers(press: Any) -> Iterator[None]:
    """While the body runs, the scores of every scorer of one's own within ``press`` (itself,
    the presses it wraps or composes) are checked as they are returned (:func:`check_scores`);
    afterwards the presses are as they were."""
    wrapped = []
    for scorer in nested_presses(press):
        if not own_scorer(scorer) or any(scorer is w for w, _ in wrapped):
            continue
        own = vars(scorer).get("score") if hasattr(scorer, "__dict__") else None
        try:
            object.__setattr__(scorer, "score", _checking(scorer, scorer.score))
        except (AttributeError, TypeError):  # no instance attributes: left unchecked
            continue
        wrapped.append((scorer, own))
    try:
        yield
    finally:
        for scorer, own in wrapped:
            if own is None:
                vars(scorer).pop("score", None)
            else:
                vars(scorer)["score"] = own


def _checking(press: Any, score: Any) -> Any:
    @functools.wraps(score)
    def checked(*args: Any, **kwargs: Any) -> Any:
        scores = score(*args, **kwargs)
        keys = args[2] if len(args) > 2 else kwargs.get("keys")
        if isinstance(keys, torch.Tensor):
            check_scores(press, scores, keys)
        return scores
    return checked


__all__ = ["WrongScores", "check_scores", "checked_scorers", "own_scorer"]
