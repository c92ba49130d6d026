"""Press field values whose ``repr`` holds a memory address (a function, a method, a
``functools.partial``, a module, an object of a plain class), as JSON that is the same in every
process that made the same value.

A press field holding a function put ``<function f at 0x7f...>`` into the press's identity
(:mod:`kvdrift.lm.actions.identity`), so the same command on a finished store was refused
forever (issue 52). Here a function is named by its qualified name and a digest of its code
(bytecode, constants, names; not its file or line), its defaults and its closure; a method by
its function and its object's class; an ``nn.Module`` by its class and a digest of its state;
another object by its class and its public attributes.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import threading
import types
from collections.abc import Callable
from typing import Any

import torch

_seen = threading.local()


def code_digest(code: types.CodeType) -> str:
    """SHA-256 of a code object's bytecode, names and constants (nested code objects by
    their own digest; sets sorted), independent of where the code lies in a file."""
    digest = hashlib.sha256()
    digest.update(code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_argcount,
                        code.co_kwonlyargcount, code.co_flags)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            digest.update(code_digest(const).encode())
        elif isinstance(const, frozenset):
            digest.update(repr(sorted(map(repr, const))).encode())
        else:
            digest.update(repr(const).encode())
    return digest.hexdigest()


def _name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', repr(obj))}"


def stable_value(value: Any, recurse: Callable[[Any], Any]) -> Any | None:
    """JSON for ``value`` if its ``repr`` would name a memory address (module docstring),
    else None (the caller's rules apply); ``recurse`` turns the values it holds into JSON. A
    value met again inside itself (a closure over its own function) is named by its class."""
    seen = getattr(_seen, "ids", None)
    if seen is None:
        seen = _seen.ids = set()
    if id(value) in seen:
        return {"cycle": _name(type(value))}
    seen.add(id(value))
    try:
        return _stable(value, recurse)
    finally:
        seen.discard(id(value))


def _stable(value: Any, recurse: Callable[[Any], Any]) -> Any | None:
    if isinstance(value, functools.partial):
        return {"partial": recurse(value.func), "args": [recurse(a) for a in value.args],
                "keywords": {k: recurse(v) for k, v in sorted(value.keywords.items())}}
    if inspect.ismethod(value):
        return {"method": recurse(value.__func__), "of": _name(type(value.__self__))}
    if isinstance(value, type):
        return {"type": _name(value)}
    if inspect.isfunction(value):
        closure = [cell.cell_contents for cell in value.__closure__ or ()
                   if cell.cell_contents is not value]
        return {"function": _name(value), "code": code_digest(value.__code__),
                "defaults": [recurse(d) for d in value.__defaults__ or ()],
                "closure": [recurse(c) for c in closure]}
    if isinstance(value, types.ModuleType):
        return {"module": value.__name__}
    if isinstance(value, torch.nn.Module):
        digest = hashlib.sha256()
        for key, tensor in sorted(value.state_dict().items()):
            digest.update(key.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return {"module": _name(type(value)), "state_sha256": digest.hexdigest()}
    if callable(value) and not hasattr(value, "__dict__"):  # a builtin or a C callable
        return {"callable": _name(value)}
    if " at 0x" in repr(value):  # a plain object: its class and public attributes
        attributes = getattr(value, "__dict__", {})
        return {"object": _name(type(value)),
                "fields": {k: recurse(v) for k, v in sorted(attributes.items())
                           if not k.startswith("_")}}
    return None
