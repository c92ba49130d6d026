"""A press object's identity: what a unit measured with it, so a store can refuse another.

A press's name (the action name a user gives it) does not say what it computes: the same name
can stand for another class, other field values, or an edited class. :func:`press_identity`
records the class (module and qualified name), its dataclass field values and a digest of the
source of every class it inherits from outside kvpress, and :func:`identity_changes` says in
a phrase what differs between two identities. :func:`check_press` refuses anything that is not
a kvpress press.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from typing import Any


def check_press(obj: Any, name: str) -> Any:
    """``obj`` if it is a kvpress press instance (any subclass of ``kvpress.BasePress``); else
    a one-line ValueError naming the action and what was given."""
    from kvpress import BasePress

    if isinstance(obj, type) and issubclass(obj, BasePress):
        raise ValueError(f"action {name!r}: {obj.__name__} is a press class, not a press; "
                         f"give an instance, e.g. {obj.__name__}(compression_ratio=0.5)")
    if not isinstance(obj, BasePress):
        raise ValueError(f"action {name!r}: a {type(obj).__name__} is not a kvpress press "
                         f"(allowed: an instance of kvpress.BasePress or a subclass of it, "
                         f"such as ScorerPress)")
    return obj


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _source_digest(cls: type) -> str | None:
    """SHA-256 of the source of ``cls`` and every class it inherits from outside kvpress and
    the standard library (kvpress's own classes are pinned by its version); None where a
    class's source cannot be read."""
    digest = hashlib.sha256()
    for klass in cls.__mro__:
        module = klass.__module__ or ""
        if module == "builtins" or module.split(".")[0] in ("kvpress", "abc", "typing"):
            continue
        try:
            digest.update(inspect.getsource(klass).encode("utf-8", "surrogatepass"))
        except (OSError, TypeError):
            return None
    return digest.hexdigest()


def _value(value: Any) -> Any:
    """A field value as JSON: presses by their identity, tensors by shape and digest, others
    as themselves where JSON holds them, else their ``repr``."""
    from kvpress import BasePress

    if isinstance(value, BasePress):
        return press_identity(value)
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _value(v) for k, v in value.items()}
    if hasattr(value, "detach") and hasattr(value, "shape"):  # a tensor
        data = value.detach().cpu().contiguous().numpy().tobytes()
        return {"tensor": list(value.shape), "sha256": hashlib.sha256(data).hexdigest()}
    try:
        json.dumps(value, allow_nan=True)
        return value
    except (TypeError, ValueError):
        return repr(value)


def press_identity(press: Any) -> dict[str, Any]:
    """The identity of a press object as JSON: ``class``, ``fields`` (its dataclass fields,
    in order) and ``source`` (:func:`_source_digest`)."""
    cls = type(press)
    fields = {}
    if dataclasses.is_dataclass(press):
        fields = {f.name: _value(getattr(press, f.name, None))
                  for f in dataclasses.fields(press)}
    return {"class": _class_name(cls), "fields": fields, "source": _source_digest(cls)}


def identity_changes(old: Any, new: Any) -> str:
    """What differs between two identities, as a phrase (``"field compression_ratio was 0.5,
    now 0.25"``); ``"nothing"`` where they are equal."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return "it was not a press before" if not isinstance(old, dict) else "it is no press now"
    if old.get("class") != new.get("class"):
        return f"its class was {old.get('class')}, now {new.get('class')}"
    was, now = old.get("fields") or {}, new.get("fields") or {}
    for key in list(was) + [k for k in now if k not in was]:
        if was.get(key) != now.get(key):
            return f"field {key} was {was.get(key)!r}, now {now.get(key)!r}"
    if old.get("source") != new.get("source"):
        return f"the source of {new.get('class')} has been edited"
    return "nothing"
