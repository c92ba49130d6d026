"""One writer per store: an exclusive lock on ``<store>/.lock`` held for a whole run.

The lock is an ``fcntl.flock`` on a file in the store directory, so it is released by the
kernel when its holder exits, however it exits (a killed process leaves no stale lock); the
file holds the holder's process id, so a second process can say who holds it. The file is
opened through the store's held folder (:class:`kvdrift.output.OutputDir`), never through a
link, and only as a regular file.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from kvdrift.output import OutputDir, open_for_reading

LOCK_FILE = ".lock"


class StoreBusy(ValueError):
    """Another process holds the store's lock."""


class StoreLock:
    """An exclusive, non-blocking lock on a store directory; a context manager.

    Raises :class:`StoreBusy` (one line naming the holder's PID) when another process (or
    another lock in this process) holds it.
    """

    def __init__(self, root: str | Path | OutputDir):
        # a path is read as the user names it (links above .lock followed); taking the lock
        # opens it as an output folder (never a link), unless a held folder was given
        self.dir = root if isinstance(root, OutputDir) else OutputDir(root, create=False)
        self.root = Path(root)
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.root / LOCK_FILE

    def acquire(self) -> StoreLock:
        folder = self.dir if self.dir.create else OutputDir(self.root)
        fd = folder.lock_file(LOCK_FILE)  # never through a link (kvdrift.output)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise self._busy(holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def _busy(self, holder: str) -> StoreBusy:
        return StoreBusy(f"{self.root} is being written by another kvdrift process (PID "
                         f"{holder}); wait for it to finish, or use another output directory")

    def refuse_if_busy(self) -> None:
        """Raise :class:`StoreBusy` if another process writes the store now; creates nothing,
        so a command can say so before it loads a model (the lock itself is taken later)."""
        holder = self.holder()
        if holder is not None:
            raise self._busy(holder)

    def holder(self) -> str | None:
        """The PID (as text) of another process writing the store now, or None; a reader's
        check that takes no lock and creates no file."""
        fd = open_for_reading(self.dir / LOCK_FILE)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
        finally:
            os.close(fd)  # closing releases a shared lock taken above
        return None

    def wait(self) -> None:
        """Block until no process writes the store (a shared lock, taken and let go)."""
        fd = open_for_reading(self.dir / LOCK_FILE)
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
