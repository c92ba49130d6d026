"""A presses file's code: run only from the bytes kvdrift read, with the modules it imports.

A presses file (:mod:`kvdrift.user_presses`) is read once through the output boundary's
regular-file open (:func:`kvdrift.output.open_regular`: a FIFO or device is refused without
blocking), compiled from those bytes and executed; Python's source loader is never used, so no
bytecode cache (``__pycache__``) is ever read instead of the file, and none is written beside
it. The file may import modules that lie beside it (``import helpers`` finds ``helpers.py`` or
the package ``helpers/`` in the file's folder, as a script would) and the user's own modules
elsewhere (on ``PYTHONPATH``, in the working directory: :func:`kvdrift.press_folder.
is_user_code`): they are read and compiled the same way, while the file runs (a module
imported only later, inside a function, is not found there). Only imports asked for by that
code are answered so (:class:`LocalModules`): kvdrift's and the libraries' own imports never
resolve to the presses file's folder, and what may lie there is checked before anything runs
(:mod:`kvdrift.press_folder`).

Every module run this way carries, in its globals, the SHA-256 of its own bytes
(:data:`SOURCE_KEY`) and the SHA-256 of every module of the same presses file, the file itself
included (:data:`MODULES_KEY`, by module name), so a press's identity
(:mod:`kvdrift.lm.actions.identity`) digests the code that ran, not a file read again later.
The source shown in tracebacks and by :func:`inspect.getsource` is those bytes too.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import sys
import types
from collections.abc import Sequence
from pathlib import Path

from kvdrift.output import open_regular
from kvdrift.press_folder import check_loose, check_source, is_user_code

#: A module global: the SHA-256 of the bytes its code was compiled from.
SOURCE_KEY = "__kvdrift_source__"
#: A module global: module name -> SHA-256, for every module of the same presses file.
MODULES_KEY = "__kvdrift_modules__"
#: The largest presses file or module beside it that is read (source code, not data).
MAX_SOURCE_BYTES = 16 * 2**20

_local_names: set[str] = set()  # modules loaded beside a presses file, in sys.modules


def read_source(path: Path, what: str = "--presses") -> bytes:
    """The bytes of the Python file ``path``, read once (a regular file, at most
    :data:`MAX_SOURCE_BYTES`)."""
    with open_regular(path, what) as handle:
        data = handle.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise ValueError(f"{what} {path}: a presses file (or a module beside it) must be at "
                         f"most {MAX_SOURCE_BYTES // 2**20} MiB of Python source")
    return data


def run_source(module: types.ModuleType, data: bytes, path: Path,
               modules: dict[str, str]) -> None:
    """Compile ``data`` (the bytes of ``path``) and run it as ``module``, recording its digest
    in ``modules`` and in the module's globals (module docstring)."""
    digest = hashlib.sha256(data).hexdigest()
    modules[module.__name__] = digest
    module.__file__ = str(path)
    setattr(module, SOURCE_KEY, digest)
    setattr(module, MODULES_KEY, modules)  # one dict, shared: complete once the file has run
    text = importlib.util.decode_source(data)
    linecache.cache[str(path)] = (len(data), None, text.splitlines(keepends=True), str(path))
    code = compile(data, str(path), "exec", dont_inherit=True)
    exec(code, module.__dict__)  # noqa: S102 - the user's presses file, named by the user


class _BytesLoader(importlib.abc.Loader):
    """Runs the user's module from the bytes read once (no bytecode cache), once its file and
    folder pass :func:`~kvdrift.press_folder.check_loose`."""

    def __init__(self, path: Path, modules: dict[str, str]) -> None:
        self.path, self.modules = path, modules

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        check_loose(self.path, module=True)
        run_source(module, read_source(self.path, "a module your presses import"), self.path,
                   self.modules)


#: The import system's own modules: frames of theirs are skipped to find who imports.
_IMPORT_SYSTEM = frozenset({"importlib", "importlib._bootstrap", "importlib._bootstrap_external",
                            "importlib.util", "importlib.machinery", __name__})


