"""A presses file runs only from the bytes kvdrift read: never from a bytecode cache planted
beside it, never writing one; the whole file's bytes (and every module beside it that it
imports) are in its presses' identity."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import inspect
import os
import py_compile
from pathlib import Path

import pytest

from kvdrift.user_presses import load_presses_file

PRESS = """from dataclasses import dataclass
from kvpress import ScorerPress

TAG = {tag!r}


def helper(values):
    return values.norm(dim=-1)


@dataclass
class TagPress(ScorerPress):
    compression_ratio: float = 0.5

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return helper(values)


PRESSES = {{"tagged": TagPress()}}
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _plant_bytecode(path: Path, text: str) -> Path:
    """Compile ``text`` into ``path``'s bytecode cache with a header matching ``path`` (its
    mtime and size): Python's source loader would run it instead of the file."""
    real = path.stat()
    decoy = path.with_name("decoy.py")
    decoy.write_text(text)
    assert decoy.stat().st_size == real.st_size  # a header checks the size ...
    os.utime(decoy, ns=(real.st_atime_ns, real.st_mtime_ns))  # ... and the mtime
    cached = Path(importlib.util.cache_from_source(str(path)))
    py_compile.compile(str(decoy), cfile=str(cached), doraise=True)
    decoy.unlink()
    return cached


def test_a_planted_bytecode_file_never_runs_and_none_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.dont_write_bytecode", False)
    path = _write(tmp_path / "mine.py", PRESS.format(tag="real"))
    cached = _plant_bytecode(path, PRESS.format(tag="evil"))
    # the plant is live: Python's own source loader runs it instead of the file
    loader = importlib.machinery.SourceFileLoader("planted_check", str(path))
    planted = importlib.util.module_from_spec(importlib.util.spec_from_loader("planted_check",
                                                                              loader))
    loader.exec_module(planted)
    assert planted.TAG == "evil"

    press = load_presses_file(path).presses["tagged"]
    module = inspect.getmodule(type(press))
    assert module.TAG == "real"
    assert sorted(p.name for p in cached.parent.iterdir()) == [cached.name]  # nothing written

    fresh = _write(tmp_path / "clean" / "mine.py", PRESS.format(tag="clean"))
    load_presses_file(fresh)
    assert sorted(p.name for p in fresh.parent.iterdir()) == ["mine.py"]  # no __pycache__


def test_the_identity_digests_the_whole_file_that_ran(tmp_path):
    from kvdrift.lm.actions.identity import identity_changes, press_identity

    path = _write(tmp_path / "a" / "mine.py", PRESS.format(tag="one"))
    first = press_identity(load_presses_file(path).presses["tagged"])
    assert first["modules"] == {"kvdrift_presses_mine": _sha(path)}

    path.write_text(PRESS.format(tag="one").replace("values.norm(dim=-1)",
                                                     "-values.norm(dim=-1)"))
    edited = press_identity(load_presses_file(path).presses["tagged"])  # the class unchanged
    assert edited["modules"] == {"kvdrift_presses_mine": _sha(path)}
    assert edited["source"] != first["source"]
    assert identity_changes(first, edited) == (
        "source of kvdrift_presses_mine.TagPress changed (modules: kvdrift_presses_mine "
        "changed)")

    path.write_text(PRESS.format(tag="one"))  # the same bytes again: the same identity
    assert press_identity(load_presses_file(path).presses["tagged"]) == first


def test_the_source_shown_is_the_bytes_that_ran(tmp_path):
    path = _write(tmp_path / "mine.py", PRESS.format(tag="ran"))
    press = load_presses_file(path).presses["tagged"]
    path.write_text(PRESS.format(tag="later").replace("return helper", "return 2 * helper"))
    assert inspect.getsource(type(press).score).strip().endswith("return helper(values)")


HELPER_PRESS = """from helpers import TagPress
from tools.scale import factor

PRESSES = {"tagged": TagPress(compression_ratio=factor())}
"""


def _helper_folder(folder: Path, tag: str) -> Path:
    _write(folder / "helpers.py", PRESS.format(tag=tag).split("PRESSES")[0])
    _write(folder / "tools" / "__init__.py", "")
    _write(folder / "tools" / "scale.py", "def factor():\n    return 0.25\n")
    return _write(folder / "mine.py", HELPER_PRESS)


