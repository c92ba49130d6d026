"""Argument checks and random generators shared by the estimators."""

from __future__ import annotations

import dataclasses
from typing import Any

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


def make_generator(
    seed: int | torch.Generator, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A torch.Generator on ``device`` seeded with ``seed`` (a Generator passes through)."""
    if isinstance(seed, torch.Generator):
        return seed
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


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
