"""Q's prompt-cache size per action (``kv_bytes``, ``kv_fraction``) from the replicate records,
and Q's cache averaged over the generation (what a decoding-time press bounds).

A language-model unit records, on each of its replicate rows, the bytes Q's prompt cache holds
(quantized entries at their bits, scales and zero points included) and that size over the full
cache in the model's dtype (:func:`kvdrift.run.runner.with_memory`). Both depend on the
document: its prompt length, the entries an eviction keeps, the full-precision tail of a KIVI
cache. An action's value is the mean over its documents with the weights of every other point
estimate (:func:`kvdrift.analysis.bootstrap.stratum_weights`: strata weigh equally, documents
within a stratum too). Records without the columns (finite pairs, stores written before the
columns existed) give NaN.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvdrift.records.schema import GENERATION_COLUMNS, MEMORY_COLUMNS

#: The generation-averaged measure's columns (:mod:`kvdrift.records.generation`).
GENERATION_MEANS = GENERATION_COLUMNS[:2]


def memory_means(replicates: pd.DataFrame, doc_ids: np.ndarray,
                 weights: np.ndarray) -> dict[str, float]:
    """``{kv_bytes, kv_fraction}`` of one (model, action): the weighted mean over ``doc_ids``.

    ``replicates`` are the action's replicate records; ``weights`` align with ``doc_ids``
    (one value per unit, repeated on its rows, so each document's first row is its value).
    The same for Q's cache averaged over the generation (``kv_bytes_generation``,
    ``kv_fraction_generation``). NaN when the records lack a column.
    """
    out = {}
    for column in MEMORY_COLUMNS + GENERATION_MEANS:
        if column not in replicates:
            out[column] = float("nan")
            continue
        per_doc = replicates.groupby("doc_id")[column].first().reindex(doc_ids)
        w = np.asarray(weights, dtype=np.float64)
        out[column] = float(w @ per_doc.to_numpy(dtype=np.float64) / w.sum())
    return out


def compression_positions(replicates: pd.DataFrame) -> tuple[int, ...]:
    """The positions first computed from a compressed cache in any of the action's documents
    (``compression_positions``; empty where the records lack it or nothing compressed)."""
    if GENERATION_COLUMNS[2] not in replicates:
        return ()
    found: set[int] = set()
    for doc_positions in replicates.groupby("doc_id")[GENERATION_COLUMNS[2]].first():
        if doc_positions is not None and not (isinstance(doc_positions, float)):
            found.update(int(t) for t in doc_positions)
    return tuple(sorted(found))