def test_modules_beside_the_file_load_from_their_bytes_and_join_the_identity(tmp_path):
    from kvdrift.lm.actions.identity import identity_changes, press_identity

    path = _helper_folder(tmp_path / "a", "one")
    press = load_presses_file(path).presses["tagged"]
    assert press.compression_ratio == 0.25 and type(press).__module__ == "helpers"
    identity = press_identity(press)
    folder = path.parent
    assert identity["modules"] == {
        "helpers": _sha(folder / "helpers.py"), "kvdrift_presses_mine": _sha(path),
        "tools": _sha(folder / "tools" / "__init__.py"),
        "tools.scale": _sha(folder / "tools" / "scale.py")}
    assert not list(folder.rglob("__pycache__"))

    other = _helper_folder(tmp_path / "b", "two")  # another folder, its own helpers.py
    second = press_identity(load_presses_file(other).presses["tagged"])
    assert second["modules"]["helpers"] == _sha(other.parent / "helpers.py") \
        != identity["modules"]["helpers"]
    assert second["modules"]["kvdrift_presses_mine"] == identity["modules"]["kvdrift_presses_mine"]
    assert identity_changes(identity, second) == ("source of helpers.TagPress changed "
                                                  "(modules: helpers changed)")
    assert press_identity(press) == identity  # the first press still names its own code


def test_an_error_in_a_module_beside_the_file_names_that_module(tmp_path):
    path = _helper_folder(tmp_path, "x")
    (tmp_path / "tools" / "scale.py").write_text("def factor(:\n")
    with pytest.raises(ValueError, match="^[^\n]*$") as info:
        load_presses_file(path)
    assert f"presses file {path} raised SyntaxError (scale.py line 1)" in str(info.value)
    (tmp_path / "tools" / "scale.py").write_text("def factor():\n    raise KeyError('k')\n")
    with pytest.raises(ValueError, match="^[^\n]*$") as info:
        load_presses_file(path)
    assert f"presses file {path} raised KeyError (scale.py line 2)" in str(info.value)


def test_a_module_beside_the_file_that_an_imported_module_shadows_is_refused(tmp_path):
    """``json.py`` beside the file: ``import json`` would silently give the standard library's
    (already loaded), so the file is refused in one line, before it runs, naming both
    (tests/test_presses_isolation.py holds every kind of such name)."""
    _write(tmp_path / "json.py", "MINE = True\n")
    path = _write(tmp_path / "mine.py", "import json\n" + PRESS.format(tag="x"))
    with pytest.raises(ValueError, match="^[^\n]*$") as info:
        load_presses_file(path)
    assert str(info.value) == (
        f"presses file {path}: json.py beside it would shadow the standard library's module "
        f"'json' (kvdrift and its libraries import that name); rename json.py")


def test_a_helper_edited_between_run_and_resume_is_refused(tiny_model_dir, tmp_path):
    """The store's records are never mixed: a run with a press from a module beside the
    presses file, then a resume after only that module's helper changed, is refused in one
    line naming the module; nothing is written."""
    from typer.testing import CliRunner

    from kvdrift.cli import app
    from kvdrift.data import Document, write_jsonl

    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id="d0", prompt="Note. " + "The cat sat on the mat. " * 12)], docs)
    path = _helper_folder(tmp_path / "p", "one")
    out = tmp_path / "run"
    args = ["run", "--model", str(tiny_model_dir), "--docs", str(docs), "--actions", "tagged",
            "--replicates", "2", "--horizon", "3", "--out", str(out), "--presses", str(path)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    recorded = (out / "run.json").read_text()
    assert _sha(path.parent / "helpers.py") in recorded  # the module's digest, in the identity
    def written():  # every file of the store but its lock (taken by every command)
        return {f: f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file()
                and f.name != ".lock"}

    files = written()

    helpers = path.parent / "helpers.py"
    helpers.write_text(helpers.read_text().replace("return values.norm(dim=-1)",
                                                   "return -values.norm(dim=-1)"))
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2, again.output
    assert "Traceback" not in again.output
    assert "source of helpers.TagPress changed (modules: helpers changed)" in " ".join(
        again.output.split())
    assert written() == files and len(files) > 2
    assert not list(path.parent.rglob("__pycache__"))
