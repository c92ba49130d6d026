"""Where a run may write: the output directory is checked before anything is created in it.

A run writes only inside its output directory (``--out``). The file-system root, an empty
path and a file are refused, and so is an existing directory that holds anything other than
a kvdrift store (``run.json``, ``steps/``, ``replicates/``, ``report/``, ``.lock``): kvdrift
never mixes its files into another project's folder. A new or empty directory, or a kvdrift
store to resume, is accepted. A symbolic link anywhere inside the directory is refused
(:func:`kvdrift.output.refuse_links`), and so is a directory inside another run's store
(``frontier --out RUN/report`` would be overwritten by ``report RUN``): these checks read
only, so a refused command has written nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvdrift.output import LinkRefused, is_link, refuse_links

#: What a kvdrift store holds at its top level (temporary files start with ".run.json.tmp-").
STORE_ENTRIES = frozenset({"run.json", "documents", "steps", "replicates", "report", ".lock"})
#: A frontier directory's marker and what it holds at its top level (``kvdrift frontier``).
FRONTIER_FILE = "frontier.json"
FRONTIER_ENTRIES = frozenset({FRONTIER_FILE, "analysis.json", "stages", "report"})
#: What a report directory holds (``kvdrift report``).
REPORT_ENTRIES = frozenset({"report.html", "analysis.json", "figures"})
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


def _enclosing_store(path: Path, markers: tuple[str, ...]) -> Path | None:
    """The nearest folder above ``path`` that holds one of ``markers``, or None."""
    for parent in path.expanduser().resolve().parents:
        if any((parent / m).exists() for m in markers):
            return parent
    return None


def check_output_dir(out: str | os.PathLike[str], marker: str = "run.json",
                     entries: frozenset[str] = STORE_ENTRIES,
                     not_inside: tuple[str, ...] = ("run.json",), what: str = "a kvdrift run"
                     ) -> Path:
    """``out`` as a path if a run may write there; else :class:`OutputDirRefused` (or
    :class:`~kvdrift.output.LinkRefused` for a link inside it).

    A directory holding ``marker`` is kvdrift's (resumed); another non-empty directory may
    hold only ``entries`` (the frontier and the report pass their own marker and entries);
    a directory inside a folder holding one of ``not_inside`` (another store) is refused."""
    path = check_writable_path(out)
    refuse_links(path)
    outer = _enclosing_store(path, not_inside)
    if outer is not None:
        raise _refuse(out, f"lies inside the kvdrift directory {str(outer)!r}, whose own "
                           "commands write there")
    if path.is_dir() and not (path / marker).exists():
        entry = _foreign_entry(path, entries)
        if entry is not None:
            raise _refuse(out, f"already holds files that are not {what} (e.g. {entry!r})")
    return path


def check_frontier_dir(out: str | os.PathLike[str]) -> Path:
    """``out`` as a path if a frontier may be written there: as :func:`check_output_dir`, for
    a frontier directory, which may lie inside neither a run nor another frontier."""
    return check_output_dir(out, FRONTIER_FILE, FRONTIER_ENTRIES, ("run.json", FRONTIER_FILE),
                            "a kvdrift frontier")


def check_report_dir(out: str | os.PathLike[str]) -> Path:
    """``out`` as a path if a report may be written there: as :func:`check_output_dir`, for
    a report directory (new, empty, or holding a report), which may lie inside a store."""
    return check_output_dir(out, "report.html", REPORT_ENTRIES, (), "a kvdrift report")


def check_file_path(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a path if it names a file kvdrift may write (``--figure``, ``--report``):
    not empty, not a folder (``/``, ``.``), not a link, valid text; else one line naming it."""
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise ValueError(f"{what} must name a file to write; got {str(path)!r}")
    text = str(path)
    if "\0" in text or text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        raise ValueError(f"{what} must name a file to write (not a folder); got {text!r}")
    try:
        os.fsencode(text)
    except UnicodeError:
        raise ValueError(f"{what} is not valid text for a file name (a lone surrogate); got "
                         f"{text!r}") from None
    out = Path(text)
    if out.is_dir():
        raise ValueError(f"{what} must name a file to write, not the folder {text!r}")
    if is_link(out):
        raise LinkRefused(f"{what} {text!r} is a symbolic link; kvdrift never writes through "
                          "a link: name the file itself")
    return out


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
