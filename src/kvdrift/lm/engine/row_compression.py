"""The contract between a decoding-time rule and the storage of a row's cache.

A compression step reads one row's live entries in one layer, in the order kvpress's cache
holds them (:class:`RowEntries`: keys, values, the attention inputs of the last steps, the
step's position embeddings), and says what is left (:class:`RowKept`: which of those entries,
in the new cache order; where KV heads keep different counts, which are valid per head; where
the press re-values what it keeps, the new values). The rule never sees how the storage keeps
entries (masked in place, or dropped), and the storage never sees how the rule scores them:
:meth:`~kvdrift.lm.engine.decoding.DecodingRule.compress_row` is the step of kvpress's
``DecodingPress`` and ``CompressionRatioDecodingPress``. DMS's step is smaller: one entry leaves
its window and is hidden in the KV heads where
:meth:`~kvdrift.lm.engine.decoding_threshold.ThresholdRule.entry_score` is below the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class RowEntries:
    """One row's live entries in one layer, in kvpress's cache order, at a compression."""

    keys: torch.Tensor  # [kv, m, dim]
    values: torch.Tensor  # [kv, m, dim]
    inputs: torch.Tensor  # [w, hidden]: the layer's attention inputs of the last w steps
    position_embeddings: tuple[torch.Tensor, torch.Tensor]  # (cos, sin) [1, 1, dim], the step's
    length: int  # the row's generated tokens after the step just taken


@dataclass(frozen=True, eq=False)
class RowKept:
    """What a compression leaves of a :class:`RowEntries`: ``order`` ``[kv, k]`` indexes its
    entries, in the new cache order; ``valid`` ``[kv, k]`` bool where KV heads keep different
    counts (None: every one); ``values`` ``[kv, k, dim]`` where the press re-values what it
    keeps (None: the kept entries' own)."""

    order: torch.Tensor
    valid: torch.Tensor | None = None
    values: torch.Tensor | None = None


__all__ = ["RowEntries", "RowKept"]
