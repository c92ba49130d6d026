"""A run's on-disk store: metadata plus one Parquet file per finished unit.

Layout of a run directory::

    run.json                 configuration + package versions (written once)
    steps/<unit>.parquet     per-step records of one (model, document, action) unit
    replicates/<unit>.parquet  per-replicate records of that unit (written last)

A unit counts as done only when its replicate file exists; both files are written
to a temporary name and renamed, so an interrupted run never leaves a half-written
unit, and a rerun with the same configuration skips exactly the finished units.

Both files carry the unit's fingerprint (:mod:`kvdrift.run.fingerprint`): a rerun checks every
finished unit against its own settings before any unit runs (:meth:`RunStore.unit_done`),
refuses a unit made under other settings (or recomputes it, with ``recompute``), and
recomputes a damaged unit (rows missing, a file unreadable), naming it. One process writes a
store at a time (:mod:`kvdrift.run.lock`); ``run.json`` is created atomically, so two
processes that open a fresh store at once agree on one configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvdrift.run import fingerprint as fp
from kvdrift.run.records import UnitKey

RUN_FILE = "run.json"
KINDS = ("steps", "replicates")
VERSIONED = ("kvdrift", "torch", "transformers", "kvpress", "numpy", "pyarrow")


def package_versions() -> dict[str, str]:
    """Versions of Python and the packages that shape a run's numbers."""
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def unit_name(key: UnitKey) -> str:
    """A file-system-safe, collision-free file stem for a unit."""
    digest = hashlib.sha1(f"{key.model}\0{key.doc_id}\0{key.action}".encode()).hexdigest()[:12]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{key.action}__{key.doc_id}")[:60]
    return f"{readable}-{digest}"


def _temporary(path: Path) -> Path:
    """A new, unique temporary file beside ``path`` (renamed over it once written)."""
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(handle)
    return Path(name)


def _write_atomically(table: pa.Table, path: Path) -> None:
    tmp = _temporary(path)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _with_fingerprint(table: pa.Table, fingerprint: Mapping[str, Any] | None) -> pa.Table:
    if fingerprint is None:
        return table
    meta = dict(table.schema.metadata or {}) | {fp.METADATA_KEY: fp.encode(fingerprint)}
    return table.replace_schema_metadata(meta)


