"""Trust in the converted-weights cache: only files kvdrift wrote, loaded from the bytes checked.

The embedded model is converted once from its GGUF file into a cache folder
(:func:`kvdrift.lm.loading.model.smollm2_path`). Whatever later sits in that folder is loaded as
``smollm2``, so the folder records what it holds: a manifest written by the conversion with
each file's SHA-256 and the SHA-256 of the GGUF it came from, sealed with an HMAC under a key
of this user's (:data:`KEY_FILE`, a private file in the cache root, made once): a manifest
recomputed by anyone without the key, over files kvdrift did not write, is refused. The cache
root, and every folder above it, must not be writable by others (unless sticky, as ``/tmp``):
else anyone could rename the converted folder away and put another in its place.

The folder is opened once (:func:`opened`, a held descriptor, never a link) and must be a
private folder of this user holding exactly the files the manifest lists (no link, no device,
no extra file); each file is then read once through that descriptor and checked against its
digest, and what is loaded is those bytes (:mod:`kvdrift.lm.loading.from_cache`), never the
folder opened again by name, so a folder swapped in after the check is never loaded.
Anything else is refused in one line that names the folder and says how to convert again
(delete it).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from kvdrift.lm.loading.digest import short
from kvdrift.loose_folders import loose_folder

#: The manifest's file name inside a converted folder.
MANIFEST = "kvdrift-manifest.json"
#: The manifest's layout version (a folder of another version is converted again elsewhere).
MANIFEST_FORMAT = 2
#: The largest manifest read (it lists a handful of files).
MAX_MANIFEST_BYTES = 1 << 20
#: The file in the cache root holding this user's key for manifests (32 random bytes, 0o600).
KEY_FILE = "kvdrift-cache-key"
KEY_BYTES = 32
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC


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


def check_root(root: Path) -> None:
    """Refuse a cache root that others could change under kvdrift: the root itself writable
    by its group or others, or any folder above it writable by others, without the sticky bit
    (module docstring, :mod:`kvdrift.loose_folders`); a folder not yet made is checked from its
    first existing parent."""
    loose = loose_folder(root)
    if loose is not None:
        raise CacheRefused(
            f"cache folder {root}: {loose.phrase()}, so anyone could replace the converted "
            f"weights; make it private (chmod go-w {loose.folder}) or set KVDRIFT_CACHE to a "
            f"private folder")


def _read_at(dir_fd: int | None, path: Path | str, limit: int | None = None) -> bytearray:
    """A regular file's bytes (at most ``limit`` + 1, to tell a file too long), opened without
    following a link, in one writable buffer (weights are viewed in place, not copied);
    ``OSError`` for anything else (a FIFO is never blocked on)."""
    fd = os.open(path, _READ, dir_fd=dir_fd)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path}: not a regular file")
        size = info.st_size + 1 if limit is None else min(info.st_size, limit) + 1
        data = bytearray(size)
        view, done = memoryview(data), 0
        while done < size and (got := handle.readinto(view[done:])):
            done += got
        view.release()
        del data[done:]
        return data


def user_key(root: Path) -> bytes:
    """This user's manifest key in ``root`` (made once, private); a key file that is not a
    private regular file of this user is refused."""
    path = root / KEY_FILE
    if not path.exists() and not path.is_symlink():
        tmp = root / f".{KEY_FILE}.tmp-{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES))
        try:
            os.link(tmp, path)  # complete or absent: another process's key wins a race
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    why = "is not a private file of this user"
    try:
        fd = os.open(path, _READ)
    except OSError:
        raise CacheRefused(f"cache key {path} {why} (a link or not a file); delete it (every "
                           f"converted model is then converted again)") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        key = handle.read(KEY_BYTES + 1)
    if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077
            or len(key) != KEY_BYTES):
        raise CacheRefused(f"cache key {path} {why} (mode 0600, {KEY_BYTES} bytes); delete it "
                           f"(every converted model is then converted again)")
    return key


def seal(data: dict, key: bytes) -> str:
    """The HMAC-SHA256 under ``key`` of a manifest (all but its ``hmac``), as hex."""
    body = json.dumps({k: v for k, v in data.items() if k != "hmac"}, sort_keys=True)
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def write_manifest(folder: Path, source: str, key: bytes) -> None:
    """Record the SHA-256 of every file in a freshly converted ``folder`` and the SHA-256
    ``source`` of the GGUF it was converted from, sealed with this user's ``key``."""
    files = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name != MANIFEST:
            files[entry.name] = hashlib.sha256(_read_at(None, entry.path)).hexdigest()
    data = {"format": MANIFEST_FORMAT, "source_sha256": source, "files": files}
    data["hmac"] = seal(data, key)
    fd = os.open(folder / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)


