"""Count dispatched operators and host synchronisations (deterministic, on any device).

A step that launches thousands of small kernels is bound by the host on an accelerator, and a
host synchronisation (reading a device value on the host: ``item``, ``bool(t)``, ``nonzero``,
``tolist``) stalls the queue. Both are measurable on a CPU as counts:

- **operators**: every non-view ATen operator that reaches the dispatcher (a
  ``TorchDispatchMode``; views such as ``reshape`` or ``slice`` launch no kernel);
- **host syncs**: the operators whose result the host must wait for
  (``_local_scalar_dense``, which every ``item``/``bool``/``int`` of a tensor goes through,
  ``nonzero``, ``is_nonzero``, ``masked_select``, ``unique``, ...) plus ``Tensor.tolist``
  (which reads the data without dispatching).

Use::

    with DispatchCounter() as counts:
        ...
    counts.ops, counts.syncs, counts.by_name.most_common(10)

``coupled_and_plain`` counts K coupled rollouts against one plain forward without a cache;
``RowCounter`` counts the model calls and rows of a kernel pair's joint steps.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ATen operators whose output size or value the host reads (a device -> host wait on a GPU)
SYNC_OPS = frozenset({
    "_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "unique",
    "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave", "equal",
    "_assert_async",
})


# non-view by schema but only a reshape of a fresh tensor (no kernel, no copy)
NO_KERNEL = frozenset({"_unsafe_view"})


class DispatchCounter(TorchDispatchMode):
    """Counts non-view operators and host synchronisations dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.syncs = 0
        self.by_name: Counter[str] = Counter()
        self.sync_names: Counter[str] = Counter()
        self._tolist: Any = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NO_KERNEL:
            self.ops += 1
            self.by_name[name] += 1
        if name in SYNC_OPS:
            self.syncs += 1
            self.sync_names[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> DispatchCounter:
        counter = self
        tolist = torch.Tensor.tolist
        self._tolist = tolist

        def counted_tolist(t: torch.Tensor) -> Any:
            counter.syncs += 1
            counter.sync_names["tolist"] += 1
            return tolist(t)

        torch.Tensor.tolist = counted_tolist
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


def coupled_and_plain(model: Any, pair: Any, k: int, h: int, plain_ids: torch.Tensor,
                      seed: int = 0) -> tuple[DispatchCounter, DispatchCounter]:
    """The counts of ``k`` coupled rollouts over ``h`` positions on ``pair``, and of one plain
    forward of ``plain_ids`` through ``model`` without a cache (the yardstick per position)."""
    from kvdrift.estimate import coupled_rollouts

    with DispatchCounter() as coupled:
        coupled_rollouts(pair, k, h, seed=seed)
    with DispatchCounter() as plain, torch.no_grad():
        model(input_ids=plain_ids, use_cache=False)
    return coupled, plain


class RowCounter:
    """Counts the model calls and rows of a kernel pair's joint steps (wraps ``advance_many``)."""

    def __init__(self, pair: Any) -> None:
        self.calls = self.rows = 0
        self._advance_many = pair.advance_many
        pair.advance_many = self

    def __call__(self, states: Any, tokens: Any, **kwargs: Any) -> Any:
        self.calls += 1
        self.rows += sum(s.n for s in states)
        return self._advance_many(states, tokens, **kwargs)
