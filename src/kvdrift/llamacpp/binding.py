"""Importing llama.cpp's Python binding, ``llama-cpp-python``, once and quietly.

The binding compiles llama.cpp when it installs (no wheel is served for most machines), so the
rest of kvdrift never needs it: only the llama.cpp engine imports it, and where it is missing
the engine's commands say in one line how to install it.
"""

from __future__ import annotations

import ctypes
import functools
from types import ModuleType
from typing import Any

LLAMA_CPP_PYTHON = "0.3.36"
"""The pinned ``llama-cpp-python`` (its llama.cpp is what kvdrift's llama.cpp figures measure)."""

INSTALL = (f"the llama.cpp engine needs llama-cpp-python=={LLAMA_CPP_PYTHON}: run "
           f"`bash scripts/setup.sh` (it builds llama.cpp once, about 4 minutes on two cores, "
           f"then pip reuses the build) or `pip install llama-cpp-python=={LLAMA_CPP_PYTHON}`")


ENGINE = "llama.cpp"


def engine_record() -> str:
    """What a store records of the engine: its name and the binding's version."""
    return f"{ENGINE} (llama-cpp-python {LLAMA_CPP_PYTHON})"


class LlamaCppMissing(ValueError):
    """llama-cpp-python is not installed (or not the pinned version): a user's set-up to fix,
    so one line saying how, like any other refused setting."""


def available() -> bool:
    """Whether the pinned llama-cpp-python can be imported."""
    try:
        llama()
    except LlamaCppMissing:
        return False
    return True


@functools.cache
def llama() -> ModuleType:
    """The ``llama_cpp`` module with its log silenced and the backend started (once).

    llama.cpp writes every load and context creation to stderr; kvdrift's commands show their
    own progress, so the engine's log is dropped (errors come back as return codes)."""
    try:
        import llama_cpp
    except ImportError as exc:  # also an OSError-like failure to load the shared library
        raise LlamaCppMissing(INSTALL) from exc
    version = getattr(llama_cpp, "__version__", "?")
    if version != LLAMA_CPP_PYTHON:
        raise LlamaCppMissing(f"llama-cpp-python {version} is installed; {INSTALL}")
    global _SILENT
    _SILENT = llama_cpp.llama_log_callback(_drop)  # held here: ctypes must not free it
    llama_cpp.llama_log_set(_SILENT, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    return llama_cpp


def _drop(level: int, text: bytes, user_data: Any) -> None:
    """A log callback that keeps nothing."""


_SILENT: Any = None
