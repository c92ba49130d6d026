"""A run's on-disk store: metadata plus one Parquet file per finished unit.

Layout of a run directory::

    run.json                 configuration + package versions (written once)
    documents/<doc>.parquet  what a (model, document)'s units ran on (:mod:`.documents`)
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
processes that open a fresh store at once agree on one configuration. The store's folder and
its ``steps/`` and ``replicates/`` are held open (:class:`kvdrift.output.OutputDir`): every
file is written, read and deleted through them, never through a link or a path resolved again,
and only regular files are read.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import platform
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvdrift import checks
from kvdrift.json_values import parse_json
from kvdrift.output import OutputDir, readable_stem
from kvdrift.records.finite import COMPLETE_BRANCHES, counts_text, nonfinite_counts
from kvdrift.records.legacy import current_layout
from kvdrift.run import documents as docs
from kvdrift.run import fingerprint as fp
from kvdrift.run.records import UnitKey
from kvdrift.run.run_file import (  # noqa: F401 (re-exported)
    DOCUMENTS_HASH,
    LABEL_KEYS,
    RUN_FILE,
    NotARunStore,
    config_identity,
    not_a_store,
    other_configuration,
    read_run_file,
)

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
    readable = readable_stem(f"{key.action}__{key.doc_id}")
    return f"{readable}-{digest}"


def _write_atomically(table: pa.Table, folder: OutputDir, name: str) -> None:
    """Write ``table`` to ``name`` in the held ``folder`` (a temporary name, renamed; never
    through a link; a full disk names the file)."""
    with folder.open_file(name) as handle:
        pq.write_table(table, handle)


#: Key-value metadata naming the unit a Parquet file holds (model, document id, action).
UNIT_KEY = b"kvdrift.unit"
_KEY_COLUMNS = ["model", "doc_id", "action"]
_UNIT_FILE = re.compile(r".*-[0-9a-f]{12}\.parquet")  # the names unit_name gives


def _with_fingerprint(table: pa.Table, fingerprint: Mapping[str, Any] | None,
                      key: UnitKey) -> pa.Table:
    meta = dict(table.schema.metadata or {}) | {
        UNIT_KEY: json.dumps([key.model, key.doc_id, key.action]).encode()}
    if fingerprint is not None:
        meta[fp.METADATA_KEY] = fp.encode(fingerprint)
    return table.replace_schema_metadata(meta)


def _unit_in(path: Path, footer: pq.FileMetaData, handle: Any = None
             ) -> tuple[str, str, str] | None:
    """The (model, document id, action) a unit's file holds: from its metadata, or (files
    written before it was recorded) its first row; None if it names none."""
    raw = (footer.metadata or {}).get(UNIT_KEY)
    if raw is not None:
        try:
            value = parse_json(raw, str(path))
        except ValueError:
            return None
        ok = isinstance(value, list) and len(value) == 3 and all(isinstance(v, str)
                                                                  for v in value)
        return tuple(value) if ok else None
    if footer.num_rows == 0 or not set(_KEY_COLUMNS) <= set(footer.schema.names):
        return None
    first = next(pq.ParquetFile(handle if handle is not None else path).iter_batches(
        batch_size=1, columns=_KEY_COLUMNS))
    return tuple(str(first.column(c)[0].as_py()) for c in _KEY_COLUMNS)


def _names(value: Any) -> set[str] | None:
    return {str(v) for v in value} if isinstance(value, list) else None


def _file_name(unit: tuple[str, str, str]) -> str:
    return f"{unit_name(UnitKey(*unit))}.parquet"


@dataclass(frozen=True)
class UnitFiles:
    """A finished unit's files as read back: each kind's row count and the replicate file's
    key-value metadata (where its fingerprint is), or why a file is missing, unreadable or
    not this unit's (another unit's records, or records made under other settings than the
    replicate file's)."""

    rows: dict[str, int] = field(default_factory=dict)
    metadata: Mapping[bytes, bytes] | None = None
    damage: str | None = None


def _no_units(root: Path) -> str:
    """Why ``root`` has no records to read: what it is, as the user named it."""
    return not_a_store(root) or f"{root} has no finished units yet"


class NonFiniteRecords(ValueError):
    """A store holding NaN, infinite or null values where numbers belong (an earlier kvdrift
    stored them): named by unit and column, refused until ``--recompute`` recomputes them."""


