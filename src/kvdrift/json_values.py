"""Values as strict JSON, both ways: what kvdrift reads and what it writes.

Reading: every JSON text kvdrift parses (a JSONL line, ``run.json``, a unit's fingerprint,
the frontier's state file) goes through :func:`parse_json`, which refuses in one line naming
where the text came from what Python's parser accepts silently (a key given twice: the last
would win; ``NaN``) or fails on with an exception that is no ``JSONDecodeError`` (nesting
deeper than Python's recursion limit, an integer of more than 4300 digits).

Writing: the analysis keeps NaN where a value is undefined and numpy numbers where it
computed them; ``analysis.json``, the ``--json`` outputs and the frontier's state file are
strict JSON, so each passes its values through :func:`to_json_safe` first.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np


class JSONError(ValueError):
    """A JSON text that kvdrift refuses; the message names where it came from."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise JSONError(f"key {key!r:.80} is given twice in one object; give it once")
        seen[key] = value
    return seen


def _no_constant(name: str) -> object:
    raise JSONError(f"{name} is not a JSON number")


def parse_json(text: str | bytes, where: str) -> object:
    """The value of the JSON ``text``, read from ``where`` (a file, ``file:line``).

    Refused, as :class:`JSONError` with ``where`` first: text that is not JSON, a key given
    twice in one object, ``NaN``/``Infinity``, nesting deeper than the parser's recursion limit
    and integers longer than Python converts (4300 digits).
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except JSONError as exc:
        raise JSONError(f"{where}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise JSONError(f"{where}: not valid JSON ({exc.msg}, line {exc.lineno} column "
                        f"{exc.colno})") from None
    except RecursionError:
        raise JSONError(f"{where}: JSON nested too deeply (arrays or objects within each "
                        "other beyond Python's recursion limit)") from None
    except ValueError:  # the one other ValueError json raises: an integer too long to convert
        raise JSONError(f"{where}: holds an integer of more than {sys.get_int_max_str_digits()} "
                        "digits, longer than Python reads") from None


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
