"""A presses file runs with only the code the user named: what lies beside it never answers
kvdrift's or a library's imports, names of the standard library or of an installed module are
refused before anything runs, the user's code elsewhere joins the press identity, bytecode
with no source never runs, and a folder others can write is refused (issues 61 and 62).

Each test holds a class of hostile folders, not one case: planted code writes a marker file
when it runs, and every refusal is asserted to be one line with the marker never written.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from kvdrift.user_presses import load_presses_file

PRESS = """from dataclasses import dataclass
from kvpress import ScorerPress
{imports}

@dataclass
class TagPress(ScorerPress):
    compression_ratio: float = 0.5

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return {score}


PRESSES = {{"tagged": TagPress({ratio})}}
"""

#: Names a module beside the presses file must not take: the standard library's, and
#: kvdrift's own and its dependencies' (installed top-level modules).
STDLIB = ["statistics", "json", "random", "typing", "dataclasses", "test"]
INSTALLED = ["numpy", "torch", "pandas", "kvpress", "transformers", "typer", "pyarrow",
             "safetensors", "kvdrift"]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _planted(marker: Path, reexport: str = "") -> str:
    """Code that leaves ``marker`` when it runs (and, as a careful plant would, gives the real
    module's names so nothing else notices)."""
    again = f"\nfrom {reexport} import *  # noqa\n" if reexport else ""
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n{again}"


def _presses(folder: Path, imports: str = "", score: str = "values.norm(dim=-1)",
             ratio: str = "0.5", marker: Path | None = None) -> Path:
    ran = _planted(marker) if marker else ""
    return _write(folder / "mine.py", ran + PRESS.format(imports=imports, score=score,
                                                          ratio=ratio))


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("form", ["module", "package"])
@pytest.mark.parametrize("imported", [False, True], ids=["stray", "imported"])
@pytest.mark.parametrize("name", STDLIB + INSTALLED)
def test_a_module_beside_named_like_the_library_is_refused_before_anything_runs(
        tmp_path, name, imported, form):
    """``statistics.py`` (or ``numpy/``) beside the file, imported by it or not: refused in one
    line naming it and saying to rename it, before the presses file or the plant runs."""
    planted, ran = tmp_path / "planted-ran", tmp_path / "presses-ran"
    if form == "module":
        entry = f"{name}.py"
        _write(tmp_path / "p" / entry, _planted(planted, name))
    else:
        entry = f"{name}/"
        _write(tmp_path / "p" / name / "__init__.py", _planted(planted, name))
    path = _presses(tmp_path / "p", f"import {name}" if imported else "", marker=ran)
    with pytest.raises(ValueError) as info:
        load_presses_file(path)
    line = _one_line(info)
    shadowed = (f"the standard library's module {name!r}" if name in STDLIB else
                (f"the installed module {name!r} (", f"the module {name!r} already loaded ("))
    assert line.startswith(f"presses file {path}: {entry} beside it would shadow ")
    assert any(line.startswith(f"presses file {path}: {entry} beside it would shadow {s}")
               for s in ([shadowed] if isinstance(shadowed, str) else shadowed)), line
    assert line.endswith(f"rename {entry}")
    assert not planted.exists() and not ran.exists()


@pytest.mark.parametrize("name", ["statistics", "torch"])
def test_the_refusal_comes_before_torch_is_imported(tmp_path, name):
    """In a fresh interpreter, as ``kvdrift run`` loads it: the refusal needs no torch."""
    planted = tmp_path / "planted-ran"
    _write(tmp_path / "p" / f"{name}.py", _planted(planted))
    path = _presses(tmp_path / "p", f"import {name}")
    script = ("import sys\nfrom kvdrift.user_presses import load_presses_file\n"
              f"try:\n    load_presses_file({str(path)!r})\nexcept ValueError as exc:\n"
              "    print(exc)\nprint('torch' in sys.modules, 'kvpress' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    refusal, imported = done.stdout.strip().splitlines()
    assert refusal.startswith(f"presses file {path}: {name}.py beside it would shadow ")
    assert imported == "False False" and not planted.exists()


def test_the_cli_refuses_a_planted_standard_module_in_one_line(tmp_path):
    """The reported case: ``statistics.py`` beside the presses file once ran when kvdrift's
    planning imported ``statistics`` (a traceback, or rc 0 with a plant that re-exports it)."""
    from typer.testing import CliRunner

    from kvdrift.cli import app

    planted = tmp_path / "planted-ran"
    _write(tmp_path / "p" / "statistics.py", _planted(planted, "statistics"))
    path = _presses(tmp_path / "p")
    result = CliRunner().invoke(app, ["run", "--presses", str(path), "--actions", "tagged",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert "Traceback" not in result.output and "rename statistics.py" in " ".join(lines)
    assert not planted.exists() and not (tmp_path / "out").exists()


def test_modules_beside_answer_only_the_presses_code(tmp_path):
    """A sibling of a legitimate name works for the presses file and for a sibling importing
    another; a library asking for a module beside the file (``pkgutil``, as a probe for an
    optional dependency does) is not answered, during the load or after it."""
    from kvdrift.lm.actions.identity import press_identity

    folder = tmp_path / "p"
    probe = tmp_path / "probe-ran"
    _write(folder / "zz_iso_probe.py", _planted(probe))  # never the presses code's import
    _write(folder / "zz_iso_b.py", "RATIO = 0.25\n")
    _write(folder / "zz_iso_a.py", "from zz_iso_b import RATIO\n\n\ndef ratio():\n"
                                   "    return RATIO\n")
    imports = ("import pkgutil\nfrom zz_iso_a import ratio\n"
               "try:\n    pkgutil.resolve_name('zz_iso_probe')\n    LIBRARY = 'found'\n"
               "except ImportError:\n    LIBRARY = 'not found'\n")
    path = _presses(folder, imports, ratio="ratio()")
    press = load_presses_file(path).presses["tagged"]
    assert press.compression_ratio == 0.25
    module = sys.modules[type(press).__module__]
    assert module.LIBRARY == "not found"
    assert set(press_identity(press)["modules"]) == {"kvdrift_presses_mine", "zz_iso_a",
                                                     "zz_iso_b"}
    assert importlib.util.find_spec("zz_iso_probe") is None  # after the load: not found
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("zz_iso_probe")
    assert not probe.exists()


@pytest.mark.parametrize("where", ["pythonpath", "cwd"])
@pytest.mark.parametrize("defines", ["helper", "class"])
def test_the_users_code_elsewhere_joins_the_identity(tmp_path, monkeypatch, where, defines):
    """A module of the user's own outside the presses folder (on ``PYTHONPATH``, or the
    working directory on ``sys.path`` as ``python -m`` puts it), holding a helper the press
    calls or the press class itself: run from its bytes (no ``__pycache__``) and digested, so
    an edit between run and resume changes the identity the store records."""
    from kvdrift.lm.actions.identity import identity_changes, press_identity

    name = f"zz_iso_user_{where}_{defines}"
    lib = tmp_path / "lib"
    user = _write(lib / f"{name}.py", "def helper(values):\n    return values.norm(dim=-1)\n")
    if defines == "class":
        user.write_text(user.read_text() + PRESS.format(imports="", score="helper(values)",
                                                        ratio="0.5").split("PRESSES")[0])
        path = _write(tmp_path / "p" / "mine.py",
                      f"from {name} import TagPress\nPRESSES = {{'tagged': TagPress(0.5)}}\n")
    else:
        path = _presses(tmp_path / "p", f"from {name} import helper", score="helper(values)")
    if where == "cwd":
        monkeypatch.chdir(lib)
        monkeypatch.syspath_prepend("")
    else:
        monkeypatch.syspath_prepend(str(lib))

    first = press_identity(load_presses_file(path).presses["tagged"])
    assert first["modules"][name] == _sha(user)
    user.write_text(user.read_text().replace("return values.norm", "return -values.norm"))
    edited = press_identity(load_presses_file(path).presses["tagged"])
    assert edited["modules"][name] == _sha(user) != first["modules"][name]
    assert f"(modules: {name} changed)" in identity_changes(first, edited)
    assert not (lib / "__pycache__").exists()


def test_a_user_module_edited_between_run_and_resume_is_refused(tiny_model_dir, tmp_path,
                                                                monkeypatch):
    """End to end: a run whose press calls a module on ``PYTHONPATH``, then a resume after
    only that module changed, is refused in one line naming it; nothing is written."""
    from typer.testing import CliRunner

    from kvdrift.cli import app
    from kvdrift.data import Document, write_jsonl

    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id="d0", prompt="Note. " + "The cat sat on the mat. " * 12)], docs)
    lib = tmp_path / "lib"
    user = _write(lib / "zz_iso_resume.py", "def helper(values):\n"
                                            "    return values.norm(dim=-1)\n")
    monkeypatch.syspath_prepend(str(lib))
    path = _presses(tmp_path / "p", "from zz_iso_resume import helper", score="helper(values)")
    out = tmp_path / "run"
    args = ["run", "--model", str(tiny_model_dir), "--docs", str(docs), "--actions", "tagged",
            "--replicates", "2", "--horizon", "3", "--out", str(out), "--presses", str(path)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert _sha(user) in (out / "run.json").read_text()
    files = {f: f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file() and f.name != ".lock"}

    user.write_text(user.read_text().replace("return values", "return -values"))
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2, again.output
    assert "Traceback" not in again.output
    assert "(modules: zz_iso_resume changed)" in " ".join(again.output.split())
    assert {f: f.stat().st_mtime_ns for f in out.rglob("*")
            if f.is_file() and f.name != ".lock"} == files


def _compile_to(source: str, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    src = target.with_name("compiled_from.py")
    src.write_text(source)
    py_compile.compile(str(src), cfile=str(target), doraise=True)
    src.unlink()
    return target


@pytest.mark.parametrize("place", ["beside", "pycache", "package", "pythonpath"])
def test_bytecode_with_no_source_never_runs(tmp_path, monkeypatch, place):
    """A ``.pyc`` with no ``.py``: beside the file (``helpers.pyc``, or ``__pycache__/
    helpers.pyc``, importable as ``__pycache__.helpers``) refused before anything runs; in a
    package beside it or on ``PYTHONPATH``, refused as the presses code imports it. One line,
    and the compiled code never runs."""
    planted = tmp_path / "planted-ran"
    folder, lib = tmp_path / "p", tmp_path / "lib"
    code = _planted(planted) + "RATIO = 0.25\n"
    target, module = {
        "beside": (folder / "zz_iso_c.pyc", "zz_iso_c"),
        "pycache": (folder / "__pycache__" / "zz_iso_c.pyc", "__pycache__.zz_iso_c"),
        "package": (folder / "zz_iso_pkg" / "sub.pyc", "zz_iso_pkg.sub"),
        "pythonpath": (lib / "zz_iso_c_lib.pyc", "zz_iso_c_lib")}[place]
    _compile_to(code, target)
    if place == "package":
        _write(folder / "zz_iso_pkg" / "__init__.py", "")
    monkeypatch.syspath_prepend(str(lib))
    path = _presses(folder, f"from {module} import RATIO", ratio="RATIO")
    with pytest.raises(ValueError) as info:
        load_presses_file(path)
    line = _one_line(info)
    if place in ("beside", "pycache"):
        name = target.relative_to(folder)
        assert line == (f"presses file {path}: {name} beside it is bytecode with no source; "
                        f"kvdrift runs your code only from Python source (.py): remove {name}")
    else:
        assert line == (f"presses file {path}: {target} ({module!r}, imported by your presses' "
                        f"code) is bytecode with no source; kvdrift runs your code only from "
                        f"Python source (.py)")
    assert not planted.exists()


@pytest.mark.parametrize(("layout", "modes", "loose"), [
    ("folder", {"p": 0o777}, ("p", "its group or others", "0777, no sticky bit")),
    ("folder", {"p": 0o775}, ("p", "its group or others", "0775, no sticky bit")),
    ("folder", {"p": 0o757}, ("p", "its group or others", "0757, no sticky bit")),
    ("folder", {"p": 0o1777}, ("p", "its group or others", "1777, others can add files to it")),
    ("above", {"open": 0o777}, ("open", "others", "0777, no sticky bit")),
    ("above", {"open": 0o1777}, None),  # sticky above: nobody can rename the folder away
    ("above", {"open": 0o775}, None),  # a folder above, writable by its group only
    ("package", {"p/zz_iso_tools": 0o777},
     ("p/zz_iso_tools", "its group or others", "0777, no sticky bit")),
])
def test_a_folder_others_can_write_is_refused(tmp_path, layout, modes, loose):
    """The cache root's rule (tests/test_hostile_cache.py), for code: the presses file's
    folder (or a package folder it imports) writable by its group or others, the sticky bit no
    help there, or a folder above writable by others without it."""
    from kvdrift.lm.actions.identity import press_identity

    base = tmp_path / "open" if layout == "above" else tmp_path
    planted = tmp_path / "planted-ran"
    _write(base / "p" / "zz_iso_tools" / "__init__.py", _planted(planted) + "RATIO = 0.25\n")
    path = _presses(base / "p", "from zz_iso_tools import RATIO", ratio="RATIO")
    try:
        for folder, mode in modes.items():
            os.chmod(base / folder if layout != "above" else tmp_path / folder, mode)
        if loose is None:
            press = load_presses_file(path).presses["tagged"]
            assert "zz_iso_tools" in press_identity(press)["modules"] and planted.exists()
            return
        with pytest.raises(ValueError) as info:
            load_presses_file(path)
    finally:
        for folder in modes:
            os.chmod(base / folder if layout != "above" else tmp_path / folder, 0o755)
    folder, whom, mode = loose
    where = (tmp_path if layout == "above" else base) / folder
    name = f"{where / '__init__.py'} (a module your presses import)" \
        if layout == "package" else "the file"
    assert _one_line(info) == (
        f"presses file {path}: {name + ': ' if layout == 'package' else ''}{where} is writable "
        f"by {whom} (mode {mode}), so anyone could replace the code kvdrift runs; make it "
        f"private (chmod go-w {where}) or move {name} to a private folder")
    assert not planted.exists()


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o664])
def test_a_presses_file_others_can_write_is_refused(tmp_path, mode):
    ran = tmp_path / "presses-ran"
    path = _presses(tmp_path / "p", marker=ran)
    os.chmod(path, mode)
    with pytest.raises(ValueError) as info:
        load_presses_file(path)
    assert _one_line(info) == (
        f"presses file {path}: the file is writable by its group or others (mode "
        f"{mode:04o}), so anyone could replace the code kvdrift runs; make it private "
        f"(chmod go-w {path})")
    assert not ran.exists()
