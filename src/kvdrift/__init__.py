"""kvdrift: measure how KV-cache compression changes what a language model generates.

The Python API (:mod:`kvdrift.api`) is importable from here; its names load their modules
on first use, so ``import kvdrift`` stays fast::

    import kvdrift
    analysis = kvdrift.analyze("runs/demo")
    analysis.to_frame()  # one row per model x action, quantities with _lo/_hi columns
"""

from __future__ import annotations

import os

# OpenMP threads that busy-wait between the many small matmuls of decoding stall each other
# on small CPU machines; passive waiting is several times faster there and free on GPUs. Set
# here, before anything imports torch, so the command line and the Python API both get it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _fix_mmap_threshold(nbytes: int = 8 << 20) -> None:
    """Serve allocations of ``nbytes`` or more with their own mappings (glibc only).

    glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB), so
    the estimators' short-lived ``[rows, V]`` float64 buffers (25 MB at K = 64) come from the
    heap, which fragments and keeps growing: the peak resident memory of one K = 64 run
    varied from 1.8 to 3.5 GiB from run to run. A fixed threshold returns such buffers to the
    system when freed (1.75 GiB, steadily; docs/engine.md). Skipped where
    ``MALLOC_MMAP_THRESHOLD_`` is set (glibc reads it) or the C library has no ``mallopt``.
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


_fix_mmap_threshold()

__version__ = "0.1.0"

_API = ("Model", "analyze", "embedded_model_path", "finite_state", "frontier", "load_records",
        "load_study", "measure", "plan", "predict", "run_study", "shipped_config",
        "study_from_arguments", "trajectories")
__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    if name in _API:
        from kvdrift import api

        return getattr(api, name)
    raise AttributeError(f"module 'kvdrift' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
