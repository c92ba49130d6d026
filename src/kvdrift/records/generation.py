"""Q's cache over a generation: how many entries a row holds at each position, when a
decoding-time press compressed it, and the bytes it stores averaged over the generation.

A decoding-time press (kvpress's ``DecodingPress``: ``decoding-<scorer>`` actions and press
objects that hold one) compresses a row after the generated step that brings it to ``L``
tokens with ``L % interval == 0``, keeping ``target`` entries per KV head when more are live
(``docs/engine.md``). The forward that writes token ``L`` computes position ``L + 1``'s
distribution before the compression, so position ``L + 2`` is the first that reads the
compressed cache. Position ``t`` reads the prompt entries kept and the ``t - 1`` generated
entries written so far, less those evicted.

These counts follow from the press's settings (``target``, ``interval``) and the prompt
entries each layer kept: they are derived here, not read back from the engine, and are the
same for every row of a unit (a row that emitted EOS keeps stepping). The records hold them
as ``compression_positions`` and ``kv_bytes_generation``/``kv_fraction_generation``
(:mod:`kvdrift.records.schema`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvdrift import checks


@dataclass(frozen=True)
class Schedule:
    """When a decoding-time press compresses a row: ``compressions`` holds, for each
    compression, the generated length ``L`` after which it happens and the entries per KV head
    it keeps (when more are live)."""

    compressions: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        for length, target in self.compressions:
            checks.integer(length, "compression step", 1)
            checks.integer(target, "target", 1)

    @staticmethod
    def every(target: int, interval: int, horizon: int) -> Schedule:
        """A press that keeps ``target`` entries after every ``interval`` generated tokens."""
        checks.integer(interval, "interval", 1)
        return Schedule(tuple((length, target)
                              for length in range(interval, horizon + 1, interval)))

    @staticmethod
    def of_rule(rule: Any, horizon: int) -> Schedule:
        """The schedule of a decoding rule (:class:`kvdrift.lm.engine.decoding.DecodingRule`):
        its own count of compressions at each length and its target there, so a press that
        compresses at every step while its target is at most 1, or to a ratio of the tokens
        seen, is followed exactly."""
        return Schedule(tuple((length, max(1, int(rule.target_at(length))))
                              for length in range(1, horizon + 1)
                              if rule.index(length) > rule.index(length - 1)))

    def target_after(self, length: int) -> int | None:
        """The target of the compression after generated length ``length`` (None: none)."""
        return dict(self.compressions).get(length)


def live_entries(kept: int, horizon: int,
                 schedule: Schedule | None) -> tuple[np.ndarray, np.ndarray]:
    """For one layer whose prompt kept ``kept`` entries per KV head: ``[H]`` entries per KV
    head that position ``t = 1..H`` reads (module docstring), and ``[H]`` bool, True where
    position ``t`` is the first to read the cache after a compression that evicted."""
    counts = np.empty(horizon, dtype=np.int64)
    fresh = np.zeros(horizon, dtype=bool)
    live = kept
    for t in range(1, horizon + 1):
        if t >= 2:
            live += 1  # token t - 1 written by this position's forward
        counts[t - 1] = live
        target = None if schedule is None or t < 2 else schedule.target_after(t - 1)
        if target is not None and live > target:
            live = target  # compressed after this forward (length L = t - 1)
            if t < horizon:
                fresh[t] = True  # position L + 2 = t + 1
    return counts, fresh


def compression_positions(kept: Sequence[int], horizon: int,
                          schedule: Schedule | None) -> tuple[int, ...]:
    """The positions ``t <= H`` first computed from a compressed cache: ``L + 2`` for each
    compression at length ``L`` that evicts in at least one layer (``kept``: per layer)."""
    if schedule is None:
        return ()
    fresh = np.zeros(horizon, dtype=bool)
    for k in set(kept):
        fresh |= live_entries(int(k), horizon, schedule)[1]
    return tuple(int(t) + 1 for t in np.flatnonzero(fresh))


@dataclass(frozen=True)
class GenerationMemory:
    """Q's cache averaged over positions 1..H: its bytes, their fraction of the full cache's
    bytes averaged the same way, and the positions each compression first shows in."""

    kv_bytes: float
    kv_fraction: float
    compressions: tuple[int, ...]


def generation_memory(kept: Sequence[int], entry_bytes: Sequence[float], prompt_bytes: float,
                      n_prompt: int, horizon: int,
                      schedule: Schedule | None) -> GenerationMemory:
    """Q's cache over the generation. Per layer ``l``: ``kept[l]`` prompt entries per KV head,
    ``entry_bytes[l]`` the bytes of one full-precision entry (keys and values of every KV
    head). Until a layer's first compression its prompt part counts as recorded
    (``prompt_bytes``, split over layers by kept entries: quantized or channel-pruned caches
    keep their size) plus full-precision generated entries; after it, its live entries at
    full precision. The full cache at position ``t`` holds ``n_prompt + t - 1`` entries."""
    checks.integer(horizon, "horizon", 1)
    if len(kept) != len(entry_bytes):
        raise ValueError(f"kept ({len(kept)}) and entry_bytes ({len(entry_bytes)}) must "
                         "name the same layers")
    entry = np.asarray(entry_bytes, dtype=np.float64)
    counts = np.asarray(kept, dtype=np.float64)
    weight = counts * entry
    prompt_share = prompt_bytes * weight / weight.sum() if weight.sum() > 0 else 0 * weight
    written = np.arange(horizon, dtype=np.float64)  # generated entries read at t = 1..H
    q = np.zeros(horizon)
    for layer, k in enumerate(kept):
        live, fresh = live_entries(int(k), horizon, schedule)
        compressed = np.cumsum(fresh) > 0
        before = prompt_share[layer] + written * entry[layer]
        q += np.where(compressed, live * entry[layer], before)
    full = (n_prompt + written) * entry.sum()
    q_mean, full_mean = float(q.mean()), float(full.mean())
    return GenerationMemory(q_mean, q_mean / full_mean if full_mean > 0 else float("nan"),
                            compression_positions(kept, horizon, schedule))
