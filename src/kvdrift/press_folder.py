"""What may lie beside a presses file, and which code it imports kvdrift runs: checked first.

Before a presses file (:mod:`kvdrift.user_presses`) runs, its folder is checked, without
importing anything heavy (no torch), and refused in one line for:

- **a module beside it named like the standard library's or an installed one** (``json.py``,
  ``statistics.py``, a package ``numpy/``, ``torch.py``): every module or package importable
  beside the file (``NAME.py``, ``NAME/__init__.py``) is checked, imported by the file or not,
  since the folder may be on ``sys.path`` too (``python -m kvdrift.cli`` run from it) and then
  kvdrift's own ``import statistics`` would run it. Rename it;
- **bytecode with no source** (``NAME.pyc`` with no ``NAME.py``, or ``__pycache__/NAME.pyc``,
  importable as ``__pycache__.NAME``): kvdrift runs the user's code only from source, digested;
- **a folder others can write** (:mod:`kvdrift.loose_folders`, the rule of the cache root):
  the file's folder writable by its group or others (the sticky bit does not help here: others
  could still add a module the file imports), a folder above it writable by others without
  the sticky bit, or the file itself writable by its group or others. The same holds for
  every module file its code imports, checked as it is found.

While the file runs (:mod:`kvdrift.press_source`), the code it imports that is the user's own
(:func:`is_user_code`: a module whose file lies outside the standard library's and
site-packages' folders and belongs to no installed distribution, e.g. on ``PYTHONPATH`` or in
the working directory) runs from its bytes and joins the press's identity; such a module that
is compiled only (a sourceless ``.pyc``, an extension) is refused (:func:`check_source`).
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.metadata
import os
import site
import sys
import sysconfig
from pathlib import Path

from kvdrift.loose_folders import loose_folder

#: Top-level names of the standard library (and modules built into the interpreter).
STDLIB = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)
#: kvdrift itself: its code is named by its version, never digested as the user's.
OWN = "kvdrift"


class PressRefused(ValueError):
    """Code beside or imported by a presses file that kvdrift will not run (one line)."""


@functools.cache
def installed_names() -> frozenset[str]:
    """Top-level names of every installed distribution (editable installs included); read once,
    only when a module's place alone does not tell (reading them takes a while)."""
    return frozenset(importlib.metadata.packages_distributions())


@functools.cache
def site_folders() -> tuple[str, ...]:
    """The real folders of site-packages (installed distributions)."""
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("purelib", "platlib") if k in paths}
    found.update(site.getsitepackages())
    found.add(site.getusersitepackages())
    return tuple(sorted({os.path.realpath(p) for p in found}))


@functools.cache
def library_folders() -> tuple[str, ...]:
    """The real folders of the standard library and of site-packages."""
    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths}
    return tuple(sorted(stdlib | set(site_folders())))


