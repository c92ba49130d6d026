"""A KV cache whose prompt part is shared by every row and whose generated part is per row.

Every row of every path on one side of a kernel pair attends to the same prompt entries (the
full prompt for P, the evicted one for Q); only the generated entries differ between rows.
:class:`SharedPromptLayer` stores the prompt once (batch of one, by reference: never copied)
and each row's generated entries in a buffer with spare room along the sequence axis, so a
decoding step writes in place and a fork (``select``) copies only generated entries.

transformers sees an ordinary ``DynamicCache``: ``update`` appends the new entries and returns
the rows' generated keys/values ``[n, kv_heads, G, head_dim]``. The prompt part reaches the
attention through the registered attention function of :mod:`kvdrift.lm.engine.shared_attention`,
which the cache is handed to as a keyword argument of the model's forward.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_SPARE = 32  # spare generated slots allocated beyond the current length, at least
SEQ = 2  # the sequence axis of every key/value tensor [rows, kv_heads, entries, head_dim]
HOLE_STEP = torch.iinfo(torch.long).max  # slot_step of a slot that holds no generated token


def spare_slots(length: int) -> int:
    """Spare slots a buffer holding ``length`` entries gets: 1/8 more, at least ``MIN_SPARE``
    (amortised O(1) appends, at most 1/8 unused memory on long generations)."""
    return max(MIN_SPARE, length // 8)


class SharedPromptLayer(DynamicLayer):
    """One layer: shared prompt ``[1, kv_heads, P, head_dim]`` + per-row generated entries.

    ``keys``/``values`` are views ``[n, kv_heads, G, head_dim]`` of the filled part of the
    generated buffers; ``prompt_keys``/``prompt_values`` are the side's prompt tensors and
    ``prompt_live`` (``[1, kv_heads, P]`` bool, or None: all) the prompt entries each KV head
    attends to (head-adaptive presses keep every entry and hide some per head).
    """

    def __init__(
        self,
        prompt_keys: torch.Tensor,  # [1, kv_heads, P, head_dim]
        prompt_values: torch.Tensor,  # [1, kv_heads, P, head_dim]
        keys: torch.Tensor,  # [n, kv_heads, G, head_dim]
        values: torch.Tensor,  # [n, kv_heads, G, head_dim]
        prompt_live: torch.Tensor | None = None,  # [1, kv_heads, P] bool
        reserve: int = 0,  # generated slots to allocate at once (0: as they come)
    ) -> None:
        super().__init__()
        if prompt_keys.shape[0] != 1 or prompt_values.shape[0] != 1:
            raise ValueError("the shared prompt must be a batch of one")
        if prompt_live is not None and tuple(prompt_live.shape) != tuple(prompt_keys.shape[:3]):
            raise ValueError(f"prompt_live must have shape {tuple(prompt_keys.shape[:3])}; got "
                             f"{tuple(prompt_live.shape)}")
        if keys.dim() != 4 or tuple(keys.shape[:3]) != tuple(values.shape[:3]):
            raise ValueError(f"generated keys {tuple(keys.shape)} and values "
                             f"{tuple(values.shape)} must be [rows, kv_heads, entries, dim] alike")
        self.prompt_keys = prompt_keys
        self.prompt_values = prompt_values
        self.prompt_live = prompt_live
        self.lazy_initialization(keys, values)
        self._rebuffer(keys, values, keys.shape[SEQ], reserve)

    @property
    def rows(self) -> int:
        return self.keys.shape[0]

    @property
    def capacity(self) -> int:
        """Generated entries the buffers hold before they must be reallocated."""
        return self._key_buf.shape[SEQ]

    def _rebuffer(self, keys: torch.Tensor, values: torch.Tensor, needed: int,
                  reserve: int = 0) -> None:
        """Copy ``keys``/``values`` into new buffers with room for ``needed`` entries + spare,
        or for ``reserve`` entries if that is more (then :meth:`reserve` never regrows them
        before they hold ``reserve``)."""
        n, heads, length, dim = keys.shape
        capacity = max(needed + spare_slots(needed), reserve)
        key_buf = keys.new_empty(n, heads, capacity, dim)
        value_buf = values.new_empty(n, heads, capacity, values.shape[-1])
        key_buf[:, :, :length].copy_(keys)
        value_buf[:, :, :length].copy_(values)
        self._key_buf, self._value_buf = key_buf, value_buf
        self.keys = key_buf[:, :, :length]
        self.values = value_buf[:, :, :length]

    def update(
        self,
        key_states: torch.Tensor,  # [n, kv_heads, q_len, head_dim]
        value_states: torch.Tensor,
        cache_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new entries in place; returns the generated keys/values of every row."""
        key_slots, value_slots = self.reserve(key_states.shape[SEQ])
        key_slots.copy_(key_states)
        value_slots.copy_(value_states)
        return self.keys, self.values

    def reserve(self, added: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Extend ``keys``/``values`` by ``added`` slots (regrowing the buffers if needed) and
        return the views of the new slots, for the caller to write."""
        length = self.keys.shape[SEQ]
        if length + added > self.capacity:
            self._rebuffer(self.keys, self.values, length + added)
        self.keys = self._key_buf[:, :, :length + added]
        self.values = self._value_buf[:, :, :length + added]
        return (self._key_buf[:, :, length:length + added],
                self._value_buf[:, :, length:length + added])

    def get_seq_length(self) -> int:
        """Generated slots held (the prompt is not counted: it is not part of the buffers)."""
        return self.keys.shape[SEQ]

    def adopt(self, key_buf: torch.Tensor, value_buf: torch.Tensor,
              length: int) -> SharedPromptLayer:
        """A layer over this one's prompt whose generated buffers are ``key_buf``/``value_buf``
        (``[rows, kv_heads, capacity, head_dim]``, the first ``length`` slots filled), taken
        as they are: no copy."""
        layer = SharedPromptLayer.__new__(SharedPromptLayer)
        DynamicLayer.__init__(layer)
        layer.dtype, layer.device, layer.is_initialized = key_buf.dtype, key_buf.device, True
        layer.prompt_keys, layer.prompt_values = self.prompt_keys, self.prompt_values
        layer.prompt_live = self.prompt_live
        layer._key_buf, layer._value_buf = key_buf, value_buf
        layer.keys = key_buf[:, :, :length]
        layer.values = value_buf[:, :, :length]
        return layer

    def take(self, rows: torch.Tensor) -> SharedPromptLayer:
        """A layer of the given rows: shares the prompt, copies only the generated entries
        (the rows of the buffers, spare slots included: one operator per buffer)."""
        return self.adopt(self._key_buf.index_select(0, rows),
                           self._value_buf.index_select(0, rows), self.keys.shape[SEQ])

    @staticmethod
    def join(layers: list[SharedPromptLayer], width: int) -> SharedPromptLayer:
        """Rows of several layers with the same prompt, generated parts padded to ``width``
        (padding slots hold zeros: masked, but never NaN); the buffers keep the largest
        capacity of the parts (a reservation, :meth:`SharedPromptCache.empty`, carries over)."""
        first = layers[0]
        if any(layer.prompt_keys is not first.prompt_keys for layer in layers):
            raise ValueError("only rows that share one prompt can be joined")
        rows = sum(layer.rows for layer in layers)
        heads, dim, value_dim = first.keys.shape[1], first.keys.shape[3], first.values.shape[3]
        capacity = max(width + spare_slots(width), max(layer.capacity for layer in layers))
        key_buf = first.keys.new_empty(rows, heads, capacity, dim)
        value_buf = first.values.new_empty(rows, heads, capacity, value_dim)
        targets, sources, start = [], [], 0
        for layer in layers:
            stop, length = start + layer.rows, layer.keys.shape[SEQ]
            if length < width:  # holes up to the common width
                key_buf[start:stop, :, length:width].zero_()
                value_buf[start:stop, :, length:width].zero_()
            targets += [key_buf[start:stop, :, :length], value_buf[start:stop, :, :length]]
            sources += [layer.keys, layer.values]
            start = stop
        torch._foreach_copy_(targets, sources)  # every part's entries in one operator
        return first.adopt(key_buf, value_buf, width)


class SharedPromptCache(DynamicCache):
    """A ``DynamicCache`` of :class:`SharedPromptLayer` (one per model layer)."""

    def __init__(self, layers: list[SharedPromptLayer]) -> None:
        super().__init__()
        self.layers.extend(layers)

    @classmethod
    def empty(
        cls, prompt_keys: tuple[torch.Tensor, ...], prompt_values: tuple[torch.Tensor, ...],
        rows: int, prompt_live: tuple[torch.Tensor | None, ...] | None = None,
        reserve: int = 0,
    ) -> SharedPromptCache:
        """``rows`` rows with no generated entries over the given per-layer prompt tensors
        (layers may hold different numbers of prompt entries), with buffers for ``reserve``
        generated entries allocated at once.

        A long generation whose length is known reserves it: buffers grown by copies left
        each layer's old block behind at every regrowth, blocks the C allocator could not
        reuse for the next, larger one (docs/long-generations.md). ``torch.empty`` writes no
        page, so a reservation costs resident memory as its slots are written."""
        live = prompt_live if prompt_live is not None else (None,) * len(prompt_keys)
        layers = []
        for k, v, m in zip(prompt_keys, prompt_values, live, strict=True):
            heads, dim = k.shape[1], k.shape[3]
            layers.append(SharedPromptLayer(k, v, k.new_empty(rows, heads, 0, dim),
                                            v.new_empty(rows, heads, 0, v.shape[3]), m,
                                            reserve))
        return cls(layers)

    @property
    def rows(self) -> int:
        return self.layers[0].rows

    def take(self, rows: torch.Tensor) -> SharedPromptCache:
        """The given rows (a fork): prompt shared, generated entries copied."""
        return SharedPromptCache([layer.take(rows) for layer in self.layers])

    @staticmethod
    def join(caches: list[SharedPromptCache]) -> SharedPromptCache:
        """All rows of several caches over one prompt, in order (shorter ones padded)."""
        width = max(c.get_seq_length() for c in caches)
        return SharedPromptCache([SharedPromptLayer.join(list(group), width)
                                  for group in zip(*(c.layers for c in caches), strict=True)])


class GroupedLayer(DynamicLayer):
    """One layer of several path states' caches stepped in one forward (a joint step).

    Rows ``bounds[i]:bounds[i + 1]`` of the batch belong to ``parts[i]`` (a state's
    :class:`SharedPromptLayer`); ``update`` appends each part's new entries to its own buffers in
    place. The attention reads the parts from here (the keys/values it is handed are only the
    new entries), so rows never see another state's generated entries.
    """

    def __init__(self, parts: list[SharedPromptLayer], bounds: list[int]) -> None:
        super().__init__()
        if len(bounds) != len(parts) + 1:
            raise ValueError("bounds must hold one more entry than parts")
        self.parts = parts
        self.bounds = bounds
        first = parts[0]
        self.lazy_initialization(first.keys, first.values)

    def update(
        self,
        key_states: torch.Tensor,  # [rows of all parts, kv_heads, 1, head_dim]
        value_states: torch.Tensor,
        cache_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append each part's rows to that part; returns the new entries (the attention reads
        every part's generated entries from ``parts``). Every part's keys and values are
        written by one multi-tensor copy (one operator, not two per part)."""
        added = key_states.shape[SEQ]
        targets, sources = [], []
        for part, start, stop in zip(self.parts, self.bounds, self.bounds[1:], strict=False):
            targets.extend(part.reserve(added))
            sources.extend((key_states[start:stop], value_states[start:stop]))
        torch._foreach_copy_(targets, sources)
        return key_states, value_states

    def get_seq_length(self) -> int:
        """0: parts hold different numbers of generated slots, and the prompt is not counted."""
        return 0


class GroupedCache(DynamicCache):
    """The caches of several path states as one ``DynamicCache`` for a joint forward.

    ``groups[i]`` names the prompt group of part ``i``: consecutive parts of one group share
    their side's prompt, so the attention reads that prompt in one call for all
    their rows (P rows against the full prompt, Q-along-Y and forced rows against the evicted
    one).
    """

    def __init__(self, caches: list[SharedPromptCache], groups: list[int]) -> None:
        super().__init__()
        if len(groups) != len(caches):
            raise ValueError("groups must name one group per cache")
        self.parts = caches
        self.groups = groups
        bounds = [0]
        for cache in caches:
            bounds.append(bounds[-1] + cache.rows)
        self.bounds = bounds
        self.layers.extend(GroupedLayer(list(layers), bounds)
                           for layers in zip(*(c.layers for c in caches), strict=True))

    @property
    def rows(self) -> int:
        return self.bounds[-1]
