"""The one output boundary: every file kvdrift writes is opened here, never through a link.

A writer names the folder it was given (``root``: ``--out``, a report folder, the folder of
``--figure``) and a path inside it. The folder itself and every folder and file below it are
opened with ``O_NOFOLLOW`` through directory descriptors, so a symbolic link where kvdrift
expects its own file or folder (``.lock``, ``steps/``, ``report/``, ``run.json``, ...) is
refused in one line (:class:`LinkRefused`) instead of written through, and no path can leave
``root`` (``..`` and absolute parts are refused). Links in the part of ``root`` the user typed
(``/data -> /mnt/data``) are the user's choice and are followed.

Files are written to a new temporary name (``.<name>.tmp-*``, created with ``O_EXCL``) and
renamed over the name once complete, so a reader never sees half a file; created files and
folders get the mode a plain ``open`` would (the umask applies).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                   | getattr(os, "O_CLOEXEC", 0))


class LinkRefused(ValueError):
    """A link (or another non-folder) sits where kvdrift writes its own file or folder."""


def _link_error(path: Path) -> LinkRefused:
    try:
        target = f" to {os.readlink(path)!r}"
    except OSError:
        target = ""
    return LinkRefused(
        f"{path} is a symbolic link{target}; kvdrift writes only its own files and folders, "
        "never through a link: remove the link or choose another output directory")


def is_link(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` itself is a symbolic link (a dangling one included)."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def find_link(root: str | os.PathLike[str]) -> Path | None:
    """The first symbolic link at ``root`` or anywhere below it (links are not followed), or
    None; an absent ``root`` holds none. What a command checks before it writes anything."""
    root = Path(root)
    if is_link(root):
        return root
    if not root.is_dir():
        return None
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            if is_link(Path(folder, name)):
                return Path(folder, name)
    return None


def refuse_links(root: str | os.PathLike[str]) -> None:
    """Raise :class:`LinkRefused` naming the first link at or below ``root``, if any."""
    link = find_link(root)
    if link is not None:
        raise _link_error(link)


def _parts(relative: str | os.PathLike[str]) -> tuple[str, ...]:
    """The components of a path inside a root; ``..``, ``.`` and absolute paths refused."""
    parts = PurePosixPath(os.fspath(relative)).parts
    if not parts or PurePosixPath(os.fspath(relative)).is_absolute() or any(
            p in ("..", ".") for p in parts):
        raise ValueError(f"a path kvdrift writes must lie inside its output directory; got "
                         f"{os.fspath(relative)!r}")
    return parts


def _open_dir(parent: int | None, name: str | Path, shown: Path, create: bool) -> int:
    """A descriptor of folder ``name`` (in ``parent``'s folder, or a path when ``parent`` is
    None), made if ``create``; a link there is refused."""
    kwargs = {} if parent is None else {"dir_fd": parent}
    for attempt in (0, 1):
        try:
            return os.open(name, _DIR_FLAGS, **kwargs)
        except FileNotFoundError:
            if not create or attempt:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, **kwargs)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                if is_link(shown):
                    raise _link_error(shown) from None
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(shown)) from None
            raise
    raise AssertionError("unreachable")


def _open_root(root: Path, create: bool) -> int:
    """A descriptor of ``root`` itself (made, with its parents, if ``create``): the part of
    the path above it may hold links; ``root`` itself must not be one."""
    if create and not root.exists() and not is_link(root):
        root.parent.mkdir(parents=True, exist_ok=True)
    return _open_dir(None, root, root, create)


@contextlib.contextmanager
def _folder(root: Path, parts: tuple[str, ...], create: bool = True) -> Iterator[int]:
    """A descriptor of ``root/parts...`` opened one component at a time, never via a link."""
    fd = _open_root(root, create)
    shown = root
    try:
        for part in parts:
            shown = shown / part
            child = _open_dir(fd, part, shown, create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def make_folder(root: str | os.PathLike[str], relative: str | os.PathLike[str] | None = None
                ) -> Path:
    """Create ``root`` (and ``root/relative``) unless present, refusing links; returns it."""
    root = Path(root)
    parts = () if relative is None else _parts(relative)
    with _folder(root, parts):
        pass
    return root.joinpath(*parts)


def _check_not_link(fd: int, name: str, shown: Path) -> None:
    try:
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise _link_error(shown)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(shown))


@contextlib.contextmanager
def writing(root: str | os.PathLike[str], relative: str | os.PathLike[str], *,
            exclusive: bool = False) -> Iterator[BinaryIO]:
    """A binary file object for ``root/relative``; on a clean exit it replaces the name.

    Folders on the way are made. ``exclusive``: never replace an existing file (the name is
    linked to the finished file, :class:`FileExistsError` if it exists, as ``run.json``'s
    first writer wins a race). A link at the name or on the way is refused
    (:class:`LinkRefused`) before a byte is written.
    """
    root = Path(root)
    parts = _parts(relative)
    shown = root.joinpath(*parts)
    with _folder(root, parts[:-1]) as fd:
        name = parts[-1]
        _check_not_link(fd, name, shown)
        tmp = f".{name}.tmp-{secrets.token_hex(4)}"
        handle = os.fdopen(os.open(tmp, _NEW_FILE_FLAGS, 0o666, dir_fd=fd), "wb")
        try:
            with handle:
                yield handle
            if exclusive:
                os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            else:
                _check_not_link(fd, name, shown)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)


def write_bytes(root: str | os.PathLike[str], relative: str | os.PathLike[str],
                data: bytes, *, exclusive: bool = False) -> Path:
    """Write ``data`` to ``root/relative`` through :func:`writing`; returns the path."""
    with writing(root, relative, exclusive=exclusive) as handle:
        handle.write(data)
    return Path(root, relative)


def write_text(root: str | os.PathLike[str], relative: str | os.PathLike[str],
               text: str, *, exclusive: bool = False) -> Path:
    """Write ``text`` as UTF-8 to ``root/relative`` through :func:`writing`; returns the path."""
    return write_bytes(root, relative, text.encode("utf-8"), exclusive=exclusive)


def write_file(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a file the user named (``--figure``, ``--report``): its folder is the
    root (made if missing), the file itself must not be a link."""
    path = Path(path)
    return write_bytes(path.parent, path.name, data)


def open_lock_file(root: str | os.PathLike[str], name: str) -> int:
    """A read-write descriptor of ``root/name`` (created if missing, never through a link),
    for a lock held with ``flock``; the caller closes it."""
    root = Path(root)
    with _folder(root, ()) as fd:
        try:
            return os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                           | getattr(os, "O_CLOEXEC", 0), 0o666, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _link_error(root / name) from None
            raise


def open_for_reading(path: str | os.PathLike[str]) -> int | None:
    """A read-only descriptor of ``path`` unless it is missing (None); a link is refused."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_error(Path(path)) from None
        raise
