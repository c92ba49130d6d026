"""The Ray executor: units computed on Ray actors, records written by the driver alone.

Each actor builds its pair factory once (for a language model: loads the model) and takes
one document at a time; that document's units reach it as consecutive calls, each naming the
document's unfinished actions, so the factory computes one prefill for all of them.
Actors return record tables and only the driver writes the store: the store need not be on
a shared filesystem, the atomic per-unit write and resume work as for the local executor,
and no unit is written twice. A worker that dies is replaced and the document's unfinished
units go to the replacement, at most ``max_retries`` times per document; then the run stops
with :class:`~kvdrift.run.UnitFailed` naming the unit that was running.
"""

from __future__ import annotations

import math
import os
import socket
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from kvdrift.data.document import Document
from kvdrift.run import UnitFailed
from kvdrift.run.executors.base import ExecutorConfig, PairBuilder, ray_endpoint
from kvdrift.run.records import UnitKey
from kvdrift.run.runner import (
    RanOn,
    RunConfig,
    factory_identity,
    finished_units,
    prepare_document,
    ran_on,
    store_unit,
    unit_key,
    unit_records,
)
from kvdrift.run.store import RunStore

CONNECT_TIMEOUT_S = 5.0
POLL_S = 0.5  # longest wait for a result before checking for Ctrl-C again


class UnitWorker:
    """One Ray actor: builds its pair factory once, then computes units on request."""

    def __init__(self, build: PairBuilder):
        self._error: Exception | None = None
        self._prepared: str | None = None  # the document whose actions the factory was told
        try:
            self._make_pair = build()
        except Exception as exc:  # reported by ready(), so the driver sees the cause itself
            self._error = exc

    def ready(self) -> int:
        """The worker's process id once its factory is built; raises what building raised."""
        if self._error is not None:
            raise self._error
        return os.getpid()

    def run(self, config: RunConfig, doc: Document, action: str,
            pending: Sequence[str] = ()) -> tuple[pa.Table, pa.Table, RanOn]:
        """One unit's records and what it ran on; ``pending``: the document's unfinished
        actions when it was handed out."""
        if doc.id != self._prepared:
            prepare_document(self._make_pair, doc, pending)
            self._prepared = doc.id
        return (*unit_records(config, doc, action, self._make_pair),
                ran_on(self._make_pair, doc))


def built_identity(build: PairBuilder) -> dict[str, str]:
    """The model identity of the factory ``build`` makes (a Ray task: loads the model)."""
    return factory_identity(build())


@dataclass
class _Work:
    """A document's units not yet stored (in order: the first is the one running)."""

    doc: Document
    actions: list[str]
    deaths: int = 0


@dataclass
class _Slot:
    """A worker and the document it holds."""

    actor: Any
    work: _Work
    live: bool = False
    calls: dict = field(default_factory=dict)  # ObjectRef -> action (None: the ready() call)


def check_reachable(address: str) -> None:
    """Fail fast, in one line, when nothing listens at a ``HOST:PORT`` Ray address."""
    try:
        socket.create_connection(ray_endpoint(address), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"cannot reach a Ray cluster at {address} ({reason}); start one with "
                         "'ray start --head' and pass the address it prints") from None


class RayExecutor:
    """Units on Ray actors (see the module docstring); a context manager."""

    in_process = False

    def __init__(self, settings: ExecutorConfig,
                 on_workers: Callable[[int], None] | None = None):
        self.settings = settings
        self.on_workers = on_workers
        self._started = False  # whether this executor called ray.init (and so shuts it down)

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._started:
            import ray

            ray.shutdown()
            self._started = False

    @property
    def where(self) -> str:
        address = self.settings.ray_address
        return f"the Ray cluster at {address}" if address else "the local Ray instance"

    def _connect(self) -> None:
        import ray

        address = self.settings.ray_address
        if address is not None and address != "auto":
            check_reachable(address)
        if ray.is_initialized():
            return
        options: dict[str, Any] = dict(logging_level="ERROR", log_to_driver=False)
        if address is None:
            options["include_dashboard"] = False
        try:
            ray.init(address=address, **options)
        except (ConnectionError, TimeoutError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"cannot join {self.where}: {first}") from None
        self._started = True

    def _identity(self, config: RunConfig, documents: Sequence[Document], build: PairBuilder,
                  store: RunStore) -> dict[str, str]:
        """The model identity finished units are held against: where the store holds any,
        one worker loads the model to tell it (the driver has not loaded the weights)."""
        if not any(store.is_done(unit_key(config, doc, action)) for doc in documents
                   for action in config.actions):
            return {}
        import ray
        from ray.exceptions import RayTaskError

        self._connect()
        _, resources = self._worker_options()
        try:
            return ray.get(ray.remote(built_identity).options(**resources).remote(build))
        except RayTaskError as exc:  # loading failed: show its own error
            if isinstance(exc.cause, Exception):
                raise exc.cause from None
            raise

    def _worker_options(self) -> tuple[int, dict[str, float]]:
        """How many workers the cluster holds, and each one's resources."""
        import ray

        total = ray.cluster_resources()
        cpus, gpus = total.get("CPU", 0.0), total.get("GPU", 0.0)
        per_gpu = self.settings.gpus_per_worker
        if per_gpu is None:
            per_gpu = 1.0 if gpus >= 1 else 0.0
        per_cpu = self.settings.cpus_per_worker
        if per_gpu > 0 and gpus == 0:
            raise ValueError(f"gpus_per_worker = {per_gpu:g} asked for, but {self.where} has "
                             "no GPUs; set gpus_per_worker = 0 to run on CPUs")
        count = math.floor(cpus / per_cpu + 1e-9)
        if per_gpu > 0:
            count = min(count, math.floor(gpus / per_gpu + 1e-9))
        if count < 1:
            raise ValueError(f"one worker needs {per_cpu:g} CPUs and {per_gpu:g} GPUs but "
                             f"{self.where} has {cpus:g} CPUs and {gpus:g} GPUs; lower "
                             "cpus_per_worker or gpus_per_worker")
        return count, {"num_cpus": per_cpu, "num_gpus": per_gpu}

    def run(self, config: RunConfig, documents: Sequence[Document], build: PairBuilder,
            store: RunStore, on_unit: Callable[[UnitKey, bool], None] | None = None) -> int:
        """Run every unit not yet in ``store``; returns how many were run now."""
        if not documents:
            raise ValueError("no documents to run")
        queue: deque[_Work] = deque()
        done = finished_units(config, documents, store, self._identity(config, documents,
                                                                       build, store))
        for doc in documents:
            todo = []
            for action in config.actions:
                if unit_key(config, doc, action) in done:
                    if on_unit:
                        on_unit(unit_key(config, doc, action), True)
                else:
                    todo.append(action)
            if todo:
                queue.append(_Work(doc, todo))
        if not queue:
            return 0
        self._connect()
        count, resources = self._worker_options()
        return _Dispatch(self.settings, config, build, store, on_unit, self.on_workers,
                         resources).run(queue, min(count, len(queue)))


