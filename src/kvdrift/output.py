"""The one output boundary: every file kvdrift writes is opened here, never through a link.

A command holds its output folder (``--out``, a report folder, the folder of ``--figure``) as
an :class:`OutputDir`: a directory descriptor, opened once (on first use, so a refused command
creates nothing) and kept for the whole command, and so is each folder it opens below it
(:meth:`OutputDir.subdir`). Every create, rename and delete is relative to a held descriptor
(``openat``, ``renameat``, ``unlinkat``, ``mkdirat``), never a path resolved again later, and
every folder below the output folder is opened with ``O_NOFOLLOW | O_DIRECTORY``: a symbolic
link where kvdrift expects its own file or folder is refused in one line (:class:`LinkRefused`),
and so is a folder replaced by a link (or moved) while the command runs, at its next use. No
path can leave the output folder (``..`` and absolute parts are refused). Links in the part of
the path the user typed (``/data -> /mnt/data``) are the user's choice and are followed.

kvdrift writes only regular files it creates, and reads only regular files: files are written
to a new temporary name (``.<name>.tmp-*``, ``O_EXCL``) and renamed over the name once
complete, so a reader never sees half a file, and a device, FIFO or socket where kvdrift reads
or writes is refused (:class:`NotARegularFile`) without blocking on it (opened with
``O_NONBLOCK``, then checked). Created files and folders get the mode a plain ``open`` would
(the umask applies). A write that fails (a full disk, a read-only folder) names the file the
user knows, never the temporary one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC
_KINDS = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
          (stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISSOCK, "socket"),
          (stat.S_ISDIR, "folder"), (stat.S_ISLNK, "symbolic link"))


#: The file that marks a folder as kvdrift's, naming its kind (``kvdrift run``, ``kvdrift
#: frontier``, ``kvdrift report``): written first, when kvdrift creates or first writes in it.
MARKER = ".kvdrift"


class LinkRefused(ValueError):
    """A link (or another non-folder) sits where kvdrift writes its own file or folder."""


class NotARegularFile(ValueError):
    """A device, FIFO, socket or folder where kvdrift reads or writes a file (one line)."""


def _link_error(path: Path) -> LinkRefused:
    try:
        target = f" to {os.readlink(path)!r}"
    except OSError:
        target = ""
    return LinkRefused(
        f"{path} is a symbolic link{target}; kvdrift writes only its own files and folders, "
        "never through a link: remove the link or choose another output directory")


def _kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words ("FIFO (named pipe)", "character device", ...)."""
    return next((word for test, word in _KINDS if test(mode)), "special file")


def _not_regular(path: str | os.PathLike[str], mode: int, what: str = "") -> NotARegularFile:
    """The one-line refusal of a non-regular file at ``path`` (``what``: the user's flag)."""
    named = f"{what} {str(path)!r}" if what else str(path)
    return NotARegularFile(f"{named} is a {_kind_of(mode)}, not a regular file; kvdrift reads "
                           "and writes only regular files: name a regular file")


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


def _naming(exc: OSError, shown: Path) -> OSError:
    """``exc`` naming ``shown`` where it names no file, a temporary one or a file object
    (pyarrow's and matplotlib's write errors, a full disk or a read-only folder)."""
    name = exc.filename
    if isinstance(name, str | bytes | os.PathLike) and not str(name).startswith(("<", ".")) \
            and ".tmp-" not in str(name):
        return exc
    text = str(exc)
    code = exc.errno or next((int(m) for m in re.findall(r"errno (\d+)", text, re.I)), None)
    reason = os.strerror(code) if code else (exc.strerror or text)
    return OSError(code, reason, str(shown))


def _open_dir(parent: int | None, name: str | Path, shown: Path, create: bool) -> int | None:
    """A descriptor of folder ``name`` (in ``parent``'s folder, or a path when ``parent`` is
    None), made if ``create``, else None if it is missing; a link there is refused."""
    kwargs = {} if parent is None else {"dir_fd": parent}
    for attempt in (0, 1):
        try:
            return os.open(name, _DIR_FLAGS, **kwargs)
        except FileNotFoundError:
            if not create:
                return None
            if attempt:
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


