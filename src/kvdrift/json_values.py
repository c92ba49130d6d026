"""Values as strict JSON: what ``json.dumps(..., allow_nan=False)`` accepts.

The analysis keeps NaN where a value is undefined and numpy numbers where it computed them;
``analysis.json``, the ``--json`` outputs and the frontier's state file are strict JSON, so
each passes its values through :func:`to_json_safe` first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np


def to_json_safe(obj):
    """A copy of ``obj`` that ``json.dumps(..., allow_nan=False)`` accepts.

    NaN and infinities become None; numpy scalars and arrays become Python numbers and lists;
    tuples become lists; paths become strings; dataclasses become dicts.
    """
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return to_json_safe(obj.tolist())
    if isinstance(obj, Mapping):
        return {str(k): to_json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_json_safe(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_json_safe(dataclasses.asdict(obj))
    raise TypeError(f"analysis holds a {type(obj).__name__} ({obj!r}), which JSON cannot store")