def _nonfinite_in(kind: str, table: pa.Table, reopen: Callable[[], Any] | None
                  ) -> dict[str, int]:
    """:func:`~kvdrift.records.finite.nonfinite_counts` of a file's ``table``, reading its
    estimator column from the file ``reopen()`` opens where ``table`` was read without it."""
    estimator = None
    if reopen is not None and "estimator" not in table.column_names and any(
            c in table.column_names for c in COMPLETE_BRANCHES[kind]):
        with reopen() as handle:
            estimator = pq.read_table(handle, columns=["estimator"]).column("estimator")
    return nonfinite_counts(kind, table, estimator)


def _refuse_other_config(root: Path, saved: dict, config: dict) -> None:
    by_content = DOCUMENTS_HASH in saved
    saved, config = config_identity(saved, by_content), config_identity(config, by_content)
    if saved != config:
        raise other_configuration(root, sorted(
            k for k in set(saved) | set(config) if saved.get(k) != config.get(k)))


def _notice_on_stderr(message: str) -> None:
    from kvdrift.text import printable

    print(f"note: {printable(message)}", file=sys.stderr)


class RunStore:
    """The directory of one run (or study); see the module docstring for the layout.

    ``root`` is a path (read only, unless opened with :meth:`open`) or a held folder."""

    def __init__(self, root: str | Path | OutputDir, recompute: bool = False,
                 notice: Callable[[str], None] | None = None):
        self.dir = root if isinstance(root, OutputDir) else OutputDir(root, create=False)
        self.root = Path(root)
        self.recompute = recompute  # recompute units stored under other settings
        self.notice = notice or _notice_on_stderr  # hears which damaged units are recomputed
        self._strays: set[Path] = set()  # files no unit owns, named once

    @classmethod
    def open(cls, root: str | Path | OutputDir, config: dict[str, Any], recompute: bool = False,
             notice: Callable[[str], None] | None = None,
             presses: dict[str, Any] | None = None) -> RunStore:
        """Create the store, or reopen it if it holds a run with the same configuration.

        ``presses`` (each action's kvpress press, for readers) is written beside the
        configuration and not compared on reopening. The folder is marked a kvdrift run
        (:data:`~kvdrift.output.MARKER`) before anything else is written in it.

        Creating ``run.json`` is atomic (a unique temporary file, linked to the name only if
        no other process created it first); a process that loses that race compares its
        configuration with the winner's like any reopening run.
        """
        folder = root if isinstance(root, OutputDir) else OutputDir(root)
        folder.marker = "run"
        store = cls(folder, recompute, notice)
        path = store.root / RUN_FILE
        if not folder.exists(RUN_FILE):
            meta = {"config": config, "versions": package_versions()}
            if presses:
                meta["presses"] = presses
            try:  # linked to the name only if absent: never overwritten
                folder.write_text(RUN_FILE, json.dumps(meta, indent=2), exclusive=True)
            except FileExistsError:
                pass
        _refuse_other_config(store.root, read_run_file(path, folder)["config"], config)
        for kind in KINDS:
            folder.subdir(kind).fd  # noqa: B018 - made if missing, held
        return store

    @property
    def metadata(self) -> dict[str, Any]:
        if not self.dir.exists(RUN_FILE):
            raise FileNotFoundError(not_a_store(self.root) or f"{self.root} has no {RUN_FILE}")
        return read_run_file(self.root / RUN_FILE, self.dir)

    def _path(self, key: UnitKey, kind: str) -> Path:
        return self.root / kind / f"{unit_name(key)}.parquet"

    def is_done(self, key: UnitKey) -> bool:
        """Whether the unit's replicate file (its done marker) exists; see :meth:`unit_done`."""
        return self.dir.subdir("replicates").exists(f"{unit_name(key)}.parquet")

    def open_part(self, kind: str, name: str) -> Any:
        """A unit file of ``kind`` opened for reading through the held folder: only a regular
        file (a FIFO there is refused, never waited on)."""
        handle = self.dir.subdir(kind).open_read(name)
        if handle is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(self.root / kind / name))
        return handle

    def _footer(self, kind: str, name: str) -> tuple[pq.FileMetaData, Any]:
        """A unit file's Parquet footer and the unit it names (:meth:`_open_part`)."""
        with self.open_part(kind, name) as handle:
            footer = pq.read_metadata(handle)
            return footer, _unit_in(self.root / kind / name, footer, handle)

    def _read_unit(self, key: UnitKey) -> UnitFiles:
        """A finished unit's files as their Parquet footers tell them (nothing else is read)."""
        footers = {}
        for kind in KINDS:
            path = self._path(key, kind)
            if not self.dir.subdir(kind).exists(path.name):
                return UnitFiles(damage=f"its {kind} file is missing")
            try:
                footers[kind], unit = self._footer(kind, path.name)
            except (OSError, pa.ArrowException, StopIteration) as exc:
                return UnitFiles(damage=f"{path.name} is unreadable "
                                        f"({str(exc).strip().splitlines()[0]})")
            if unit is not None and unit != (key.model, key.doc_id, key.action):
                return UnitFiles(damage=f"its {kind} file holds the records of another unit "
                                        f"({' · '.join(unit)})")
        steps, reps = (fp.decode(footers[kind].metadata) for kind in KINDS)
        if None not in (steps, reps) and steps != reps:
            return UnitFiles(damage="its steps file was made under other settings than its "
                                    "replicates file")
        return UnitFiles(rows={kind: f.num_rows for kind, f in footers.items()},
                         metadata=footers["replicates"].metadata)

    def _forget(self, key: UnitKey) -> None:
        for kind in reversed(KINDS):  # the done marker first
            self.dir.subdir(kind).unlink(f"{unit_name(key)}.parquet")

    def unit_done(self, key: UnitKey, fingerprint: Mapping[str, Any]) -> bool:
        """Whether ``key`` is finished under the settings ``fingerprint``.

        A damaged unit is named (``notice``), removed and reported not done, so it is
        recomputed. A unit stored under other settings, or holding NaN, infinite or null values
        where numbers belong (:mod:`kvdrift.records.finite`), raises ``ValueError`` naming the
        setting or the columns, or with ``recompute`` is removed and reported not done.
        """
        if not self.is_done(key):
            return False
        name = f"{key.model} · {key.doc_id} · {key.action}"
        files = self._read_unit(key)
        found = fp.check(files.metadata, files.rows, fingerprint)
        damage = files.damage or found.incomplete
        counts: dict[str, int] = {}
        try:
            for kind in KINDS if damage is None else ():
                table = current_layout(kind, pq.read_table(self._path(key, kind)))
                counts |= _nonfinite_in(kind, table, None)
        except (OSError, pa.ArrowException) as exc:
            damage = f"a file is unreadable ({str(exc).strip().splitlines()[0]})"
        if damage is not None:
            self.notice(f"unit {name} in {self.root} is damaged ({damage}); recomputing it")
            self._forget(key)
            return False
        difference = found.difference
        if difference is None:
            if not counts:
                return True
            difference = (f"it holds NaN, infinite or null values where numbers belong "
                          f"({counts_text(counts)}; written by an earlier kvdrift)")
        if self.recompute:
            self.notice(f"unit {name}: {difference}; recomputing it (--recompute)")
            self._forget(key)
            return False
        raise ValueError(f"unit {name} in {self.root} is not mixed in: {difference}; rerun "
                         "with the same settings, pass --recompute to recompute such units, or "
                         "use another output directory")

    def write_unit(self, key: UnitKey, steps: pa.Table, replicates: pa.Table,
                   fingerprint: Mapping[str, Any] | None = None,
                   document: pa.Table | None = None) -> None:
        """Store one finished unit: its ``document`` (:func:`~.documents.document_table`)
        first unless recorded already, then steps, the replicate file (the done marker) last;
        the records carry ``fingerprint``, the settings that made them."""
        if document is not None:
            folder = self.dir.subdir(docs.FOLDER)
            name = docs.document_name(key.model, key.doc_id)
            if not docs.is_recorded(folder.open_read(name), document):
                _write_atomically(document, folder, name)
        name = f"{unit_name(key)}.parquet"
        _write_atomically(_with_fingerprint(steps, fingerprint, key), self.dir.subdir("steps"),
                          name)
        _write_atomically(_with_fingerprint(replicates, fingerprint, key),
                          self.dir.subdir("replicates"), name)

    def read(self, kind: str, columns: list[str] | None = None) -> pa.Table:
        """All finished units' records of one kind (``"steps"`` or ``"replicates"``), each
        file in the current layout (:func:`~kvdrift.records.legacy.current_layout`)."""
        checks.choice(kind, "record kind", KINDS)
        done = self._owned("replicates")
        files = [self.root / kind / n for n in self._parts(kind) if n in done]
        if not files:
            raise ValueError(_no_units(self.root))
        owned = done if kind == "replicates" else self._owned(kind, refused=set(done))
        tables, nonfinite = [], []
        for f in files:
            if f.name not in owned:
                raise ValueError(f"{f} holds the records of another unit than "
                                 f"{' · '.join(done[f.name])}; rerun the run or study command "
                                 "to recompute its unit")
            try:
                with self.open_part(kind, f.name) as handle:
                    table = pq.read_table(handle, columns=columns)
                tables.append(current_layout(kind, table, columns))
                counts = _nonfinite_in(kind, tables[-1],
                                       functools.partial(self.open_part, kind, f.name))
            except (OSError, pa.ArrowException) as exc:
                raise ValueError(f"{f} is unreadable ({str(exc).strip().splitlines()[0]}); "
                                 "rerun the run or study command to recompute its unit") from None
            if counts:
                nonfinite.append(f"{' · '.join(owned[f.name])} ({counts_text(counts)})")
        if nonfinite:
            raise NonFiniteRecords(
                f"{self.root} holds NaN, infinite or null values where numbers belong (written "
                f"by a kvdrift before such units were refused), in unit {nonfinite[0]}"
                + (f" and {len(nonfinite) - 1} other units" if len(nonfinite) > 1 else "")
                + "; nothing is computed from what is left around them: rerun the run or "
                "study command with --recompute to recompute those units")
        return pa.concat_tables(tables, promote_options="default")

    def _owned(self, kind: str, refused: set[str] = frozenset()
               ) -> dict[str, tuple[str, str, str]]:
        """The files of ``kind`` that their unit owns (a file kvdrift wrote, or one named as
        it names units, holds the unit its name is the name of; a file of records assembled
        otherwise may hold several), by name, with that unit. Any other file (a copy under
        another name, a unit of another model or action, a replicate file without its steps
        file) is named once in a notice and left out, unless its name is in ``refused`` (the
        caller refuses it); one that is unreadable or names no unit is kept, so that reading
        it tells."""
        owned = {}
        named = self._named_in_config()
        for name in self._parts(kind):
            path = self.root / kind / name
            try:
                footer, unit = self._footer(kind, name)
            except (OSError, pa.ArrowException, StopIteration):
                unit = None
            if unit is None:  # unreadable, or names no unit: kept, reading it tells
                owned[path.name] = ("?", "?", "?")
                continue
            named_by_kvdrift = UNIT_KEY in (footer.metadata or {}) or _UNIT_FILE.fullmatch(
                path.name)  # a file of records assembled by hand may hold several units
            if named_by_kvdrift and _file_name(unit) != path.name:
                why = "its name is not that of the unit whose records it holds"
            elif not all(n is None or u in n for u, n in zip(unit, named, strict=True)):
                why = f"its unit {' · '.join(unit)} is not one of the store's models and actions"
            elif kind == "replicates" and not self.dir.subdir("steps").exists(path.name):
                why = f"its unit {' · '.join(unit)} has no steps file"
            else:
                owned[path.name] = unit
                continue
            if path.name not in refused and path not in self._strays:
                self._strays.add(path)
                self.notice(f"ignoring {path}: no unit of this store owns it ({why})")
        return owned

    def _parts(self, kind: str) -> list[str]:
        """The names of the Parquet files in ``kind``'s folder, sorted."""
        return [n for n in self.dir.subdir(kind).names()
                if n.endswith(".parquet") and not n.startswith(".")]

    def _named_in_config(self) -> tuple[set[str] | None, None, set[str] | None]:
        """The models and actions the store's configuration names (None where it names
        none), the units a file may hold."""
        try:
            config = self.metadata["config"]
        except (OSError, ValueError):
            return None, None, None
        models = config.get("models", [config["model"]] if "model" in config else None)
        actions = config.get("actions")
        return _names(models), None, _names(actions)
