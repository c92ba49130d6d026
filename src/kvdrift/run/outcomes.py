"""Task outcomes of coupled rollouts: each replicate's X and Y texts scored against the answer.

Scoring needs text, so it happens where a tokenizer is: the runner asks the unit's pair
factory to decode when the factory can (:class:`TextDecoder`, e.g.
:class:`kvdrift.lm.factory.LMPairFactory`); finite tables have no text and are not scored.
A branch's text is its generated tokens up to (not including) its first EOS, or all ``H``
tokens when it emits none. Documents without an expected answer are not scored, and neither
is SWRB, which does not sample both complete texts from the start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import torch

from kvdrift.data.document import Document
from kvdrift.data.scoring import expected_answers, metric_name, score_text
from kvdrift.records.schema import SCORE_COLUMNS


@runtime_checkable
class TextDecoder(Protocol):
    """Something that turns generated token ids into text (a pair factory with a tokenizer)."""

    def decode(self, token_ids: Sequence[int]) -> str: ...


def until_eos(tokens: Sequence[int], eos_token_id: int | None) -> list[int]:
    """The tokens before the first EOS (all of them if there is none, or no EOS id)."""
    out = [int(t) for t in tokens]
    if eos_token_id is not None and eos_token_id in out:
        out = out[:out.index(eos_token_id)]
    return out


def branch_scores(
    doc: Document, tokens: torch.Tensor, eos_token_id: int | None, decoder: TextDecoder
) -> np.ndarray:
    """``[K]`` scores of ``[K, H]`` generated tokens, each decoded up to its first EOS."""
    cache: dict[tuple[int, ...], float] = {}
    out = np.empty(tokens.shape[0], dtype=np.float64)
    for k, row in enumerate(tokens.tolist()):
        ids = tuple(until_eos(row, eos_token_id))
        if ids not in cache:
            cache[ids] = score_text(doc, decoder.decode(list(ids)))
        out[k] = cache[ids]
    return out


def with_scores(
    replicates: pa.Table, doc: Document, x: torch.Tensor, y: torch.Tensor,
    eos_token_id: int | None, decoder: object,
) -> pa.Table:
    """``replicates`` with ``score_x``/``score_y`` added when ``doc`` has an expected answer
    and ``decoder`` is a :class:`TextDecoder`; unchanged otherwise."""
    if expected_answers(doc) is None or not isinstance(decoder, TextDecoder):
        return replicates
    metric_name(doc)  # an unknown metric is refused before any decoding
    for name, tokens in zip(SCORE_COLUMNS, (x, y), strict=True):
        replicates = replicates.append_column(
            name, pa.array(branch_scores(doc, tokens, eos_token_id, decoder), pa.float64()))
    return replicates
