"""Q's prompt-cache size per action (``kv_bytes``, ``kv_fraction``) from the replicate records.

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

from kvdrift.records.schema import MEMORY_COLUMNS


def memory_means(replicates: pd.DataFrame, doc_ids: np.ndarray,
                 weights: np.ndarray) -> dict[str, float]:
    """``{kv_bytes, kv_fraction}`` of one (model, action): the weighted mean over ``doc_ids``.

    ``replicates`` are the action's replicate records; ``weights`` align with ``doc_ids``
    (one value per unit, repeated on its rows, so each document's first row is its value).
    NaN when the records lack a column.
    """
    out = {}
    for column in MEMORY_COLUMNS:
        if column not in replicates:
            out[column] = float("nan")
            continue
        per_doc = replicates.groupby("doc_id")[column].first().reindex(doc_ids)
        w = np.asarray(weights, dtype=np.float64)
        out[column] = float(w @ per_doc.to_numpy(dtype=np.float64) / w.sum())
    return out