class _Dispatch:
    """One model's units over a pool of workers: hand out documents, store results."""

    def __init__(self, settings: ExecutorConfig, config: RunConfig, build: PairBuilder,
                 store: RunStore, on_unit: Callable[[UnitKey, bool], None] | None,
                 on_workers: Callable[[int], None] | None, resources: dict[str, float]):
        import ray

        self.settings, self.config, self.build, self.store = settings, config, build, store
        self.on_unit, self.on_workers = on_unit, on_workers
        self.worker_class = ray.remote(UnitWorker).options(max_restarts=0, **resources)
        self.slots: list[_Slot] = []
        self.ran = 0

    def _live_changed(self) -> None:
        if self.on_workers:
            self.on_workers(sum(s.live for s in self.slots))

    def _give(self, slot: _Slot, work: _Work) -> None:
        slot.work = work
        pending = tuple(work.actions)
        for action in pending:
            slot.calls[slot.actor.run.remote(self.config, work.doc, action, pending)] = action

    def _start(self, work: _Work) -> None:
        slot = _Slot(actor=self.worker_class.remote(self.build), work=work)
        slot.calls[slot.actor.ready.remote()] = None
        self.slots.append(slot)
        self._give(slot, work)

    def _retire(self, slot: _Slot) -> None:
        import ray

        ray.kill(slot.actor, no_restart=True)
        self.slots.remove(slot)
        self._live_changed()

    def _store(self, slot: _Slot, action: str,
               value: tuple[pa.Table, pa.Table, RanOn]) -> None:
        key = store_unit(self.store, self.config, slot.work.doc, action, value[:2], value[2])
        slot.work.actions.remove(action)
        self.ran += 1
        if self.on_unit:
            self.on_unit(key, False)

    def _receive(self, slot: _Slot, action: str | None, value: Any, queue: deque[_Work]) -> None:
        if action is None:
            slot.live = True
            self._live_changed()
        else:
            self._store(slot, action, value)
        if not slot.calls:  # its document is done
            if queue:
                self._give(slot, queue.popleft())
            else:
                self._retire(slot)

    def _lost(self, slot: _Slot, error: Exception, queue: deque[_Work]) -> None:
        """A worker died: keep what it finished, then give its document to a new worker."""
        import ray
        from ray.exceptions import RayActorError

        pending = list(slot.calls)
        if pending:  # the actor is dead, so every call resolves now, with a value or an error
            ray.wait(pending, num_returns=len(pending), timeout=30)
        for ref in pending:
            action = slot.calls.pop(ref)
            try:
                value = ray.get(ref, timeout=0)
            except (RayActorError, ray.exceptions.GetTimeoutError):
                continue
            if action is not None:
                self._store(slot, action, value)
        slot.live = False
        self.slots.remove(slot)
        self._live_changed()
        work = slot.work
        if not work.actions:
            if queue:
                self._start(queue.popleft())
            return
        work.deaths += 1
        if work.deaths > self.settings.max_retries:
            cause = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            raise UnitFailed(
                f"unit {self.config.model} · {work.doc.id} · {work.actions[0]} failed: its "
                f"worker died {work.deaths} times (max_retries = {self.settings.max_retries}); "
                f"last: {cause}")
        self._start(work)

    def run(self, queue: deque[_Work], workers: int) -> int:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            for _ in range(workers):
                self._start(queue.popleft())
            while self.slots:
                owner = {ref: slot for slot in self.slots for ref in slot.calls}
                done, _ = ray.wait(list(owner), num_returns=1, timeout=POLL_S)
                if not done:
                    continue
                slot = owner[done[0]]
                action = slot.calls.pop(done[0])
                try:
                    value = ray.get(done[0])
                except RayActorError as exc:
                    slot.calls[done[0]] = action  # resolved again with the rest in _lost
                    self._lost(slot, exc, queue)
                    continue
                except RayTaskError as exc:  # the unit itself failed: show its own error
                    cause = exc.cause if isinstance(exc.cause, Exception) else None
                    if cause is None:
                        raise
                    raise cause from None
                self._receive(slot, action, value, queue)
        finally:
            for slot in self.slots:
                ray.kill(slot.actor, no_restart=True)
            self.slots.clear()
        return self.ran
