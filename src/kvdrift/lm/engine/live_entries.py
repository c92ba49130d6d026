"""What one compression step of a decoding-time press sees and returns, for one row and layer.

The contract between the storage of compressed rows (:mod:`~kvdrift.lm.engine.live_rows`) and
the rules that decide what a compression keeps (:mod:`~kvdrift.lm.engine.decoding`): a step
takes the row's live entries in the order kvpress's cache holds them and returns the row's new
live entries, in the new cache order. Today's rules return a subset of the entries they were
given; a rule that merges evicted values into kept ones returns changed values, and one that
keeps different counts per KV head marks, per head, which of its returned slots hold an entry.
The storage holds whatever is returned and drops everything else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class LiveEntries:
    """One row's live entries of one layer, in cache order.

    ``valid`` is None when every KV head holds all ``m`` entries; else ``[kv_heads, m]`` bool,
    the slots each head holds (a head's entries keep their cache order among its valid slots).
    """

    keys: torch.Tensor  # [kv_heads, m, head_dim]
    values: torch.Tensor  # [kv_heads, m, head_dim]
    valid: torch.Tensor | None = None  # [kv_heads, m] bool

    def __post_init__(self) -> None:
        if self.keys.dim() != 3 or tuple(self.keys.shape[:2]) != tuple(self.values.shape[:2]):
            raise ValueError(f"live keys {tuple(self.keys.shape)} and values "
                             f"{tuple(self.values.shape)} must be [kv_heads, m, dim] alike")
        if self.valid is not None and tuple(self.valid.shape) != tuple(self.keys.shape[:2]):
            raise ValueError(f"valid must have shape {tuple(self.keys.shape[:2])}; got "
                             f"{tuple(self.valid.shape)}")

    @property
    def width(self) -> int:
        """Slots the entries take (the most any KV head holds, padding included)."""
        return self.keys.shape[1]

    def head_valid(self) -> torch.Tensor:
        """``[kv_heads, m]`` bool: the slots each head holds (all when ``valid`` is None)."""
        if self.valid is not None:
            return self.valid
        return torch.ones(self.keys.shape[:2], dtype=torch.bool, device=self.keys.device)


__all__ = ["LiveEntries"]