def asked_by(modules: dict[str, str]) -> bool:
    """Whether the import being found was asked for by code kvdrift ran for the presses file
    whose modules are ``modules`` (its frame's globals hold that very dict), not by kvdrift or
    a library (the import system's own frames skipped)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _IMPORT_SYSTEM:
        frame = frame.f_back
    return frame is not None and frame.f_globals.get(MODULES_KEY) is modules


class LocalModules(importlib.abc.MetaPathFinder):
    """While a presses file runs, finds the modules its own code imports (and that code's
    imports in turn): first beside the file (as a script's folder comes first on its path),
    then the user's code elsewhere (:func:`~kvdrift.press_folder.is_user_code`), each run by
    :class:`_BytesLoader`. An import asked for by kvdrift or a library is never answered
    (:func:`asked_by`), so ``statistics.py`` beside the file is not what they get."""

    def __init__(self, folder: Path, modules: dict[str, str]) -> None:
        self.folder, self.modules = folder, modules
        self.packages: set[str] = set()  # folders of the user's packages (their submodules)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        head, _, last = fullname.rpartition(".")
        if not last.isidentifier():
            return None
        ours = [Path(p) for p in (path or ()) if p in self.packages] if head else []
        if not ours and not asked_by(self.modules):
            return None  # kvdrift's or a library's import: Python's own finders answer
        for folder in ours or ([] if head else [self.folder]):
            for candidate, is_package in ((folder / f"{last}.py", False),
                                          (folder / last / "__init__.py", True)):
                if candidate.is_file():
                    return self._spec(fullname, candidate, is_package)
        if ours:  # in a package of the user's, but no source: a .pyc, an extension
            found = importlib.machinery.PathFinder.find_spec(fullname, [str(p) for p in ours])
            if found is not None and found.has_location:
                check_source(fullname, found)
            return None
        found = importlib.machinery.PathFinder.find_spec(fullname, path)
        if found is None or not found.has_location or not found.origin \
                or not is_user_code(fullname, found.origin):
            return None  # not the user's code (or a namespace package: its modules come here)
        check_source(fullname, found)
        return self._spec(fullname, Path(found.origin),
                          found.submodule_search_locations is not None)

    def _spec(self, fullname: str, file: Path, is_package: bool
              ) -> importlib.machinery.ModuleSpec | None:
        spec = importlib.util.spec_from_loader(fullname, _BytesLoader(file, self.modules),
                                               origin=str(file), is_package=is_package)
        if is_package and spec is not None:
            spec.submodule_search_locations = [str(file.parent)]
            self.packages.add(str(file.parent))
        _local_names.add(fullname)
        return spec


def load(path: Path, name: str, data: bytes) -> types.ModuleType:
    """Run the presses file ``path``, whose bytes :func:`read_source` read as ``data``, as the
    module ``name`` (registered in ``sys.modules`` so
    its classes keep a module), the modules its code imports found by :class:`LocalModules`
    while it runs. Modules of an earlier presses file are forgotten first, so each file runs
    (and digests) its own."""
    forget()
    modules: dict[str, str] = {}
    module = types.ModuleType(name)
    sys.modules[name] = module
    finder = LocalModules(path.parent, modules)
    sys.meta_path.insert(0, finder)
    try:
        run_source(module, data, path, modules)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.meta_path.remove(finder)
    return module


def forget() -> None:
    """Forget the modules run for an earlier presses file (from ``sys.modules``)."""
    for old in sorted(_local_names):
        sys.modules.pop(old, None)
    _local_names.clear()


def module_globals(cls: type) -> dict:
    """The globals of the module that defined ``cls``: those its own functions see (so a
    module forgotten from ``sys.modules`` still answers), else ``sys.modules``'s."""
    for value in vars(cls).values():
        func = getattr(value, "__func__", getattr(value, "fget", value))
        found = getattr(func, "__globals__", None)
        if isinstance(found, dict) and found.get("__name__") == cls.__module__:
            return found
    module = sys.modules.get(cls.__module__)
    return vars(module) if module is not None else {}


__all__ = ["MAX_SOURCE_BYTES", "MODULES_KEY", "SOURCE_KEY", "asked_by", "forget", "load",
           "module_globals", "read_source"]
