"""Trust in the converted-weights cache: every file checked against the digest recorded with it.

The embedded model is converted once from its GGUF file into a cache folder
(:func:`kvdrift.lm.loading.model.smollm2_path`). Whatever later sits in that folder is loaded as
``smollm2``, so the folder records what it holds: a manifest written by the conversion with
each file's SHA-256 and the SHA-256 of the GGUF it came from. Before the folder is used, it must
be a private folder of this user (no link, not writable by others), hold exactly the files the
manifest lists (no link, no device, no extra file), and each file must match its digest; the
GGUF must be the one it was converted from. Anything else is refused in one line that names
the folder and says how to convert again (delete it). Hashing the weights (about 540 MB) takes
about a second; it is done once per process while the files are unchanged.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from kvdrift.lm.loading.digest import file_sha256, short

#: The manifest's file name inside a converted folder.
MANIFEST = "kvdrift-manifest.json"
#: The manifest's layout version (a folder of another version is converted again elsewhere).
MANIFEST_FORMAT = 1
#: The largest manifest read (it lists a handful of files).
MAX_MANIFEST_BYTES = 1 << 20

_verified: dict[str, tuple] = {}  # folder -> the stat signature of its files when verified


class CacheRefused(ValueError):
    """A converted-weights folder that cannot be trusted (a link, a foreign or tampered file)."""


def _refused(folder: Path, why: str) -> CacheRefused:
    return CacheRefused(f"converted-weights cache {folder}: {why}; delete {folder} to convert "
                        f"the model again")


def refuse_link(path: Path, what: str) -> os.stat_result | None:
    """The ``lstat`` of ``path`` (None if absent); :class:`CacheRefused` if it is a link or
    not a folder."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise CacheRefused(f"{what} {path} is a symbolic link; the converted-weights cache "
                           f"takes no links (remove the link, or set KVDRIFT_CACHE to a folder)")
    if not stat.S_ISDIR(info.st_mode):
        raise CacheRefused(f"{what} {path} is not a folder")
    return info


def private_folder(path: Path) -> Path:
    """Create ``path`` (and its parents) if needed, the last one private (``0o700``); refuse
    it if it is a link or not a folder."""
    if refuse_link(path, "cache folder") is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        refuse_link(path, "cache folder")
    return path


def write_manifest(folder: Path, source: str) -> None:
    """Record the SHA-256 of every file in a freshly converted ``folder`` and the SHA-256
    ``source`` of the GGUF it was converted from."""
    files = {entry.name: file_sha256(entry.path) for entry in sorted(
        os.scandir(folder), key=lambda e: e.name) if entry.name != MANIFEST}
    data = {"format": MANIFEST_FORMAT, "source_sha256": source, "files": files}
    path = folder / MANIFEST
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise _refused(folder, f"it has no {MANIFEST} (converted by an older kvdrift, or "
                       f"not by kvdrift)") from None
    except OSError:
        raise _refused(folder, f"its {MANIFEST} is not a regular file") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise _refused(folder, f"its {MANIFEST} is not a regular file")
        raw = handle.read(MAX_MANIFEST_BYTES + 1)
    try:
        data = json.loads(raw) if len(raw) <= MAX_MANIFEST_BYTES else None
    except ValueError:
        data = None
    ok = (isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT
          and isinstance(data.get("source_sha256"), str) and isinstance(data.get("files"), dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in data["files"].items()))
    if not ok:
        raise _refused(folder, f"its {MANIFEST} is not a manifest kvdrift wrote")
    return data


def _signature(folder: Path, info: os.stat_result) -> tuple:
    """What changes when a file of the folder is replaced, written or renamed."""
    entries = []
    for entry in os.scandir(folder):
        st = entry.stat(follow_symlinks=False)
        entries.append((entry.name, st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns,
                        st.st_ctime_ns))
    return (info.st_ino, info.st_mtime_ns, info.st_ctime_ns, tuple(sorted(entries)))


def verify(folder: Path, source: str) -> Path:
    """``folder`` if it is a private folder whose files are exactly those its manifest lists,
    each matching its recorded SHA-256, converted from the GGUF whose SHA-256 is ``source``;
    else :class:`CacheRefused` naming the first thing wrong."""
    info = refuse_link(folder, "converted model")
    if info is None:
        raise FileNotFoundError(f"no converted model at {folder}")
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise _refused(folder, "it is not a private folder of this user (owned by another "
                       "user, or writable by others)")
    signature = _signature(folder, info)
    if _verified.get(str(folder)) == signature:
        return folder
    manifest = _read_manifest(folder)
    if manifest["source_sha256"] != source:
        raise _refused(folder, f"it was converted from another GGUF file (SHA-256 "
                       f"{short(manifest['source_sha256'])}, the installed one is "
                       f"{short(source)})")
    listed = manifest["files"]
    for name, mode, *_ in signature[3]:
        if name == MANIFEST:
            continue
        if name not in listed:
            raise _refused(folder, f"{name!r} is not a file the conversion wrote")
        if not stat.S_ISREG(mode):
            raise _refused(folder, f"{name!r} is not a regular file (a link, a folder or a "
                           f"device)")
    present = {entry[0] for entry in signature[3]}
    missing = sorted(set(listed) - present)
    if missing:
        raise _refused(folder, f"{missing[0]!r}, which the conversion wrote, is missing")
    for name, digest in sorted(listed.items()):
        if file_sha256(folder / name) != digest:
            raise _refused(folder, f"{name!r} does not match the SHA-256 recorded when it was "
                           f"converted (changed since)")
    _verified[str(folder)] = signature
    return folder
