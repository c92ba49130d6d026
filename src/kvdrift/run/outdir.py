"""Where a run may write: the output directory is checked before anything is created in it.

A run writes only inside its output directory (``--out``). The file-system root, an empty
path and a file are refused, and so is an existing directory that holds anything other than
a kvdrift store (``run.json``, ``steps/``, ``replicates/``, ``report/``, ``.lock``): kvdrift
never mixes its files into another project's folder. A new or empty directory, or a kvdrift
store to resume, is accepted. A symbolic link anywhere inside the directory is refused
(:func:`kvdrift.output.refuse_links`). A kvdrift folder is known by its marker
(:data:`~kvdrift.output.MARKER`, naming its kind: run, frontier or report), or by the file its
kind writes (``run.json``, ``frontier.json``, ``report.html``) for folders written before the
marker; no output directory may lie inside another kvdrift folder (``frontier --out
RUN/report`` would be overwritten by ``report RUN``; a run inside a frontier's ``stages/`` would
be read as a stage), except a report inside the run it reports on, and a folder of one kind is
never written as another (``report STORE --out FRONTIER/report``). These checks read only, so a
refused command has written nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvdrift.output import MARKER, LinkRefused, check_regular, is_link, open_regular, refuse_links

#: What a kvdrift store holds at its top level (temporary files start with ".run.json.tmp-").
STORE_ENTRIES = frozenset({"run.json", "documents", "steps", "replicates", "report", ".lock",
                           MARKER})
#: A frontier directory's marker and what it holds at its top level (``kvdrift frontier``).
FRONTIER_FILE = "frontier.json"
FRONTIER_ENTRIES = frozenset({FRONTIER_FILE, "analysis.json", "stages", "report", MARKER})
#: What a report directory holds (``kvdrift report``).
REPORT_ENTRIES = frozenset({"report.html", "analysis.json", "figures", MARKER})
#: Each kind of kvdrift folder: the file that marked it before :data:`MARKER`, its entries.
KINDS = {"run": ("run.json", STORE_ENTRIES), "frontier": (FRONTIER_FILE, FRONTIER_ENTRIES),
         "report": ("report.html", REPORT_ENTRIES)}
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


def marker_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind a kvdrift marker in ``path`` names (``kvdrift <kind>`` in a regular file
    :data:`MARKER`), or None where there is no such marker: an entry of that name that is a
    folder, a device or other text (``KVDRIFT_CACHE=~/.kvdrift``) is not one. Reads only."""
    marker = Path(path) / MARKER
    if not os.path.lexists(marker):
        return None
    try:
        with open_regular(marker) as handle:
            words = handle.read(64).decode("utf-8", "replace").split()
    except (OSError, ValueError):
        return None
    return words[1] if len(words) == 2 and words[0] == "kvdrift" else None


def folder_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind of kvdrift folder ``path`` is (``run``, ``frontier``, ``report``; the
    marker's word, whatever it is), or None if it is none. Reads only."""
    path = Path(path)
    kind = marker_kind(path)
    if kind is not None:
        return kind
    return next((kind for kind, (file, _) in KINDS.items() if (path / file).exists()), None)


def _enclosing(path: Path, kind: str) -> tuple[Path, str] | None:
    """The nearest kvdrift folder above ``path`` that a folder of ``kind`` may not lie in (a
    report may lie inside a run), with its kind, or None."""
    for parent in path.expanduser().resolve().parents:
        outer = folder_kind(parent)
        if outer is not None and not (kind == "report" and outer == "run"):
            return parent, outer
    return None


def check_output_dir(out: str | os.PathLike[str], kind: str = "run", nested: bool = False
                     ) -> Path:
    """``out`` as a path if a kvdrift folder of ``kind`` (run, frontier, report) may be
    written there; else :class:`OutputDirRefused` (or :class:`~kvdrift.output.LinkRefused`
    for a link inside it).

    A directory of that kind is resumed; another non-empty directory may hold only that
    kind's entries; a directory inside another kvdrift folder is refused unless ``nested``
    (a frontier's own stages)."""
    path = check_writable_path(out)
    refuse_links(path)
    word = "a kvdrift run" if kind == "run" else f"a kvdrift {kind}"
    outer = None if nested else _enclosing(path, kind)
    if outer is not None:
        raise _refuse(out, f"lies inside the kvdrift directory {str(outer[0])!r} (a kvdrift "
                           f"{outer[1]}), whose own commands write there")
    own = folder_kind(path) if path.is_dir() else None
    if own is not None and own != kind:
        raise _refuse(out, f"is a kvdrift {own} directory, not {word}")
    if path.is_dir() and own is None:
        if os.path.lexists(path / MARKER):
            raise _refuse(out, f"holds a {MARKER!r} entry that is not a kvdrift marker (a "
                               f"regular file reading 'kvdrift <kind>')")
        entry = _foreign_entry(path, KINDS[kind][1])
        if entry is not None:
            raise _refuse(out, f"already holds files that are not {word} (e.g. {entry!r})")
        entry = _foreign_entry(path, frozenset()) if kind == "report" else None
        if entry is not None:  # analysis.json and figures/ alone may be the user's own
            raise _refuse(out, f"holds files that kvdrift did not mark as its report (no "
                               f"{MARKER} marker, no report.html; e.g. {entry!r}), which a "
                               f"report would overwrite")
    return path


def check_frontier_dir(out: str | os.PathLike[str]) -> Path:
    """``out`` as a path if a frontier may be written there (:func:`check_output_dir`)."""
    return check_output_dir(out, "frontier")


def check_report_dir(out: str | os.PathLike[str]) -> Path:
    """``out`` as a path if a report may be written there: as :func:`check_output_dir`, for
    a report directory (new, empty, or holding a report), which may lie inside a run's store
    but never inside a frontier or another report."""
    return check_output_dir(out, "report")


def check_file_path(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a path if it names a file kvdrift may write (``--figure``, ``--report``):
    not empty, not a folder (``/``, ``.``), not a link, not a device, FIFO or socket, valid
    text; else one line naming it."""
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
    check_regular(out, what)  # a device or FIFO is never replaced
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