class Opened:
    """A converted folder held open and its manifest checked; :meth:`read` gives a file's
    bytes only if they match their recorded digest (the bytes checked are the bytes used)."""

    def __init__(self, folder: Path, fd: int, files: dict[str, str]) -> None:
        self.folder, self.fd, self.files = folder, fd, files

    def read(self, name: str) -> bytearray:
        """The bytes of the listed file ``name``, read once through the held folder."""
        try:
            data = _read_at(self.fd, name)
        except OSError:
            raise _refused(self.folder, f"{name!r} is not a regular file (a link, a folder or a "
                           f"device)") from None
        if hashlib.sha256(data).hexdigest() != self.files[name]:
            raise _refused(self.folder, f"{name!r} does not match the SHA-256 recorded when it "
                           f"was converted (changed since)")
        return data


def _manifest(folder: Path, fd: int, key: bytes) -> dict:
    try:
        raw = _read_at(fd, MANIFEST, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise _refused(folder, f"it has no {MANIFEST} (converted by an older kvdrift, or "
                       f"not by kvdrift)") from None
    except OSError:
        raise _refused(folder, f"its {MANIFEST} is not a regular file") from None
    try:
        data = json.loads(raw) if len(raw) <= MAX_MANIFEST_BYTES else None
    except ValueError:
        data = None
    ok = (isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT
          and isinstance(data.get("source_sha256"), str) and isinstance(data.get("files"), dict)
          and isinstance(data.get("hmac"), str)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in data["files"].items()))
    if not ok:
        raise _refused(folder, f"its {MANIFEST} is not a manifest kvdrift wrote")
    if not hmac.compare_digest(data["hmac"], seal(data, key)):
        raise _refused(folder, f"its {MANIFEST} was not written by kvdrift for this user (its "
                       f"seal does not match the key in {KEY_FILE})")
    return data


@contextlib.contextmanager
def opened(folder: Path, source: str, key: bytes) -> Iterator[Opened]:
    """``folder`` held open, if it is a private folder of this user whose files are exactly
    those its sealed manifest lists, converted from the GGUF whose SHA-256 is ``source``; else
    :class:`CacheRefused` naming the first thing wrong. Files are checked as they are read."""
    if refuse_link(folder, "converted model") is None:
        raise FileNotFoundError(f"no converted model at {folder}")
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC)
    except OSError:
        raise _refused(folder, "it is no longer a folder (replaced while opened)") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise _refused(folder, "it is not a private folder of this user (owned by another "
                           "user, or writable by others)")
        manifest = _manifest(folder, fd, key)
        if manifest["source_sha256"] != source:
            raise _refused(folder, f"it was converted from another GGUF file (SHA-256 "
                           f"{short(manifest['source_sha256'])}, the installed one is "
                           f"{short(source)})")
        listed = manifest["files"]
        present = set()
        for entry in os.scandir(fd):
            present.add(entry.name)
            if entry.name == MANIFEST:
                continue
            if entry.name not in listed:
                raise _refused(folder, f"{entry.name!r} is not a file the conversion wrote")
            if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                raise _refused(folder, f"{entry.name!r} is not a regular file (a link, a folder "
                               f"or a device)")
        missing = sorted(set(listed) - present)
        if missing:
            raise _refused(folder, f"{missing[0]!r}, which the conversion wrote, is missing")
        yield Opened(folder, fd, dict(listed))
    finally:
        os.close(fd)


def verify(folder: Path, source: str, key: bytes) -> Path:
    """``folder`` if :func:`opened` accepts it and every file it lists matches its digest."""
    with opened(folder, source, key) as cache:
        for name in sorted(cache.files):
            cache.read(name)
    return folder
