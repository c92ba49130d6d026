"""What a kvpress press object is, as JSON: its class, its field values and its source.

A press given as an action (a user's own class included) is part of a unit's identity: two
runs measured the same thing only if the same class, with the same field values and the same
code, made Q's cache. :func:`press_identity` says all three; :func:`identity_changes` says, in
a short phrase, what differs between two identities (for the one line that refuses to resume
a store made with another press).

The source digest covers the press's class and its bases up to, not including, kvpress's own
classes (a user's ``ScorerPress`` subclass: the user's code); a kvpress class itself is named
by the installed kvpress version instead. A class from a presses file is digested by the whole
file's bytes, the very bytes that ran (:mod:`kvdrift.press_source`), and its identity lists
every module of that file by the SHA-256 of its bytes (``modules``: the file and the modules
beside it that it imported). Nested presses (a wrapper's ``press``, a
composition's ``presses``) have an identity of their own inside their field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import inspect
import math
from typing import Any

import kvpress
import torch

from kvdrift.lm.actions.attention_use import nested_presses
from kvdrift.lm.actions.presses import NOT_OFFERED
from kvdrift.lm.actions.stable_values import stable_value
from kvdrift.press_source import MODULES_KEY, SOURCE_KEY, module_globals

KVPRESS_MODULE = "kvpress"


def _is_kvpress_class(cls: type) -> bool:
    return cls.__module__ == KVPRESS_MODULE or cls.__module__.startswith(KVPRESS_MODULE + ".")


def check_press(obj: Any, name: str) -> None:
    """One-line ValueError unless ``obj`` is a kvpress press instance (action ``name``) that
    kvdrift offers: a press of a class it does not offer (:data:`~kvdrift.lm.actions.presses.
    NOT_OFFERED`), or one inside it, is refused as the spec naming it is, before it runs."""
    if isinstance(obj, kvpress.BasePress):
        for inner in nested_presses(obj):
            for refused, why in NOT_OFFERED.items():
                cls = getattr(kvpress, refused, None)
                if cls is not None and isinstance(inner, cls):
                    raise ValueError(f"action {name!r}: kvpress's {refused} is not offered: "
                                     f"{why}")
        return
    allowed = ("allowed: an instance of a kvpress press class (a subclass of kvpress.BasePress, "
               "e.g. kvpress.SnapKVPress(compression_ratio=0.5) or your own ScorerPress)")
    if isinstance(obj, type) and issubclass(obj, kvpress.BasePress):
        raise ValueError(f"action {name!r}: {obj.__qualname__} is a press class, not a press "
                         f"object; call it, e.g. {obj.__qualname__}(...) ({allowed})")
    raise ValueError(f"action {name!r}: a {type(obj).__module__}.{type(obj).__qualname__} is "
                     f"not a kvpress press; {allowed}")


def class_name(cls: type) -> str:
    """``module.QualifiedName`` of a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def press_identity(press: Any) -> dict[str, Any]:
    """``{"class", "fields", "source"}`` of a press, JSON-serialisable (module docstring)."""
    cls = type(press)
    identity = {"class": class_name(cls), "fields": _fields(press), "source": source_digest(cls)}
    modules = local_modules(cls)
    if modules:
        identity["modules"] = modules
    return identity


def local_modules(cls: type) -> dict[str, str]:
    """Module name -> SHA-256 of its bytes, for every module of the presses files that
    defined ``cls`` and its own bases (empty for classes not from a presses file)."""
    found: dict[str, str] = {}
    for c in _own_classes(cls):
        found.update(module_globals(c).get(MODULES_KEY) or {})
    return dict(sorted(found.items()))


def _own_classes(cls: type) -> list[type]:
    return [c for c in cls.__mro__ if c is not object and not _is_kvpress_class(c)]


