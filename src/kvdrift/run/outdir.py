"""Where a run may write: the output directory is checked before anything is created in it.

A run writes only inside its output directory (``--out``). The file-system root, an empty
path and a file are refused, and so is an existing directory that holds anything other than
a kvdrift store (``run.json``, ``steps/``, ``replicates/``, ``report/``, ``.lock``): kvdrift
never mixes its files into another project's folder. A new or empty directory, or a kvdrift
store to resume, is accepted.
"""

from __future__ import annotations

import os
from pathlib import Path

#: What a kvdrift store holds at its top level (temporary files start with ".run.json.tmp-").
STORE_ENTRIES = frozenset({"run.json", "steps", "replicates", "report", ".lock"})
ALLOWED = ("allowed: a new or empty directory, or a kvdrift run or study directory to resume; "
           "choose another output directory (--out)")


class OutputDirRefused(ValueError):
    """The output directory is one a run must not write into (one line naming it)."""


def _refuse(out: object, reason: str) -> OutputDirRefused:
    return OutputDirRefused(f"output directory {str(out)!r} {reason}; {ALLOWED}")


def _foreign_entry(root: Path, entries: frozenset[str]) -> str | None:
    """An entry of ``root`` that no kvdrift store holds, or None."""
    for entry in sorted(os.listdir(root)):
        if entry not in entries and not any(entry.startswith(f".{e}.tmp-") for e in entries):
            return entry
    return None


def check_output_dir(out: str | os.PathLike[str], marker: str = "run.json",
                     entries: frozenset[str] = STORE_ENTRIES) -> Path:
    """``out`` as a path if a run may write there; else :class:`OutputDirRefused`.

    A directory holding ``marker`` is kvdrift's (resumed); another non-empty directory may
    hold only ``entries`` (the frontier passes its own marker and entries)."""
    path = check_writable_path(out)
    if path.is_dir() and not (path / marker).exists():
        entry = _foreign_entry(path, entries)
        if entry is not None:
            raise _refuse(out, f"already holds files that are not a kvdrift run (e.g. {entry!r})")
    return path


def check_writable_path(out: str | os.PathLike[str]) -> Path:
    """``out`` as a path if it names a directory kvdrift may create or write files in: not
    empty, not the file-system root, not a file, valid text; else :class:`OutputDirRefused`
    (``kvdrift report --out`` checks this much; a run checks :func:`check_output_dir`)."""
    if not isinstance(out, str | os.PathLike) or not str(out).strip():
        raise _refuse(out, "is empty")
    if "\0" in str(out):
        raise _refuse(out, "holds a NUL character")
    try:
        os.fsencode(out)
    except UnicodeError:
        raise _refuse(out, "is not valid text for a file name (a lone surrogate)") from None
    path = Path(out)
    resolved = path.expanduser().resolve()
    if resolved == Path(resolved.anchor):
        raise _refuse(out, "is the file-system root")
    if path.exists() and not path.is_dir():
        raise _refuse(out, "is a file, not a directory")
    return path