def _open_followed(path: Path) -> int | None:
    """A descriptor of the folder ``path`` names (links followed), or None if missing."""
    try:
        return os.open(path, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except FileNotFoundError:
        return None


def _replaced(path: Path, why: str, followed: bool = False) -> LinkRefused:
    if is_link(path) and not followed:
        return _link_error(path)
    return LinkRefused(f"{path} was {why} while kvdrift was using it; kvdrift reads and "
                       "writes only in the folders it opened: put it back or rerun the command")


@dataclass(frozen=True)
class FileIn:
    """A file ``name`` in a held folder: where a writer that is given a place writes
    (:func:`write_file`); reads back through the folder; shown as its path."""

    folder: OutputDir
    name: str

    @property
    def path(self) -> Path:
        return self.folder.path / self.name

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def read_bytes(self) -> bytes:
        return self.folder.read_bytes(self.name)


class OutputDir:
    """A folder kvdrift writes in, held by a directory descriptor for the whole command.

    Opened (and made, where ``create``) on first use, through its parent's descriptor for a
    sub-folder; before every later use it checks that its name still names the folder it
    holds (:meth:`check`). Files are written as new temporary files renamed over their name
    (:meth:`open_file`), deleted by name in the folder (:meth:`unlink`). ``os.fspath`` gives
    its path, for messages and readers. ``marker``: the kind of kvdrift folder it is, written
    to :data:`MARKER` before anything else is written in it.
    """

    def __init__(self, path: str | os.PathLike[str], create: bool = True, *,
                 marker: str | None = None, parent: OutputDir | None = None,
                 name: str | None = None):
        self.path = Path(path)
        self.create = create
        self.marker = marker
        self._marked = False
        self._follow = parent is None and not create  # a reader's root: the user's links
        self._parent, self._name = parent, name
        self._fd: int | None = None
        self._id: tuple[int, int] | None = None
        self._children: dict[str, OutputDir] = {}

    def __repr__(self) -> str:
        return f"OutputDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __truediv__(self, name: str) -> FileIn:
        (part,) = _parts(name)
        return FileIn(self, part)

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def close(self) -> None:
        """Let go of the descriptors of this folder and every sub-folder opened from it."""
        for child in self._children.values():
            child.close()
        self._children.clear()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def subdir(self, relative: str | os.PathLike[str], create: bool | None = None,
               marker: str | None = None) -> OutputDir:
        """The folder ``relative`` below this one (held once; opened on first use, never
        through a link); ``marker`` as for the class."""
        folder = self
        for part in _parts(relative):
            child = folder._children.get(part)
            if child is None:
                child = OutputDir(folder.path / part, folder.create if create is None else create,
                                  parent=folder, name=part)
                folder._children[part] = child
            folder = child
        if marker is not None:
            folder.marker = marker
        return folder

    # --- the descriptor -------------------------------------------------------------------

    def _held(self, create: bool) -> int | None:
        """The descriptor, opened on first use (the folder made if ``create``), checked on
        every later one; None where the folder is missing and not to be made."""
        if self._fd is not None:
            self.check()
        elif self._parent is None:
            if create and not self.path.exists() and not is_link(self.path):
                self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = (_open_dir(None, self.path, self.path, create) if not self._follow else
                  _open_followed(self.path))
        else:
            parent = self._parent._held(create)
            fd = None if parent is None else _open_dir(parent, self._name, self.path, create)
        if self._fd is None and fd is not None:
            info = os.fstat(fd)
            self._fd, self._id = fd, (info.st_dev, info.st_ino)
        if create and self.marker and not self._marked and self._fd is not None:
            self._marked = True  # before the write below, which comes back here
            if not self.exists(MARKER):
                with contextlib.suppress(FileExistsError):
                    self.write_text(MARKER, f"kvdrift {self.marker}\n", exclusive=True)
        return self._fd

    @property
    def fd(self) -> int:
        """The held descriptor (the folder made if missing and ``create``)."""
        fd = self._held(self.create)
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "no such folder", str(self.path))
        return fd

    def check(self) -> None:
        """Refuse (:class:`LinkRefused`, one line) if this folder's name, or one above it up
        to the output folder, no longer names the folder held: replaced by a link or another
        folder, or moved, since it was opened."""
        if self._fd is None:
            return
        if self._parent is not None:
            self._parent.check()
        try:
            info = (os.stat(self.path, follow_symlinks=self._follow)
                    if self._parent is None else
                    os.stat(self._name, dir_fd=self._parent._fd, follow_symlinks=False))
        except FileNotFoundError:
            raise _replaced(self.path, "moved or deleted", self._follow) from None
        if (info.st_dev, info.st_ino) != self._id:
            raise _replaced(self.path, "replaced by another folder", self._follow)

    # --- reading --------------------------------------------------------------------------

    def _mode(self, name: str) -> int | None:
        fd = self._held(False)
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        """Whether ``name`` is in the folder (whatever it is; a link is not followed)."""
        return self._mode(name) is not None

    def names(self) -> list[str]:
        """The folder's entries, sorted (none if the folder is missing)."""
        fd = self._held(False)
        return [] if fd is None else sorted(os.listdir(fd))

    def open_read(self, name: str) -> BinaryIO | None:
        """A binary file object reading regular file ``name`` of this folder, or None if it
        is missing; a link is refused, and so is a device, FIFO or socket (not blocking)."""
        fd = self._held(False)
        if fd is None:
            return None
        try:
            handle = os.open(name, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _link_error(self.path / name) from None
            raise
        return _regular_reader(handle, self.path / name)

    def read_bytes(self, name: str, limit: int | None = None) -> bytes:
        """The bytes of regular file ``name`` (at most ``limit + 1`` are read)."""
        handle = self.open_read(name)
        if handle is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(self.path / name))
        with handle:
            return handle.read() if limit is None else handle.read(limit + 1)

    # --- writing --------------------------------------------------------------------------

    def _check_target(self, fd: int, name: str) -> None:
        """Refuse to replace anything at ``name`` but a regular file (a link, a folder, a
        device, a FIFO, a socket): kvdrift writes only regular files it creates."""
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise _link_error(self.path / name)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(self.path / name))
        if not stat.S_ISREG(mode):
            raise _not_regular(self.path / name, mode)

    @contextlib.contextmanager
    def open_file(self, name: str, *, exclusive: bool = False) -> Iterator[BinaryIO]:
        """A binary file object for ``name`` in this folder; on a clean exit it replaces
        the name (:meth:`replace`). ``exclusive``: never replace an existing file (the name
        is linked to the finished file, :class:`FileExistsError` if it exists, as
        ``run.json``'s first writer wins a race). Anything but a regular file at the name is
        refused before a byte is written; a failed write names the file, not the temporary
        one."""
        (name,) = _parts(name)
        shown = self.path / name
        try:
            fd = self.fd
            self._check_target(fd, name)
            tmp = f".{name}.tmp-{secrets.token_hex(4)}"
            handle = os.fdopen(os.open(tmp, _NEW_FILE_FLAGS, 0o666, dir_fd=fd), "wb")
        except OSError as exc:
            raise _naming(exc, shown) from None
        try:
            with handle:
                yield handle
            if exclusive:
                os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd,
                        follow_symlinks=False)
            else:
                self.replace(tmp, name)
        except FileExistsError:
            raise
        except OSError as exc:
            raise _naming(exc, shown) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)

    def write_bytes(self, name: str, data: bytes, *, exclusive: bool = False) -> Path:
        """Write ``data`` to ``name`` through :meth:`open_file`; returns its path."""
        with self.open_file(name, exclusive=exclusive) as handle:
            handle.write(data)
        return self.path / name

    def write_text(self, name: str, text: str, *, exclusive: bool = False) -> Path:
        """Write ``text`` as UTF-8 to ``name`` through :meth:`open_file`; returns its path."""
        return self.write_bytes(name, text.encode("utf-8"), exclusive=exclusive)

    def replace(self, src: str, dst: str) -> None:
        """Rename ``src`` over ``dst``, both in this folder (``dst`` absent or a regular
        file)."""
        fd = self.fd
        self._check_target(fd, dst)
        os.replace(src, dst, src_dir_fd=fd, dst_dir_fd=fd)

    def unlink(self, name: str, missing_ok: bool = True) -> None:
        """Delete ``name`` from this folder (a link is deleted, never followed; a folder is
        refused)."""
        (name,) = _parts(name)
        fd = self._held(False)
        try:
            if fd is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", str(self.path / name))
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def lock_file(self, name: str) -> int:
        """A read-write descriptor of regular file ``name`` (created if missing, never
        through a link), for a lock held with ``flock``; the caller closes it."""
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | _CLOEXEC, 0o666, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _link_error(self.path / name) from None
            raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise _not_regular(self.path / name, mode)
        return fd


