"""A store that keeps a run's records in memory and writes nothing anywhere.

What the Python API runs into when no output folder is given (``kvdrift.measure(...)``): the
runner sees the same two calls as on a :class:`~kvdrift.run.store.RunStore` (is a unit done,
store a unit), every unit is computed (nothing was stored before), and the records come back
as the store would read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from kvdrift.run.records import UnitKey


class MemoryStore:
    """The units of one run, in memory, in the order they were computed."""

    def __init__(self) -> None:
        self.units: dict[UnitKey, tuple[pa.Table, pa.Table]] = {}
        self.documents: dict[tuple[str, str], pa.Table] = {}  # (model, doc id): as the model saw it

    def unit_done(self, key: UnitKey, fingerprint: Mapping[str, Any]) -> bool:
        return key in self.units

    def write_unit(self, key: UnitKey, steps: pa.Table, replicates: pa.Table,
                   fingerprint: Mapping[str, Any] | None = None,
                   document: pa.Table | None = None) -> None:
        if document is not None:
            self.documents[(key.model, key.doc_id)] = document
        self.units[key] = (steps, replicates)

    def read(self, kind: str) -> pa.Table:
        """All units' records of one kind (``"steps"`` or ``"replicates"``)."""
        if not self.units:
            raise ValueError("the run has no finished units")
        index = {"steps": 0, "replicates": 1}[kind]
        return pa.concat_tables([tables[index] for tables in self.units.values()],
                                promote_options="default")
