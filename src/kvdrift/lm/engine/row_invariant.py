"""The first layer's keys and values computed row by row: a row's are the same bits in any
batch.

A BLAS rounds a row of a matrix product differently depending on how many rows the call holds
(with two threads, MKL computes rows past the last full block of four another way), so a row
stepped beside others gets keys one rounding away from the same row stepped alone. In the
first layer that matters: its keys and values are a function of the token and its position
alone, so equal tokens give scores (key norms, value norms) that tie exactly, and which tied
entry a decoding-time compression keeps then falls to that rounding. A rollout's forced rows
(stepped with P's and Y's rows) and a recomputation along the same tokens (a batch of their
own) then keep different entries, and their TVs part by far more than float noise
(docs/decoding-presses.md, sampled TVs). Computing the first layer's key and value
projections one row at a time (each a product of one row, as kvpress's own ``generate`` on
one row computes it) makes them independent of the batch: every batch, and ``generate``, holds
the same bits, so exact ties fall the same way everywhere. Later layers read attention over
rows' own histories, whose inputs already differ by float noise; exact ties do not arise
there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

# the projections of an attention module that make keys and values from its input (fused ones
# make queries too: computing those row by row changes nothing but their rounding)
KEY_VALUE_PROJECTIONS = ("k_proj", "v_proj", "qkv_proj", "W_pack", "query_key_value")


def _row_by_row(projection: torch.nn.Module, args: tuple, output: Any) -> Any:
    """A forward hook: the projection's output recomputed one row (batch entry) at a time."""
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[0] <= 1:
        return None  # one row: already a product of one row
    return torch.cat([projection.forward(x[i:i + 1]) for i in range(x.shape[0])])


@contextlib.contextmanager
def row_invariant_keys(attention: Any) -> Iterator[None]:
    """Within the block, ``attention``'s (the first layer's attention module) key and value
    projections compute each batch entry alone (see the module docstring)."""
    handles = [getattr(attention, name).register_forward_hook(_row_by_row)
               for name in KEY_VALUE_PROJECTIONS
               if isinstance(getattr(attention, name, None), torch.nn.Module)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


__all__ = ["KEY_VALUE_PROJECTIONS", "row_invariant_keys"]
