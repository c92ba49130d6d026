"""A run's on-disk store: metadata plus one Parquet file per finished unit.

Layout of a run directory::

    run.json                 configuration + package versions (written once)
    steps/<unit>.parquet     per-step records of one (model, document, action) unit
    replicates/<unit>.parquet  per-replicate records of that unit (written last)

A unit counts as done only when its replicate file exists; both files are written
to a temporary name and renamed, so an interrupted run never leaves a half-written
unit, and a rerun with the same configuration skips exactly the finished units.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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


def _write_atomically(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


class RunStore:
    """The directory of one run (or study); see the module docstring for the layout."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @classmethod
    def open(cls, root: str | Path, config: dict[str, Any]) -> RunStore:
        """Create the store, or reopen it if it holds a run with the same configuration."""
        store = cls(root)
        path = store.root / RUN_FILE
        if path.exists():
            saved = json.loads(path.read_text())["config"]
            if saved != config:
                diff = sorted(k for k in set(saved) | set(config) if saved.get(k) != config.get(k))
                raise ValueError(
                    f"{store.root} holds a run with a different configuration (differs in: "
                    f"{', '.join(diff)}); rerun with the same arguments to resume, or use "
                    "another output directory")
        else:
            store.root.mkdir(parents=True, exist_ok=True)
            meta = {"config": config, "versions": package_versions()}
            tmp = path.with_name(f".{RUN_FILE}.tmp")
            tmp.write_text(json.dumps(meta, indent=2))
            os.replace(tmp, path)
        for kind in KINDS:
            (store.root / kind).mkdir(exist_ok=True)
        return store

    @property
    def metadata(self) -> dict[str, Any]:
        path = self.root / RUN_FILE
        if not path.exists():
            raise FileNotFoundError(f"{self.root} is not a kvdrift run directory (no {RUN_FILE})")
        return json.loads(path.read_text())

    def _path(self, key: UnitKey, kind: str) -> Path:
        return self.root / kind / f"{unit_name(key)}.parquet"

    def is_done(self, key: UnitKey) -> bool:
        return self._path(key, "replicates").exists()

    def write_unit(self, key: UnitKey, steps: pa.Table, replicates: pa.Table) -> None:
        """Store one finished unit: steps first, the replicate file (the done marker) last."""
        _write_atomically(steps, self._path(key, "steps"))
        _write_atomically(replicates, self._path(key, "replicates"))

    def read(self, kind: str, columns: list[str] | None = None) -> pa.Table:
        """All finished units' records of one kind (``"steps"`` or ``"replicates"``)."""
        if kind not in KINDS:
            raise ValueError(f"unknown record kind {kind!r}; allowed: {', '.join(KINDS)}")
        done = {p.name for p in (self.root / "replicates").glob("*.parquet")}
        files = sorted(p for p in (self.root / kind).glob("*.parquet") if p.name in done)
        if not files:
            raise ValueError(f"{self.root} has no finished units yet")
        tables = [pq.read_table(f, columns=columns) for f in files]
        return pa.concat_tables(tables, promote_options="default")
