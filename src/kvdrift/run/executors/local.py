"""The local executor: every unit in the driver's process, one after another."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvdrift.data.document import Document
from kvdrift.run.executors.base import PairBuilder
from kvdrift.run.records import UnitKey
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore


class LocalExecutor:
    """Every unit in this process, one after another (document by document)."""

    in_process = True

    def run(self, config: RunConfig, documents: Sequence[Document], build: PairBuilder,
            store: RunStore, on_unit: Callable[[UnitKey, bool], None] | None = None) -> int:
        return run_units(config, documents, build(), store, on_unit=on_unit)

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
