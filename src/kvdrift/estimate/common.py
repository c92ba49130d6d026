"""Argument checks and random generators shared by the estimators."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from kvdrift import checks, limits


def check_horizon(horizon: int) -> int:
    """Return the horizon H if it is an integer >= 1, else raise a clear error."""
    return limits.horizon(horizon)


def check_replicates(replicates: int) -> int:
    """Return the replicate count K if it is an integer >= 1, else raise a clear error."""
    return limits.replicates(replicates)


def check_depths(depths: tuple[int, ...] | list[int], horizon: int) -> tuple[int, ...]:
    """Return observation depths L as a sorted tuple, each an integer within 1..H."""
    return checks.depths(depths, horizon)


#: Where torch's CPU generator state (``get_state``) holds the twister's fields, as bytes:
#: ``left`` (int32 at 8), ``next`` (uint64 at 16) and the 624 state words (one uint64 each,
#: low 32 bits used, from 24). The normal-sample caches after the words stay as a fresh
#: ``manual_seed`` leaves them (empty).
_LEFT, _NEXT, _WORDS, _MT_N = 8, 16, 24, 624

#: The smallest seed torch's CPU generator would fold onto a smaller one (it keeps 32 bits).
_WIDE_SEED = 2**32


def make_generator(
    seed: int | torch.Generator, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A torch.Generator on ``device`` seeded with ``seed`` (a Generator passes through).

    Every bit of the seed keys the stream. torch's CUDA generator (Philox) takes all 64 bits,
    but its CPU twister keeps the low 32 only, so hashed document and look seeds whose low
    bits agree would share a stream; on the CPU a seed of 2**32 or more therefore draws the
    stream of numpy's ``MT19937(seed)`` (its state from every bit of the seed through
    ``SeedSequence``), word for word. A smaller seed keeps torch's own stream."""
    if isinstance(seed, torch.Generator):
        return seed
    seed = int(seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    if gen.device.type == "cpu" and seed >= _WIDE_SEED:
        gen.set_state(_twister_state(gen.get_state(), seed))
    return gen


def _twister_state(fresh: torch.Tensor, seed: int) -> torch.Tensor:
    """``fresh`` (a just-seeded CPU generator's state) holding numpy's ``MT19937(seed)``
    twister: its 624 words and its position (numpy reads word ``pos`` next and twists at
    624; torch reads word ``next`` and twists when ``left`` counts down to 0)."""
    numpy_state = np.random.MT19937(seed).state["state"]
    position = int(numpy_state["pos"])
    state = fresh.clone()
    fields = state.numpy()
    fields[_LEFT:_LEFT + 4] = np.frombuffer(np.int32(_MT_N + 1 - position).tobytes(), np.uint8)
    fields[_NEXT:_NEXT + 8] = np.frombuffer(np.uint64(position).tobytes(), np.uint8)
    words = numpy_state["key"].astype(np.uint64).view(np.uint8)  # native, as torch writes
    fields[_WORDS:_WORDS + words.size] = words
    return state


def concat_results(results: list[Any]) -> Any:
    """Join estimator results of several replicate batches into one (rows in batch order).

    Tensor fields are concatenated along the replicate axis, integer counts are summed,
    and anything else (e.g. SWRB's depths) must agree across batches.
    """
    if not results:
        raise ValueError("nothing to concatenate")
    first = results[0]
    values = {}
    for f in dataclasses.fields(first):
        items = [getattr(r, f.name) for r in results]
        if isinstance(items[0], torch.Tensor):
            values[f.name] = torch.cat(items, dim=0)
        elif isinstance(items[0], int) and not isinstance(items[0], bool):
            values[f.name] = sum(items)
        elif all(item == items[0] for item in items):
            values[f.name] = items[0]
        else:
            raise ValueError(f"batches disagree on {f.name}: {items}")
    return type(first)(**values)


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """Where an estimator's result first holds a number that is not finite: which quantity,
    its value, and the replicate (0-based) and position ``t`` (1-based) it is at."""

    quantity: str
    value: float
    replicate: int
    position: int


def first_nonfinite(quantities: dict[str, torch.Tensor]) -> NonFinite | None:
    """The first non-finite entry (by replicate, then position) of ``[K, H]`` tensors that must
    be finite everywhere, named by the dict's keys; None if all are finite. A non-finite
    probability makes every TV computed from it NaN, so the TVs an estimator records are where
    it shows."""
    found = None
    for name, values in quantities.items():
        bad = torch.nonzero(~torch.isfinite(values))
        if bad.numel() == 0:
            continue
        k, t = (int(i) for i in bad[0])
        if found is None or (k, t + 1) < (found.replicate, found.position):
            found = NonFinite(name, float(values[k, t]), k, t + 1)
    return found