def _regular_reader(fd: int, shown: str | os.PathLike[str], what: str = "") -> BinaryIO:
    """``fd`` (opened with ``O_NONBLOCK``) as a blocking binary reader if it is a regular
    file; else closed and refused (:class:`NotARegularFile`)."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(shown, mode, what)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def open_regular(path: str | os.PathLike[str], what: str = "") -> BinaryIO:
    """A binary file object reading the user's file ``path`` (``--docs``, a TOML file, a
    store's part): links the user made are followed, but a device, FIFO, socket or folder is
    refused in one line naming ``what`` (the flag) and the path, without blocking on it."""
    return _regular_reader(os.open(path, _READ_FLAGS), path, what)


def check_regular(path: str | os.PathLike[str], what: str = "") -> None:
    """Refuse ``path`` if it exists and is not a regular file (links followed), without
    opening it: what a command checks before it runs."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise _not_regular(path, mode, what)


def _folder_of(root: str | os.PathLike[str] | OutputDir) -> OutputDir:
    return root if isinstance(root, OutputDir) else OutputDir(root)


@contextlib.contextmanager
def _held_parent(root: str | os.PathLike[str] | OutputDir, relative: str | os.PathLike[str]
                 ) -> Iterator[tuple[OutputDir, str]]:
    """The held folder of ``root/relative`` and the file's name; a folder opened here (from a
    path) is let go afterwards."""
    parts = _parts(relative)
    folder = _folder_of(root)
    try:
        yield (folder.subdir(PurePosixPath(*parts[:-1])) if len(parts) > 1 else folder,
               parts[-1])
    finally:
        if folder is not root:
            folder.close()


