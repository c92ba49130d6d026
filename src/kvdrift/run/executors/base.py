"""What every executor shares: its settings (:class:`ExecutorConfig`, defined in
:mod:`kvdrift.run.executor_config`), the :class:`Executor`
protocol and the :data:`PairBuilder` each worker process calls once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from kvdrift.data.document import Document
from kvdrift.run.executor_config import EXECUTORS, ExecutorConfig, ray_endpoint
from kvdrift.run.records import UnitKey
from kvdrift.run.runner import PairFactory, RunConfig
from kvdrift.run.store import RunStore

__all__ = ["EXECUTORS", "Executor", "ExecutorConfig", "PairBuilder", "ray_endpoint"]

PairBuilder = Callable[[], PairFactory]  # called once per process that computes units


class Executor(Protocol):
    """Runs a model's pending units into a store; used as a context manager."""

    in_process: bool  # whether pairs are built in the driver (so it may share its loaded model)

    def run(self, config: RunConfig, documents: Sequence[Document], build: PairBuilder,
            store: RunStore, on_unit: Callable[[UnitKey, bool], None] | None = None) -> int: ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...
