"""A KV cache that appends into spare capacity instead of concatenating.

transformers' ``DynamicLayer`` grows by ``torch.cat`` at every decoding step, copying the whole
cache each time; for a 1,000-token prompt and a few dozen rows that copy costs as much as the
rest of the step on a CPU. :class:`GrowingLayer` keeps a buffer with spare slots along the
sequence axis, writes new entries in place and exposes ``keys``/``values`` as views of the
filled part, so a step only copies when the buffer is full (amortised O(1) per entry).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_SPARE = 32  # spare slots allocated beyond the current length, at least


def _spare(length: int) -> int:
    return max(MIN_SPARE, length // 8)


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` ``[n, kv_heads, L, head_dim]`` are views."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self._key_buf = keys.new_empty(0)
        self._value_buf = values.new_empty(0)
        self._rebuffer(keys, values, keys.shape[-2])

    def _rebuffer(self, keys: torch.Tensor, values: torch.Tensor, needed: int) -> None:
        """Copy ``keys``/``values`` into new buffers with room for ``needed`` entries + spare."""
        n, heads, length, dim = keys.shape
        capacity = needed + _spare(needed)
        self._key_buf = keys.new_empty(n, heads, capacity, dim)
        self._value_buf = values.new_empty(n, heads, capacity, values.shape[-1])
        self._key_buf[:, :, :length].copy_(keys)
        self._value_buf[:, :, :length].copy_(values)
        self.keys = self._key_buf[:, :, :length]
        self.values = self._value_buf[:, :, :length]

    def _owns_views(self) -> bool:
        """False if someone replaced ``keys``/``values`` (e.g. a press), so the buffer is stale."""
        return (
            self.keys.data_ptr() == self._key_buf.data_ptr()
            and self.values.data_ptr() == self._value_buf.data_ptr()
            and self.keys.shape[0] == self._key_buf.shape[0]
        )

    def update(
        self,
        key_states: torch.Tensor,  # [n, kv_heads, q_len, head_dim]
        value_states: torch.Tensor,
        cache_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        length, added = self.keys.shape[-2], key_states.shape[-2]
        if not self._owns_views() or length + added > self._key_buf.shape[-2]:
            self._rebuffer(self.keys, self.values, length + added)
        self._key_buf[:, :, length:length + added].copy_(key_states)
        self._value_buf[:, :, length:length + added].copy_(value_states)
        self.keys = self._key_buf[:, :, :length + added]
        self.values = self._value_buf[:, :, :length + added]
        return self.keys, self.values


def growing_cache(keys: list[torch.Tensor], values: list[torch.Tensor]) -> DynamicCache:
    """A cache of :class:`GrowingLayer` initialised with copies of the per-layer tensors."""
    cache = DynamicCache()
    cache.layers.extend(GrowingLayer(k, v) for k, v in zip(keys, values, strict=True))
    return cache
