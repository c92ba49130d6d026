"""The window terms at the observation depths, as the replicate table holds them.

Each replicate row holds three list columns (:data:`~.schema.DEPTH_TERMS`): the depths ``L``
(ascending), and at each, in the same order, the observed window term (mean -> R_L) and the
unobserved capacity (mean -> B_L). The depths are a column of every row rather than Parquet
schema metadata because rows outlive their file's metadata: a store's files are concatenated
(and their metadata merged or dropped) on read, pandas keeps no Arrow metadata, and a
selection of rows keeps its columns; each row stays self-describing, and a reader checks
that all rows agree. :func:`depth_arrays` writes the columns, :func:`depth_terms` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from kvdrift.records.schema import CAPACITY, DEPTHS, OBSERVED


@dataclass(frozen=True)
class DepthTerms:
    """Replicate rows' window terms: ``observed[r, i]`` and ``capacity[r, i]`` of row ``r``
    at depth ``depths[i]`` (``[rows, len(depths)]`` each)."""

    depths: tuple[int, ...]
    observed: np.ndarray
    capacity: np.ndarray


def _lists(values: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """One list per row of a ``[rows, k]`` matrix, as a list array of ``dtype``."""
    rows, k = values.shape
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * k, pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array(values.ravel(), dtype.value_type))


def depth_arrays(terms: DepthTerms) -> dict[str, pa.Array]:
    """The depth columns of ``terms``' rows, typed as :mod:`.schema` declares them."""
    rows = terms.observed.shape[0]
    depths = np.tile(np.asarray(terms.depths, dtype=np.int32), (rows, 1))
    return {DEPTHS.name: _lists(depths, DEPTHS.dtype),
            OBSERVED.name: _lists(terms.observed.astype(np.float64), OBSERVED.dtype),
            CAPACITY.name: _lists(terms.capacity.astype(np.float64), CAPACITY.dtype)}


def _matrix(column: pd.Series, width: int) -> np.ndarray:
    """A column of equal-length lists as a ``[rows, width]`` float64 matrix."""
    return np.array(column.tolist(), dtype=np.float64).reshape(len(column), width)


def depth_terms(replicates: pd.DataFrame) -> DepthTerms:
    """The window terms of replicate records (read back from a store, or built by
    ``run/records.py``); every row must record the same depths."""
    recorded = {tuple(int(L) for L in row) for row in replicates[DEPTHS.name]}
    if len(recorded) > 1:
        raise ValueError(f"the records mix observation depths {sorted(recorded)}; analyse runs "
                         "with one list of depths each")
    depths = next(iter(recorded), ())
    for name in (OBSERVED.name, CAPACITY.name):
        if any(len(row) != len(depths) for row in replicates[name]):
            raise ValueError(f"the records' {name} lists do not hold one value per depth "
                             f"{list(depths)}")
    return DepthTerms(depths, _matrix(replicates[OBSERVED.name], len(depths)),
                      _matrix(replicates[CAPACITY.name], len(depths)))
