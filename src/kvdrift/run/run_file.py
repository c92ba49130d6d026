"""A store's ``run.json``: its name and how it is read and checked, without pandas, pyarrow
or torch, so a command can read a store's recorded settings (to refuse a resume, or to find its
press actions) before anything heavy is imported. :mod:`kvdrift.run.store` writes it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvdrift import limits
from kvdrift.json_values import parse_json
from kvdrift.output import MARKER, OutputDir, check_regular
from kvdrift.run.outdir import FRONTIER_FILE

RUN_FILE = "run.json"
#: The folders of a store that hold its records, one Parquet file per unit or document.
RECORD_FOLDERS = ("documents", "steps", "replicates")
#: Keys of a recorded configuration that name where it lives, not what its records are.
LABEL_KEYS = ("name",)
#: The recorded content hash of the documents read without a tokenizer
#: (:func:`kvdrift.data.document.documents_sha256`).
DOCUMENTS_HASH = "documents_sha256"


class NotARunStore(ValueError):
    """A directory's ``run.json`` is damaged or was not written by kvdrift (one line)."""


def _run_file_problem(meta: Any) -> str | None:
    """What makes a decoded ``run.json`` unusable, or None."""
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        return "not a JSON object with a 'config' object"
    versions = meta.get("versions", {})
    if not isinstance(versions, dict):
        return f"'versions' must be an object; got {versions!r:.80}"
    horizon = meta["config"].get("horizon")
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        return f"config.horizon must be an integer >= 1; got {horizon!r:.80}"
    return None


def read_run_file(path: Path, folder: OutputDir | None = None) -> dict[str, Any]:
    """A ``run.json`` (read through the held ``folder`` where given), checked: a JSON object
    with a ``config`` object holding an integer horizon, and a ``versions`` object if any;
    else :class:`NotARunStore` (one line)."""
    try:
        text = (limits.read_bounded(path) if folder is None else
                limits.bounded(folder.read_bytes(path.name, limits.MAX_CONFIG_BYTES), path))
    except ValueError as exc:
        raise NotARunStore(str(exc)) from None
    try:
        meta = parse_json(text.decode("utf-8"), "JSON")
    except UnicodeDecodeError as exc:
        reason = f"not valid JSON ({exc.reason})"
    except ValueError as exc:  # JSONError: nesting, a key twice, a huge integer, ...
        reason = str(exc).removeprefix("JSON: ")
    else:
        reason = _run_file_problem(meta)
        if reason is None:
            return {**meta, "versions": meta.get("versions", {})}
    raise NotARunStore(f"{path} is damaged: {reason}; delete it (finished units keep their own "
                       "settings and are checked on resume) or use another output directory")


def not_a_store(root: Path) -> str | None:
    """What ``root`` is if it is no run or study directory (one line), else None."""
    if not root.exists():
        return f"{root} does not exist; name a run or study directory"
    if not root.is_dir():
        return f"{root} is not a folder; name a run or study directory"
    if (root / FRONTIER_FILE).exists():
        return (f"{root} is a frontier directory, not a run or study: its report is "
                f"{root / 'report'}; each of its stages is a run (e.g. "
                f"{root / 'stages' / '01-look1'})")
    if not (root / RUN_FILE).exists():
        deleted = " (its run.json was deleted)" if (root / MARKER).exists() else ""
        return f"{root} is not a kvdrift run or study directory (it has no {RUN_FILE}){deleted}"
    return None


def check_store_dir(root: Path) -> None:
    """ValueError (:func:`not_a_store`'s line) unless ``root`` is a run or study directory
    whose record files are regular files: what ``show``, ``report``, ``plan`` and ``predict``
    refuse before anything heavy loads."""
    problem = not_a_store(Path(root))
    if problem is not None:
        raise ValueError(problem)
    for folder in RECORD_FOLDERS:  # a FIFO or device among the records: refused, not waited on
        path = Path(root) / folder
        if path.is_dir():
            for entry in sorted(os.listdir(path)):
                if entry.endswith(".parquet"):
                    check_regular(path / entry)


def other_configuration(root: Path, differing: list[str]) -> ValueError:
    """The refusal of a store that recorded another configuration (``differing``: the keys
    that differ), to raise."""
    return ValueError(
        f"{root} holds a run with a different configuration (differs in: "
        f"{', '.join(differing)}); rerun with the same arguments to resume, or use another "
        "output directory")


def config_identity(config: Mapping[str, Any], by_content: bool = True) -> dict[str, Any]:
    """What a recorded configuration must match on resume: everything that determines the
    records. The study's name (its folder's, for ``kvdrift run``) is left out, and where
    ``by_content`` and the documents' content hash is recorded, a JSONL file's path is left
    out too: the same documents read from another path (absolute or relative, or a copy)
    resume. Stores written before the hash was recorded compare the path (``by_content``
    false)."""
    out = {k: v for k, v in config.items() if k not in LABEL_KEYS}
    if not by_content:
        out.pop(DOCUMENTS_HASH, None)
    elif DOCUMENTS_HASH in config and isinstance(config.get("documents"), list):
        out["documents"] = [
            {k: v for k, v in d.items() if not (k == "path" and d.get("source") == "jsonl")}
            if isinstance(d, dict) else d for d in config["documents"]]
    return out