def _within(path: str, folders: tuple[str, ...]) -> bool:
    real = os.path.realpath(path)
    return any(real == f or real.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def is_user_code(fullname: str, origin: str) -> bool:
    """Whether module ``fullname``, found at file ``origin``, is the user's own code: not the
    standard library, not kvdrift, not in site-packages, not an installed distribution's."""
    top = fullname.partition(".")[0]
    if top in STDLIB or top == OWN or _within(origin, library_folders()):
        return False
    return top not in installed_names()


def check_source(fullname: str, spec: importlib.machinery.ModuleSpec) -> None:
    """Refuse the user's module ``fullname`` unless Python source will run it (a ``.pyc``
    with no source, or a compiled extension, cannot be read or digested as code)."""
    if not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
        origin = str(spec.origin)
        kind = "not a Python source file (.py) kvdrift reads"
        if origin.endswith(".pyc"):
            kind = "bytecode with no source"
        elif origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            kind = "a compiled module"
        raise PressRefused(f"{spec.origin} ({fullname!r}, imported by your presses' code) is "
                           f"{kind}; kvdrift runs your code only from Python source (.py)")


def check_loose(path: Path, module: bool = False) -> None:
    """Refuse ``path`` (the presses file, or a ``module`` its code imports) if others could
    replace it or add a module beside it: the file itself writable by its group or others,
    or its folder loose (:func:`~kvdrift.loose_folders.loose_folder`, the rule of the
    converted-weights cache root, with the sticky bit no help for the file's own folder)."""
    name = f"{path} (a module your presses import)" if module else "the file"
    mode = os.stat(path).st_mode
    if mode & 0o022:
        raise PressRefused(f"{name} is writable by its group or others (mode "
                           f"{mode & 0o7777:04o}), so anyone could replace the code kvdrift "
                           f"runs; make it private (chmod go-w {path})")
    for folder in dict.fromkeys([path.parent, Path(os.path.realpath(path)).parent]):
        loose = loose_folder(folder, sticky_here=False)
        if loose is not None:
            raise PressRefused(f"{name + ': ' if module else ''}{loose.phrase()}, so anyone "
                               f"could replace the code kvdrift runs; make it private (chmod "
                               f"go-w {loose.folder}) or move {name} to a private folder")


def check_folder(path: Path) -> None:
    """The checks on a presses file's folder before it runs (module docstring)."""
    check_loose(path)
    folder = path.parent
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        name, stem = entry.name, entry.name.rpartition(".")[0]
        if name.endswith(".pyc") and stem.isidentifier() and entry.is_file() \
                and not (folder / f"{stem}.py").exists():
            _refuse_bytecode(path, name)
        elif name == "__pycache__" and entry.is_dir():
            for inner in sorted(os.listdir(entry.path)):
                if inner.endswith(".pyc") and inner[:-4].isidentifier():
                    _refuse_bytecode(path, f"__pycache__/{inner}")
        module = _module_beside(folder, entry)
        if module is not None:
            what = shadowed(module[0], module[1], folder)
            if what is not None:
                raise PressRefused(f"{module[2]} beside it would shadow {what} (kvdrift and its "
                                   f"libraries import that name); rename {module[2]}")


def _refuse_bytecode(path: Path, name: str) -> None:
    raise PressRefused(f"{name} beside it is bytecode with no source; kvdrift runs your code "
                       f"only from Python source (.py): remove {name}")


def _module_beside(folder: Path, entry: os.DirEntry) -> tuple[str, Path, str] | None:
    """``(module name, its file, how to name it)`` if ``entry`` is a module or package that
    an import beside the presses file finds (``NAME.py``, ``NAME/__init__.py``)."""
    name = entry.name
    if name.endswith(".py") and name[:-3].isidentifier() and entry.is_file():
        return name[:-3], Path(entry.path), name
    if name.isidentifier() and entry.is_dir() and (folder / name / "__init__.py").is_file():
        return name, folder / name / "__init__.py", f"{name}/"
    return None


def shadowed(name: str, file: Path, folder: Path) -> str | None:
    """What the module ``name`` beside the presses file (at ``file``) would shadow, as a
    phrase, or None: the standard library's, a module already loaded from another file, or
    an installed one found outside ``folder`` (on ``sys.path``, by an import hook, a
    distribution's namespace package). A module of the user's own of that name elsewhere is
    no conflict: the presses file's code gets the one beside it, kvdrift imports neither."""
    if name in STDLIB:
        return f"the standard library's module {name!r}"
    loaded = sys.modules.get(name)
    where = getattr(loaded, "__file__", None)
    if loaded is not None and not (where and os.path.realpath(where) == os.path.realpath(file)):
        return f"the module {name!r} already loaded ({where or 'built in'})"
    real = os.path.realpath(folder)
    elsewhere = [p for p in sys.path if os.path.realpath(p or ".") != real]
    spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
    if spec is not None and spec.origin and spec.has_location \
            and not is_user_code(name, spec.origin):  # the user's own: the sibling wins
        if not _within(spec.origin, site_folders()):  # ``test``: not in stdlib_module_names
            return f"the standard library's module {name!r}"
        return f"the installed module {name!r} ({spec.origin})"
    for finder in sys.meta_path:  # an editable install's hook, say
        if not isinstance(finder, type) and type(finder).__module__ != "kvdrift.press_source":
            found = getattr(finder, "find_spec", lambda *_: None)(name, None)
            if found is not None and not (found.origin and _within(found.origin, (real,))):
                # (pytest's assertion hook finds the sibling itself: that is no library)
                return f"the installed module {name!r} ({found.origin or 'an import hook'})"
    if spec is not None and name in installed_names():  # a namespace package
        return f"the installed package {name!r}"
    return None


__all__ = ["OWN", "STDLIB", "PressRefused", "check_folder", "check_loose", "check_source",
           "installed_names", "is_user_code", "library_folders", "shadowed", "site_folders"]
