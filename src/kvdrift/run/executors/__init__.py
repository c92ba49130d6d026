"""Executors: where a run's units are computed. The driver stays the only writer of the store.

``local`` computes every unit in this process, one after another
(:mod:`kvdrift.run.executors.local`). ``ray`` computes them on Ray actors that each build their
pair factory (load the model) once and return records to the driver
(:mod:`kvdrift.run.executors.ray`, imported only when asked for, so Ray stays optional). Both
take their settings and protocol from :mod:`kvdrift.run.executors.base`. Unit seeds depend only
on the run seed and the document id, so both write the same records, and a run started with one
executor resumes with the other.
"""

from __future__ import annotations

from collections.abc import Callable

from kvdrift.run.executors.base import EXECUTORS, Executor, ExecutorConfig, PairBuilder
from kvdrift.run.executors.local import LocalExecutor

__all__ = ["EXECUTORS", "Executor", "ExecutorConfig", "LocalExecutor", "PairBuilder",
           "open_executor"]


def open_executor(settings: ExecutorConfig,
                  on_workers: Callable[[int], None] | None = None) -> Executor:
    """The executor that ``settings`` names; ``on_workers(n)`` hears the live worker count."""
    if settings.kind == "local":
        return LocalExecutor()
    from kvdrift.run.executors.ray import RayExecutor

    return RayExecutor(settings, on_workers=on_workers)
