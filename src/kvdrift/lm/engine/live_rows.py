"""Rows under a decoding-time press that hold only their live entries: O(target) memory.

A Q state started with ``rewind=False`` (:meth:`~kvdrift.lm.engine.pair.LMKernelPair.start`)
stores what kvpress's cache would hold for each row, nothing more. Before its first
compression a row reads the side's shared prompt (stored once) and its own generated entries;
a compression (:func:`compact_rows`) gathers the row's live entries in kvpress's cache order
(prompt entries first, then generated slots; after a compression, the slots as they lie),
hands them to the rule as :class:`~kvdrift.lm.engine.live_entries.LiveEntries` and writes what
the rule returns to the front of the row's generated buffers: the row stops reading the
prompt, and the slots it no longer holds are freed by compacting every row of the state to its
used slots. Because the buffers then lie in kvpress's cache order, the next compression reads
them as they are. Per layer the state keeps::

    own      [n, kv_heads, G] bool: the slots each KV head holds (ragged heads, padding)
    inputs   [n, window, hidden]: the attention inputs of the last ``window`` steps, a ring
             (step ``s`` at ``(s - 1) % window``): all a compression scores from

so a row holds at most ``target + interval`` generated slots (plus 1/8 spare), whatever the
horizon, and its attention reads only those. What it gives up is going back: entries evicted
by a compression are gone, so such a state can be truncated only to lengths after each row's
last compression (every entry written since is still held, so the numbers are exact there).
Estimators that branch from the past (SWRB) start their states with ``rewind=True``
(:mod:`~kvdrift.lm.engine.decoding`, every slot kept and masked).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from kvdrift.lm.engine.cache import HOLE_STEP, SEQ, SharedPromptCache, spare_slots
from kvdrift.lm.engine.decoding import DecodingRule, compress_live
from kvdrift.lm.engine.live_entries import LiveEntries
from kvdrift.lm.engine.shared_attention import UNREAD

KEPT_STEP = -1  # slot_step of an entry a row holds from before its last compression


@dataclass(frozen=True, eq=False)
class LiveRows:
    """Per row: which slots each KV head holds, the last attention inputs, and whether the row
    still reads the shared prompt (see the module docstring)."""

    reads_prompt: torch.Tensor  # [n] bool: rows not compressed yet
    prompt_read: bool  # host-side: whether any row may still read the prompt
    prompt_sizes: tuple[int, ...]  # per layer: entries of the side's shared prompt
    own: tuple[torch.Tensor, ...]  # per layer [n, kv_heads, G] bool
    inputs: tuple[torch.Tensor, ...]  # per layer [n, window, hidden], a ring
    last: torch.Tensor  # [n] long: the row's length at its last compression (0: none)

    @staticmethod
    def start(prompt_keys: tuple[torch.Tensor, ...], n: int, hidden: int, dtype: torch.dtype,
              window: int) -> LiveRows:
        """``n`` rows with no generated entry over the given per-layer prompt keys."""
        dev = prompt_keys[0].device
        return LiveRows(
            reads_prompt=torch.ones(n, dtype=torch.bool, device=dev), prompt_read=True,
            prompt_sizes=tuple(k.shape[SEQ] for k in prompt_keys),
            own=tuple(torch.zeros(n, k.shape[1], 0, dtype=torch.bool, device=dev)
                      for k in prompt_keys),
            inputs=tuple(torch.zeros(n, window, hidden, dtype=dtype, device=dev)
                         for _ in prompt_keys),
            last=torch.zeros(n, dtype=torch.long, device=dev))

    @property
    def rows(self) -> int:
        return self.reads_prompt.shape[0]

    def live(self, after: torch.Tensor) -> list[tuple[Any, torch.Tensor]]:
        """Per layer (prompt mask ``[n, kv, P]`` or :data:`UNREAD`, generated ``[n, kv, G + 1]``)
        for the attention; the extra slot is the one being written. ``after`` is not needed:
        every held entry is live (a truncated row's later slots are holes of the state)."""
        masks: list[tuple[Any, torch.Tensor]] = []
        for own, size in zip(self.own, self.prompt_sizes, strict=True):
            n, kv = own.shape[:2]
            prompt: Any = UNREAD
            if self.prompt_read:
                prompt = self.reads_prompt[:, None, None].expand(n, kv, size)
            masks.append((prompt, torch.cat([own, own.new_ones(n, kv, 1)], dim=2)))
        return masks

    def appended(self, lengths: torch.Tensor, inputs: list[torch.Tensor]) -> LiveRows:
        """After a step that wrote one slot per row and fed the tokens at index ``lengths``
        (``[n]``, before the step) with attention inputs ``inputs[layer]`` ``[n, hidden]``."""
        own = tuple(torch.cat([o, o.new_ones(o.shape[0], o.shape[1], 1)], dim=2)
                    for o in self.own)
        for ring, x in zip(self.inputs, inputs, strict=True):  # in place, like the cache
            ring[torch.arange(ring.shape[0], device=ring.device), lengths % ring.shape[1]] = \
                x.to(ring.dtype)
        return dataclasses.replace(self, own=own)

    def take(self, rows: torch.Tensor) -> LiveRows:
        """The given rows (``prompt_read`` stays the parent's: a safe over-approximation)."""
        return dataclasses.replace(
            self, reads_prompt=self.reads_prompt.index_select(0, rows),
            own=tuple(o.index_select(0, rows) for o in self.own),
            inputs=tuple(x.index_select(0, rows) for x in self.inputs),
            last=self.last.index_select(0, rows))

    @staticmethod
    def join(parts: list[LiveRows], width: int) -> LiveRows:
        """Rows of several, their slots padded to ``width`` (padding held by no head)."""
        def pad(o: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(o, (0, width - o.shape[2]), value=False)

        first = parts[0]
        return dataclasses.replace(
            first, reads_prompt=torch.cat([p.reads_prompt for p in parts]),
            prompt_read=any(p.prompt_read for p in parts),
            own=tuple(torch.cat([pad(p.own[i]) for p in parts]) for i in range(len(first.own))),
            inputs=tuple(torch.cat([p.inputs[i] for p in parts])
                         for i in range(len(first.inputs))),
            last=torch.cat([p.last for p in parts]))

    def truncated(self, new: torch.Tensor, lengths: torch.Tensor) -> LiveRows:
        """Rows shortened from ``lengths`` to ``new``: allowed to any length before a row's
        first compression and after its last one (what came before that is no longer held);
        the state's mask hides the later slots, nothing else changes."""
        back = (new < lengths) & (new <= self.last) & (self.last > 0)
        if bool(back.any()):
            i = int(torch.nonzero(back)[0])
            raise ValueError(
                f"row {i} cannot go back to length {int(new[i])}: it keeps only the entries "
                f"its decoding-time press keeps, and its last compression was at length "
                f"{int(self.last[i])}; start the state with rewind=True to branch from earlier")
        return self


def compact_rows(
    rule: DecodingRule,
    state: LiveRows,
    rows: torch.Tensor,  # [r] long: rows that reach a compression now
    lengths: torch.Tensor,  # [n] long: lengths after the step just taken
    mask: torch.Tensor,  # [n, G] long: the state's valid slots (the new one included)
    slot_step: torch.Tensor,  # [n, G] long: generated index held by each slot
    cache: SharedPromptCache,
    modules: list[Any],  # attention module of each layer, by layer index
    positions: dict[int, Any],  # layer -> (cos, sin) of the step just taken, [n, 1, dim]
) -> tuple[LiveRows, SharedPromptCache, torch.Tensor, torch.Tensor]:
    """Compress the given rows (the rule's step on their live entries) and compact every row
    to the slots it holds; returns the new ``(rows, cache, mask, slot_step)``. A row that
    still reads the prompt and whose step evicts nothing (fewer live entries than the target)
    is left as it is: it attends exactly as P's rows do, so ``delta_t`` stays exactly 0."""
    valid = mask.bool()
    window = state.inputs[0].shape[1]
    blocks: dict[int, list[LiveEntries]] = {}
    for i in rows.tolist():
        length = int(lengths[i])
        start = length - rule.window_at(length)
        ring = torch.arange(max(start, 0), length, device=mask.device) % window
        reads = bool(state.reads_prompt[i])
        lives = [_live_of_row(state, cache, layer_idx, i, valid[i], reads)
                 for layer_idx in range(len(modules))]
        kept = [compress_live(rule, module, live, rule.led(
                                  layer_idx, state.inputs[layer_idx][i].index_select(0, ring),
                                  start)[None],
                              tuple(t[i:i + 1] for t in positions[layer_idx]), length)
                for layer_idx, (module, live) in enumerate(zip(modules, lives, strict=True))]
        if reads and all(k is live for k, live in zip(kept, lives, strict=True)):
            continue  # nothing evicted: the row goes on reading the prompt, as P's rows do
        blocks[i] = kept
    return rebuilt_rows(state, blocks, lengths, mask, slot_step, cache)


def slot_order(valid: torch.Tensor, width: int) -> torch.Tensor:
    """``[n, min(G, width)]``: each row's valid slots first, in slot order (how
    :func:`rebuilt_rows` compacts a row it does not replace)."""
    g = min(valid.shape[1], width)
    return torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices[:, :g]


def rebuilt_rows(
    state: LiveRows,
    blocks: dict[int, list[LiveEntries]],  # row -> its new live entries, per layer
    lengths: torch.Tensor,  # [n] long: lengths after the step just taken
    mask: torch.Tensor,  # [n, G] long: the state's valid slots
    slot_step: torch.Tensor,  # [n, G] long
    cache: SharedPromptCache,
) -> tuple[LiveRows, SharedPromptCache, torch.Tensor, torch.Tensor]:
    """The rows of ``blocks`` holding their new live entries at the front of their buffers
    (they stop reading the prompt), every other row compacted to its valid slots
    (:func:`slot_order`); returns the new ``(rows, cache, mask, slot_step)``."""
    valid = mask.bool()
    n = valid.shape[0]
    used = valid.sum(1).tolist()
    widths = [max(b.width for b in blocks[i]) if i in blocks else used[i] for i in range(n)]
    new_width = max(widths)
    order = slot_order(valid, new_width)  # [n, g]
    g = order.shape[1]
    new_mask = torch.zeros(n, new_width, dtype=torch.long, device=mask.device)
    new_mask[:, :g] = mask.gather(1, order)
    new_steps = torch.full((n, new_width), HOLE_STEP, dtype=torch.long, device=mask.device)
    new_steps[:, :g] = torch.where(new_mask[:, :g] > 0, slot_step.gather(1, order), HOLE_STEP)
    for i in blocks:
        new_mask[i] = 0
        new_mask[i, :widths[i]] = 1
        new_steps[i] = HOLE_STEP
        new_steps[i, :widths[i]] = KEPT_STEP
    layers, owns = [], []
    for layer_idx, layer in enumerate(cache.layers):
        keys, values = layer.keys, layer.values
        kv = keys.shape[1]
        capacity = new_width + spare_slots(new_width)
        key_buf = keys.new_zeros(n, kv, capacity, keys.shape[3])  # zeros: padding is never NaN
        value_buf = values.new_zeros(n, kv, capacity, values.shape[3])
        own = torch.zeros(n, kv, new_width, dtype=torch.bool, device=mask.device)
        at = order[:, None, :, None]
        key_buf[:, :, :g] = keys.gather(SEQ, at.expand(n, kv, g, keys.shape[3]))
        value_buf[:, :, :g] = values.gather(SEQ, at.expand(n, kv, g, values.shape[3]))
        own[:, :, :g] = (state.own[layer_idx] & valid[:, None, :]).gather(
            SEQ, order[:, None, :].expand(n, kv, g))
        for i, block in blocks.items():
            entries = block[layer_idx]
            key_buf[i, :, :entries.width] = entries.keys
            value_buf[i, :, :entries.width] = entries.values
            own[i] = False
            own[i, :, :entries.width] = entries.head_valid()
        layers.append(layer.adopt(key_buf, value_buf, new_width))
        owns.append(own)
    compressed = torch.zeros(n, dtype=torch.bool, device=mask.device)
    compressed[list(blocks)] = True
    reads_prompt = state.reads_prompt & ~compressed
    new_state = dataclasses.replace(
        state, reads_prompt=reads_prompt, prompt_read=bool(reads_prompt.any()), own=tuple(owns),
        last=torch.where(compressed, lengths, state.last))
    return new_state, SharedPromptCache(layers), new_mask, new_steps


def held_entries(state: LiveRows, cache: SharedPromptCache, layer_idx: int, i: int,
                 valid: torch.Tensor, reads_prompt: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row ``i``'s entries of one layer in kvpress's cache order: ``keys``/``values``
    ``[kv, E, dim]`` and ``held`` ``[kv, E]`` over the prompt entries (if the row still reads
    the prompt) and then its slots, and ``order`` ``[kv, m]``: each head's held entries in that
    order, first (``m`` the most any head holds; a head holding fewer ends on unheld ones)."""
    layer = cache.layers[layer_idx]
    keys, values = layer.keys[i], layer.values[i]  # [kv, G, dim]
    held = state.own[layer_idx][i] & valid[None, :]  # [kv, G]
    if reads_prompt:
        prompt_held = (layer.prompt_live[0] if layer.prompt_live is not None else
                       torch.ones(layer.prompt_keys.shape[1:3], dtype=torch.bool,
                                  device=held.device))
        keys = torch.cat([layer.prompt_keys[0], keys], dim=1)
        values = torch.cat([layer.prompt_values[0], values], dim=1)
        held = torch.cat([prompt_held, held], dim=1)
    m = int(held.sum(-1).max())
    order = torch.sort((~held).to(torch.int8), dim=1, stable=True).indices[:, :m]  # [kv, m]
    return keys, values, held, order


def _live_of_row(state: LiveRows, cache: SharedPromptCache, layer_idx: int, i: int,
                 valid: torch.Tensor, reads_prompt: bool) -> LiveEntries:
    """Row ``i``'s live entries of one layer in kvpress's cache order: the prompt entries (if
    the row still reads the prompt) and then its held slots, each head's in slot order."""
    keys, values, held, order = held_entries(state, cache, layer_idx, i, valid, reads_prompt)
    live_keys = keys.gather(1, order[:, :, None].expand(-1, -1, keys.shape[-1]))
    live_values = values.gather(1, order[:, :, None].expand(-1, -1, values.shape[-1]))
    counts = held.sum(-1)
    ragged = bool((counts != order.shape[1]).any())
    return LiveEntries(live_keys, live_values, held.gather(1, order) if ragged else None)


__all__ = ["KEPT_STEP", "LiveRows", "compact_rows", "held_entries", "rebuilt_rows", "slot_order"]
