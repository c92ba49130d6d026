"""Folders others can write: where kvdrift trusts nothing it would load and runs no code.

A folder writable by its group or by others lets them replace what lies in it; a folder above
it writable by others lets them rename it away and put another in its place. The sticky bit
(as on ``/tmp``) stops both: only an entry's owner may rename or delete it. One rule refuses
the converted-weights cache root (:mod:`kvdrift.lm.loading.converted_cache`) and the folders
of a presses file and of the code it imports (:mod:`kvdrift.press_folder`). The sticky bit
does not stop others from *adding* an entry, which is harmless in a cache root (kvdrift reads
only the files it sealed) but not where Python finds modules by name, so the folder of code is
refused writable by others even with the sticky bit (``sticky_here=False``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Loose:
    """A folder others can write: which one, by whom, and its mode."""

    folder: Path
    whom: str  # "its group or others" (the folder itself) or "others" (a folder above)
    mode: int

    def phrase(self) -> str:
        """``F is writable by others (mode 0777, no sticky bit)``."""
        sticky = "others can add files to it" if self.mode & stat.S_ISVTX else "no sticky bit"
        return f"{self.folder} is writable by {self.whom} (mode {self.mode:04o}, {sticky})"


def loose_folder(path: str | os.PathLike[str], sticky_here: bool = True) -> Loose | None:
    """The first folder that makes ``path`` loose: ``path`` itself writable by its group or
    others (without the sticky bit, unless not ``sticky_here``), or any real folder above it
    writable by others, without the sticky bit (module docstring); a folder not yet made is
    checked from its first existing parent."""
    path = Path(os.path.realpath(Path(path).parent)) / Path(path).name  # the real folders above
    for level, folder in enumerate([path, *path.parents]):
        try:
            info = os.stat(folder)
        except FileNotFoundError:
            continue
        loose = 0o022 if level == 0 else 0o002
        sticky = info.st_mode & stat.S_ISVTX and (sticky_here or level > 0)
        if info.st_mode & loose and not sticky:
            whom = "its group or others" if info.st_mode & 0o022 and level == 0 else "others"
            return Loose(folder, whom, stat.S_IMODE(info.st_mode))
    return None


__all__ = ["Loose", "loose_folder"]
