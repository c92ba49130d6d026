"""A presses file's code: run only from the bytes kvdrift read, with the modules beside it.

A presses file (:mod:`kvdrift.user_presses`) is read once through the output boundary's
regular-file open (:func:`kvdrift.output.open_regular`: a FIFO or device is refused without
blocking), compiled from those bytes and executed; Python's source loader is never used, so no
bytecode cache (``__pycache__``) is ever read instead of the file, and none is written beside
it. The file may import modules that lie beside it (``import helpers`` finds ``helpers.py`` or
the package ``helpers/`` in the file's folder, as a script would): they are read and compiled
the same way, while the file runs (a module imported only later, inside a function, is not
found there).

Every module run this way carries, in its globals, the SHA-256 of its own bytes
(:data:`SOURCE_KEY`) and the SHA-256 of every module of the same presses file, the file itself
included (:data:`MODULES_KEY`, by module name), so a press's identity
(:mod:`kvdrift.lm.actions.identity`) digests the code that ran, not a file read again later.
The source shown in tracebacks and by :func:`inspect.getsource` is those bytes too.
"""

from __future__ import annotations

import ast
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


def run_source(module: types.ModuleType, data: bytes, path: Path, folder: Path,
               modules: dict[str, str]) -> None:
    """Compile ``data`` (the bytes of ``path``) and run it as ``module``, recording its digest
    in ``modules`` and in the module's globals (module docstring); ``folder`` is the presses
    file's, where the modules beside it lie."""
    digest = hashlib.sha256(data).hexdigest()
    modules[module.__name__] = digest
    module.__file__ = str(path)
    setattr(module, SOURCE_KEY, digest)
    setattr(module, MODULES_KEY, modules)  # one dict, shared: complete once the file has run
    text = importlib.util.decode_source(data)
    linecache.cache[str(path)] = (len(data), None, text.splitlines(keepends=True), str(path))
    tree = ast.parse(data, str(path))  # the bytes, parsed once: checked, then compiled
    _refuse_shadowed(tree, path, folder)
    code = compile(tree, str(path), "exec", dont_inherit=True)
    exec(code, module.__dict__)  # noqa: S102 - the user's presses file, named by the user


def _refuse_shadowed(tree: ast.Module, path: Path, folder: Path) -> None:
    """Refuse an import of a name that is both a module beside the presses file and a module
    already loaded from elsewhere: Python would give the loaded one, silently, and the code
    beside the file would neither run nor be in the identity."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            loaded = sys.modules.get(top)
            beside = [p for p in (folder / f"{top}.py", folder / top / "__init__.py")
                      if p.is_file()]
            if beside and loaded is not None and SOURCE_KEY not in vars(loaded):
                where = getattr(loaded, "__file__", None) or "built in"
                raise ImportError(f"{path.name} line {node.lineno} imports {top!r}, which is "
                                  f"both {beside[0].name} "
                                  f"beside the presses file and a module already loaded "
                                  f"({where}); rename {beside[0].name}")


class _BytesLoader(importlib.abc.Loader):
    """Runs a module beside a presses file from the bytes read once (no bytecode cache)."""

    def __init__(self, path: Path, folder: Path, modules: dict[str, str]) -> None:
        self.path, self.folder, self.modules = path, folder, modules

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        run_source(module, read_source(self.path, "a module beside the presses file"),
                   self.path, self.folder, self.modules)


class LocalModules(importlib.abc.MetaPathFinder):
    """Finds the modules beside a presses file while it runs (first, as a script's folder
    comes first on its path), each run by :class:`_BytesLoader`."""

    def __init__(self, folder: Path, modules: dict[str, str]) -> None:
        self.folder, self.modules = folder, modules
        self.packages: set[str] = set()  # folders of local packages (their submodules)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        head, _, last = fullname.rpartition(".")
        if not last.isidentifier():
            return None
        if head:  # a submodule: only of a local package
            where = [Path(p) for p in (path or ()) if p in self.packages]
        else:
            where = [self.folder]
        for folder in where:
            package = folder / last / "__init__.py"
            for candidate, is_package in ((folder / f"{last}.py", False), (package, True)):
                if candidate.is_file():
                    spec = importlib.util.spec_from_loader(
                        fullname, _BytesLoader(candidate, self.folder, self.modules),
                        origin=str(candidate), is_package=is_package)
                    if is_package and spec is not None:
                        spec.submodule_search_locations = [str(candidate.parent)]
                        self.packages.add(str(candidate.parent))
                    _local_names.add(fullname)
                    return spec
        return None


def load(path: Path, name: str, data: bytes) -> types.ModuleType:
    """Run the presses file ``path``, whose bytes :func:`read_source` read as ``data``, as the
    module ``name`` (registered in ``sys.modules`` so
    its classes keep a module), its folder's modules importable while it runs. Modules beside
    an earlier presses file are forgotten first, so each file runs with its own."""
    for old in sorted(_local_names):
        sys.modules.pop(old, None)
    _local_names.clear()
    modules: dict[str, str] = {}
    module = types.ModuleType(name)
    sys.modules[name] = module
    finder = LocalModules(path.parent, modules)
    sys.meta_path.insert(0, finder)
    try:
        run_source(module, data, path, path.parent, modules)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.meta_path.remove(finder)
    return module


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


__all__ = ["MAX_SOURCE_BYTES", "MODULES_KEY", "SOURCE_KEY", "load", "module_globals",
           "read_source"]