def source_digest(cls: type) -> str:
    """SHA-256 of the source of ``cls`` and its bases before kvpress's classes, or
    ``kvpress <version>`` for a class of kvpress itself."""
    own = _own_classes(cls)
    if not own:
        return f"kvpress {importlib.metadata.version('kvpress')}"
    digest = hashlib.sha256()
    for c in own:
        digest.update(class_name(c).encode())
        digest.update(_class_text(c).encode())
    return digest.hexdigest()


def _class_text(cls: type) -> str:
    """The SHA-256 of the presses file (or module beside it) whose bytes defined the class;
    else the class's source; where there is none (defined at a prompt), its methods'
    bytecode."""
    ran = module_globals(cls).get(SOURCE_KEY)
    if isinstance(ran, str):
        return f"file sha256 {ran}"
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        codes = [getattr(v, "__code__", None) for _, v in sorted(vars(cls).items())]
        return repr([(c.co_code.hex(), repr(c.co_consts)) for c in codes if c is not None])


def _fields(press: Any) -> dict[str, Any]:
    """Field values: a dataclass's init fields; a class not itself a dataclass adds its public
    instance attributes (a plain subclass that sets its own in ``__init__``)."""
    names = [f.name for f in dataclasses.fields(press) if f.init] \
        if dataclasses.is_dataclass(press) else []
    if "__dataclass_fields__" not in type(press).__dict__:
        names += [k for k in vars(press) if not k.startswith("_") and k not in names]
    return {name: _value(getattr(press, name, None)) for name in names}


def _value(value: Any) -> Any:
    """A field value as JSON: presses by their identity, containers item by item, tensors by
    their shape and digest, functions and plain objects by what they are
    (:mod:`~kvdrift.lm.actions.stable_values`), anything else that is not JSON by its repr."""
    if isinstance(value, kvpress.BasePress):
        return press_identity(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _value(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        return {"tensor": list(data.shape), "dtype": str(data.dtype),
                "sha256": hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()}
    stable = stable_value(value, _value)  # a function, an object: never a memory address
    return repr(value) if stable is None else stable


def identity_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """A short phrase of what differs from ``old`` to ``new`` (``"nothing"`` if equal)."""
    changes = _changes(old, new, "")
    return "; ".join(changes) if changes else "nothing"


def _changes(old: Any, new: Any, where: str) -> list[str]:
    if _is_identity(old) and _is_identity(new):
        if old["class"] != new["class"]:
            return [f"class{_at(where)} {old['class']} -> {new['class']}"]
        modules = _module_changes(old.get("modules", {}), new.get("modules", {}))
        out = [f"source of {new['class']} changed" + (f" (modules: {modules})" if modules else "")
               ] if old["source"] != new["source"] or modules else []
        fields_old, fields_new = old.get("fields", {}), new.get("fields", {})
        for key in sorted(set(fields_old) | set(fields_new)):
            path = f"{where}.{key}" if where else key
            if key not in fields_old or key not in fields_new:
                state = "added" if key not in fields_old else "removed"
                out.append(f"field {path} {state}")
            else:
                out += _changes(fields_old[key], fields_new[key], path)
        return out
    if (isinstance(old, list) and isinstance(new, list) and len(old) == len(new)):
        return [c for i, (a, b) in enumerate(zip(old, new, strict=True))
                for c in _changes(a, b, f"{where}[{i}]")]
    return [] if old == new else [f"field {where} {_short(old)} -> {_short(new)}"]


def _module_changes(old: dict, new: dict) -> str:
    def state(name: str) -> str:
        return "added" if name not in old else "removed" if name not in new else "changed"

    return ", ".join(f"{name} {state(name)}" for name in sorted(set(old) | set(new))
                     if old.get(name) != new.get(name))


def _is_identity(value: Any) -> bool:
    return isinstance(value, dict) and {"class", "fields", "source"} <= set(value)


def _at(where: str) -> str:
    return f" of {where}" if where else ""


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, (int, float)) or isinstance(value, bool) \
        else f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["check_press", "class_name", "identity_changes", "local_modules", "press_identity",
           "source_digest"]