def make_folder(root: str | os.PathLike[str] | OutputDir,
                relative: str | os.PathLike[str] | None = None) -> Path:
    """Create ``root`` (and ``root/relative``) unless present, refusing links; returns it."""
    folder = _folder_of(root)
    try:
        target = folder if relative is None else folder.subdir(relative)
        target.fd  # noqa: B018 - opened, made if missing
        return target.path
    finally:
        if folder is not root:
            folder.close()


@contextlib.contextmanager
def writing(root: str | os.PathLike[str] | OutputDir, relative: str | os.PathLike[str], *,
            exclusive: bool = False) -> Iterator[BinaryIO]:
    """A binary file object for ``root/relative`` (folders on the way made), through
    :meth:`OutputDir.open_file`; ``root`` a held folder or a path."""
    with _held_parent(root, relative) as (folder, name), \
            folder.open_file(name, exclusive=exclusive) as handle:
        yield handle


def write_bytes(root: str | os.PathLike[str] | OutputDir, relative: str | os.PathLike[str],
                data: bytes, *, exclusive: bool = False) -> Path:
    """Write ``data`` to ``root/relative`` through :func:`writing`; returns the path."""
    with writing(root, relative, exclusive=exclusive) as handle:
        handle.write(data)
    return Path(root, relative)


def write_text(root: str | os.PathLike[str] | OutputDir, relative: str | os.PathLike[str],
               text: str, *, exclusive: bool = False) -> Path:
    """Write ``text`` as UTF-8 to ``root/relative`` through :func:`writing`; returns the path."""
    return write_bytes(root, relative, text.encode("utf-8"), exclusive=exclusive)


@contextlib.contextmanager
def writing_to(target: str | os.PathLike[str] | FileIn) -> Iterator[BinaryIO]:
    """A binary file object for a file the user named (``--figure``, ``--report``: its
    folder is the root, made if missing) or a :class:`FileIn` of a held folder."""
    if isinstance(target, FileIn):
        with target.folder.open_file(target.name) as handle:
            yield handle
        return
    path = Path(target)
    with writing(path.parent, path.name) as handle:
        yield handle


def write_file(target: str | os.PathLike[str] | FileIn, data: bytes) -> Path | FileIn:
    """Write ``data`` through :func:`writing_to`; returns where (a path, or the
    :class:`FileIn`)."""
    with writing_to(target) as handle:
        handle.write(data)
    return target if isinstance(target, FileIn) else Path(target)


def open_for_reading(path: str | os.PathLike[str] | FileIn) -> int | None:
    """A read-only descriptor of regular file ``path`` unless it is missing (None); a link,
    device, FIFO or socket is refused (without blocking)."""
    if isinstance(path, FileIn):
        handle = path.folder.open_read(path.name)
        return None if handle is None else _descriptor(handle)
    try:
        fd = os.open(path, _READ_FLAGS | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_error(Path(path)) from None
        raise
    return _descriptor(_regular_reader(fd, path))


def _descriptor(handle: BinaryIO) -> int:
    """A descriptor of ``handle``'s file, which is closed (the caller closes the copy)."""
    with handle:
        return os.dup(handle.fileno())


def readable_stem(text: str, limit: int = 60) -> str:
    """``text`` as the readable part of a file name kvdrift writes: each run of characters
    other than ASCII letters, digits, ``.``, ``_`` and ``-`` as ``_``, at most ``limit`` long,
    and never starting with ``.`` or ``_``: a hidden name the readers skip as a temporary (an
    action named ``.vnorm`` wrote records no one read, issue 52), and a name pandas, pyarrow's
    datasets and Spark skip as metadata (``_vnorm__d0-....parquet``). Callers add a digest, so
    the stem needs no more to stay unique; one with nothing else left is ``unit``."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:limit]
    return stem.lstrip("._") or "unit"
