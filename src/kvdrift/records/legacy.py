"""Records written by earlier kvdrift, read in the current layout.

Stores written before the depths were one typed column (:mod:`.depths`) hold one pair of
float64 replicate columns per depth ``L``, ``observed_L{L}`` and ``capacity_L{L}`` (none for
a rollout run without depths). This is the one place that reads those names: the store
passes every file it reads through :func:`current_layout`, so old stores analyse, report and
resume (a resumed store mixes both layouts, file by file) like new ones.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from kvdrift.records.depths import DepthTerms, depth_arrays
from kvdrift.records.schema import DEPTH_TERM_COLUMNS, DEPTHS, REPLICATES, names

_WIDE = re.compile(r"(observed|capacity)_L(\d+)")
_DECLARED = names(REPLICATES)
#: The replicate columns the schema declares after the depth columns.
_AFTER_DEPTHS = frozenset(_DECLARED[_DECLARED.index(DEPTH_TERM_COLUMNS[-1]) + 1:])


def _wide_depths(columns: list[str]) -> tuple[int, ...]:
    """The depths of the one-column-per-depth layout among ``columns``, ascending."""
    return tuple(sorted({int(m.group(2)) for n in columns if (m := _WIDE.fullmatch(n))}))


def current_layout(kind: str, table: pa.Table, columns: list[str] | None = None) -> pa.Table:
    """One stored file's ``kind`` records (``"steps"`` or ``"replicates"``) in the current
    layout: a replicate file read in full (``columns`` None) gets the depth columns, converted
    from the one-column-per-depth layout where it has that (empty lists where it has no
    depths); anything else is returned as read."""
    if kind != "replicates" or columns is not None or DEPTHS.name in table.column_names:
        return table
    depths = _wide_depths(table.column_names)
    wide = {prefix: np.array([table.column(f"{prefix}_L{L}").to_numpy() for L in depths],
                             dtype=np.float64).reshape(len(depths), table.num_rows).T
            for prefix in ("observed", "capacity")}
    kept = table.drop_columns([n for n in table.column_names if _WIDE.fullmatch(n)])
    # where the schema declares them: before the first later-declared column the file has
    at = next((i for i, n in enumerate(kept.column_names) if n in _AFTER_DEPTHS),
              kept.num_columns)
    for offset, (name, array) in enumerate(depth_arrays(DepthTerms(
            depths, wide["observed"], wide["capacity"])).items()):
        kept = kept.add_column(at + offset, name, array)
    return kept