def read_run_file(path: Path) -> dict[str, Any]:
    """A ``run.json``, checked: a JSON object with a ``config`` object (else one line)."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = f"not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc.reason})"
    else:
        if isinstance(meta, dict) and isinstance(meta.get("config"), dict):
            return meta
        reason = "not a JSON object with a 'config' object"
    raise ValueError(f"{path} is damaged: {reason}; delete it (finished units keep their own "
                     "settings and are checked on resume) or use another output directory")


def _refuse_other_config(root: Path, saved: dict, config: dict) -> None:
    if saved != config:
        diff = sorted(k for k in set(saved) | set(config) if saved.get(k) != config.get(k))
        raise ValueError(
            f"{root} holds a run with a different configuration (differs in: "
            f"{', '.join(diff)}); rerun with the same arguments to resume, or use "
            "another output directory")


def _notice_on_stderr(message: str) -> None:
    print(message, file=sys.stderr)


class RunStore:
    """The directory of one run (or study); see the module docstring for the layout."""

    def __init__(self, root: str | Path, recompute: bool = False,
                 notice: Callable[[str], None] | None = None):
        self.root = Path(root)
        self.recompute = recompute  # recompute units stored under other settings
        self.notice = notice or _notice_on_stderr  # hears which damaged units are recomputed

    @classmethod
    def open(cls, root: str | Path, config: dict[str, Any], recompute: bool = False,
             notice: Callable[[str], None] | None = None,
             presses: dict[str, Any] | None = None) -> RunStore:
        """Create the store, or reopen it if it holds a run with the same configuration.

        ``presses`` (each action's kvpress press, for readers) is written beside the
        configuration and not compared on reopening.

        Creating ``run.json`` is atomic (a unique temporary file, linked to the name only if
        no other process created it first); a process that loses that race compares its
        configuration with the winner's like any reopening run.
        """
        store = cls(root, recompute, notice)
        path = store.root / RUN_FILE
        if not path.exists():
            store.root.mkdir(parents=True, exist_ok=True)
            meta = {"config": config, "versions": package_versions()}
            if presses:
                meta["presses"] = presses
            tmp = _temporary(path)
            try:
                tmp.write_text(json.dumps(meta, indent=2))
                os.link(tmp, path)  # fails if run.json appeared meanwhile: never overwritten
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        _refuse_other_config(store.root, read_run_file(path)["config"], config)
        for kind in KINDS:
            (store.root / kind).mkdir(exist_ok=True)
        return store

    @property
    def metadata(self) -> dict[str, Any]:
        path = self.root / RUN_FILE
        if not path.exists():
            raise FileNotFoundError(f"{self.root} is not a kvdrift run directory (no {RUN_FILE})")
        return read_run_file(path)

    def _path(self, key: UnitKey, kind: str) -> Path:
        return self.root / kind / f"{unit_name(key)}.parquet"

    def is_done(self, key: UnitKey) -> bool:
        """Whether the unit's replicate file (its done marker) exists; see :meth:`unit_done`."""
        return self._path(key, "replicates").exists()

    def _damage(self, key: UnitKey, stored: dict[str, Any] | None) -> str | None:
        """What is wrong with a finished unit's files (rows missing, unreadable), or None."""
        rows = {}
        for kind in KINDS:
            path = self._path(key, kind)
            if not path.exists():
                return f"its {kind} file is missing"
            try:
                rows[kind] = pq.read_metadata(path).num_rows
            except (OSError, pa.ArrowException) as exc:
                return f"{path.name} is unreadable ({str(exc).strip().splitlines()[0]})"
        if stored is not None:
            K, H = stored.get("replicates"), stored.get("horizon")
            if isinstance(K, int) and isinstance(H, int):
                if rows["replicates"] != K:
                    return f"replicate records are incomplete ({rows['replicates']} of {K} rows)"
                if rows["steps"] != K * H:
                    return f"step records are incomplete ({rows['steps']} of {K * H} rows)"
        return None

    def _stored_fingerprint(self, key: UnitKey) -> dict[str, Any] | None:
        try:
            return fp.decode(pq.read_schema(self._path(key, "replicates")).metadata)
        except (OSError, pa.ArrowException):
            return None

    def _forget(self, key: UnitKey) -> None:
        for kind in reversed(KINDS):  # the done marker first
            self._path(key, kind).unlink(missing_ok=True)

    def unit_done(self, key: UnitKey, fingerprint: Mapping[str, Any]) -> bool:
        """Whether ``key`` is finished under the settings ``fingerprint``.

        A damaged unit is named (``notice``), removed and reported not done, so it is
        recomputed. A unit stored under other settings raises ``ValueError`` naming the
        setting, or with ``recompute`` is removed and reported not done.
        """
        if not self.is_done(key):
            return False
        name = f"{key.model} · {key.doc_id} · {key.action}"
        stored = self._stored_fingerprint(key)
        damage = self._damage(key, stored)
        if damage is not None:
            self.notice(f"unit {name} in {self.root} is damaged ({damage}); recomputing it")
            self._forget(key)
            return False
        difference = fp.first_difference(stored, fingerprint)
        if difference is None:
            return True
        if self.recompute:
            self.notice(f"unit {name}: {difference}; recomputing it (--recompute)")
            self._forget(key)
            return False
        raise ValueError(f"unit {name} in {self.root} is not mixed in: {difference}; rerun with "
                         "the same settings, pass --recompute to recompute such units, or use "
                         "another output directory")

    def write_unit(self, key: UnitKey, steps: pa.Table, replicates: pa.Table,
                   fingerprint: Mapping[str, Any] | None = None) -> None:
        """Store one finished unit: steps first, the replicate file (the done marker) last;
        both carry ``fingerprint``, the settings that made them."""
        _write_atomically(_with_fingerprint(steps, fingerprint), self._path(key, "steps"))
        _write_atomically(_with_fingerprint(replicates, fingerprint),
                          self._path(key, "replicates"))

    def read(self, kind: str, columns: list[str] | None = None) -> pa.Table:
        """All finished units' records of one kind (``"steps"`` or ``"replicates"``)."""
        if kind not in KINDS:
            raise ValueError(f"unknown record kind {kind!r}; allowed: {', '.join(KINDS)}")
        done = {p.name for p in (self.root / "replicates").glob("*.parquet")}
        files = sorted(p for p in (self.root / kind).glob("*.parquet") if p.name in done)
        if not files:
            raise ValueError(f"{self.root} has no finished units yet")
        tables = []
        for f in files:
            try:
                tables.append(pq.read_table(f, columns=columns))
            except (OSError, pa.ArrowException) as exc:
                raise ValueError(f"{f} is unreadable ({str(exc).strip().splitlines()[0]}); "
                                 "rerun the run or study command to recompute its unit") from None
        return pa.concat_tables(tables, promote_options="default")
