"""Hostile folders: links inside the output folder (to files and folders outside it, dangling),
files already there, and settings refused after a first write (issue 40, classes 1, 2 and 8).

Every file kvdrift writes goes through one boundary (:mod:`kvdrift.output`): nothing is ever
written through a link, and a refused command leaves its output folder as it found it. The
property test at the end generates hostile folders with a fixed seed (links to files and
folders outside, dangling links, foreign or damaged files, output folders nested inside a
store, settings refused only once the model is loaded) and runs run, study, report, frontier
and finite-state against them; fixtures live under pytest's tmp_path, with a sentinel folder
outside every output folder whose files are hashed before and after.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvdrift import output
from kvdrift.cli import app

runner = CliRunner()
PROMPT = "The cat sat on the mat. " * 8
LINK_MESSAGE = "is a symbolic link"
#: Stated bound of the property test: a command grows the peak resident memory of the test
#: process by less than this (the tiny model and refusals need tens of MB).
PEAK_GROWTH = 1 << 30


def snapshot(root: Path) -> dict[str, tuple]:
    """Everything under ``root`` (links not followed): a link's target, a file's hash."""
    found: dict[str, tuple] = {}
    if output.is_link(root):
        return {".": ("link", os.readlink(root))}
    if not root.exists():
        return {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(folder, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir",)
            else:
                found[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def check_output(result) -> None:
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


def make_sentinel(tmp_path: Path) -> Path:
    """A folder outside every output folder: a file, a folder with a file, a missing name."""
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "victim.txt").write_text("do not touch\n")
    (outside / "folder" / "inner.txt").write_text("nor this\n")
    return outside


@pytest.fixture
def sentinel(tmp_path):
    return make_sentinel(tmp_path)


def targets(outside: Path) -> dict[str, Path]:
    return {"file": outside / "victim.txt", "folder": outside / "folder",
            "dangling": outside / "missing"}


def out_with_link(tmp_path: Path, name: str, target: Path) -> Path:
    """A new output folder ``tmp_path/out`` holding a link ``name`` to ``target``."""
    root = tmp_path / "out"
    root.mkdir()
    (root / name).symlink_to(target)
    return root


def write_docs(path: Path, answer: bool = False) -> Path:
    records = [{"id": f"d{i}", "prompt": PROMPT} | ({"answer": "mat"} if answer else {})
               for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


#: A frontier small enough to finish in seconds on the tiny model (were it not refused); its
#: tolerance can be certified with 2 replicates of 2 documents (a cap that cannot is refused).
SMALL_FRONTIER = ("frontier", "--families", "recent", "--replicates", "2", "--horizon", "2",
                  "--max-replicates", "2", "--measure", "R_tv <= 0.9")


def run_args(model: Path, docs: Path, out: Path | str, *extra: str) -> list[str]:
    return ["run", "--model", str(model), "--docs", str(docs), "--actions", "full",
            "--replicates", "1", "--horizon", "2", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory):
    """A finished run with its report, copied into each test that needs one."""
    root = tmp_path_factory.mktemp("finished")
    docs = write_docs(root / "docs.jsonl")
    out = root / "store"
    assert runner.invoke(app, run_args(tiny_model_dir, docs, out)).exit_code == 0
    assert runner.invoke(app, ["report", str(out), "--bootstrap", "0"]).exit_code == 0
    return out, docs


# --- the boundary itself (no command line, no model) ------------------------------------


@pytest.mark.parametrize("kind", ["file", "dangling"])
def test_a_file_is_never_written_through_a_link(tmp_path, sentinel, kind):
    root = out_with_link(tmp_path, "run.json", targets(sentinel)[kind])
    before = snapshot(sentinel)
    with pytest.raises(output.LinkRefused, match="run.json is a symbolic link"):
        output.write_text(root, "run.json", "{}")
    assert snapshot(sentinel) == before
    assert sorted(p.name for p in root.iterdir()) == ["run.json"]  # no temporary left


def test_a_folder_on_the_way_is_never_a_link(tmp_path, sentinel):
    root = out_with_link(tmp_path, "steps", sentinel / "folder")
    before = snapshot(sentinel)
    with pytest.raises(output.LinkRefused, match="steps is a symbolic link"):
        output.write_bytes(root, "steps/unit.parquet", b"x")
    with pytest.raises(output.LinkRefused):
        output.make_folder(root, "steps")
    assert snapshot(sentinel) == before


def test_a_path_never_leaves_its_root(tmp_path):
    for bad in ("../x", "/etc/x", "a/../../x", "."):
        with pytest.raises(ValueError, match="inside its output directory"):
            output.write_text(tmp_path, bad, "x")


def test_an_output_folder_that_is_a_link_is_refused(tmp_path, sentinel):
    (tmp_path / "out").symlink_to(sentinel / "folder")
    with pytest.raises(output.LinkRefused):
        output.write_text(tmp_path / "out", "report.html", "x")
    assert output.find_link(tmp_path / "out") == tmp_path / "out"


def test_writes_replace_files_and_follow_the_umask(tmp_path):
    output.write_text(tmp_path / "new" / "deeper", "a/b.txt", "one")
    path = output.write_text(tmp_path / "new" / "deeper", "a/b.txt", "two")
    assert path.read_text() == "two"
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
    with pytest.raises(FileExistsError):
        output.write_text(tmp_path / "new" / "deeper", "a/b.txt", "three", exclusive=True)
    assert path.read_text() == "two"


@pytest.mark.parametrize("kind", ["file", "dangling"])
def test_the_store_lock_is_never_a_link(tmp_path, sentinel, kind):
    from kvdrift.run.lock import StoreLock

    root = out_with_link(tmp_path, ".lock", targets(sentinel)[kind])
    before = snapshot(sentinel)
    with pytest.raises(output.LinkRefused, match=".lock is a symbolic link"):
        StoreLock(root).acquire()
    with pytest.raises(output.LinkRefused):
        StoreLock(root).holder()
    assert snapshot(sentinel) == before  # the victim keeps its text; no file is created


def test_a_store_never_writes_units_through_linked_folders(tmp_path, sentinel):
    import pyarrow as pa

    from kvdrift.run.records import UnitKey
    from kvdrift.run.store import RunStore

    store = RunStore.open(tmp_path / "out", {"horizon": 2})
    shutil.rmtree(store.root / "steps")
    (store.root / "steps").symlink_to(sentinel / "folder")
    before = snapshot(sentinel)
    table = pa.table({"x": [1]})
    with pytest.raises(output.LinkRefused):
        store.write_unit(UnitKey("m", "d", "full", ""), table, table)
    with pytest.raises(output.LinkRefused):
        RunStore.open(store.root, {"horizon": 2})
    assert snapshot(sentinel) == before


# --- the command line: class 1, writes through links ------------------------------------


@pytest.mark.parametrize("entry, kind", [(".lock", "file"), (".lock", "dangling"),
                                         ("steps", "folder"), ("replicates", "folder"),
                                         ("run.json", "dangling")])
def test_run_refuses_a_link_inside_out_and_writes_nothing(tiny_model_dir, tmp_path, sentinel,
                                                         entry, kind):
    docs = write_docs(tmp_path / "docs.jsonl")
    out = out_with_link(tmp_path, entry, targets(sentinel)[kind])
    before, folder = snapshot(sentinel), snapshot(out)
    result = runner.invoke(app, run_args(tiny_model_dir, docs, out))
    check_output(result)
    assert result.exit_code == 2 and LINK_MESSAGE in result.output, result.output
    assert snapshot(sentinel) == before and snapshot(out) == folder


@pytest.mark.parametrize("entry", ["report", "report/figures", "report/analysis.json"])
def test_report_refuses_a_link_where_it_writes(finished, tmp_path, sentinel, entry):
    store = tmp_path / "store"
    shutil.copytree(finished[0], store)
    shutil.rmtree(store / entry) if (store / entry).is_dir() else (store / entry).unlink()
    (store / entry).symlink_to(sentinel / "folder" if entry != "report/analysis.json"
                               else sentinel / "victim.txt")
    before, folder = snapshot(sentinel), snapshot(store)
    result = runner.invoke(app, ["report", str(store), "--bootstrap", "0"])
    check_output(result)
    assert result.exit_code == 2 and LINK_MESSAGE in result.output, result.output
    assert snapshot(sentinel) == before and snapshot(store) == folder


# --- class 2: nothing written before a refusal ---------------------------------------------


def test_a_refused_horizon_leaves_no_store_behind(tiny_model_dir, tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl")
    out = tmp_path / "out"
    result = runner.invoke(app, run_args(tiny_model_dir, docs, out)[:-4] + [
        "--horizon", "60000", "--out", str(out)])
    check_output(result)
    assert result.exit_code == 2 and "context window" in result.output, result.output
    assert not out.exists()
    again = runner.invoke(app, run_args(tiny_model_dir, docs, out))  # the valid command runs
    assert again.exit_code == 0, again.output


def test_a_per_layer_action_for_another_model_writes_nothing(tiny_model_dir, tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl")
    out = tmp_path / "out"
    args = run_args(tiny_model_dir, docs, out)
    args[args.index("full")] = "perlayer-knorm:ratios=0.5/0.5/0.5"  # the model has 2 layers
    result = runner.invoke(app, args)
    check_output(result)
    assert result.exit_code == 2, result.output
    assert "ratios has 3 values; the model has 2 layers" in result.output
    assert not out.exists()


def test_a_busy_store_is_refused_before_the_model_loads(tiny_model_dir, tmp_path):
    """The lock is taken only once everything is checked; a writer at work is said at once."""
    from kvdrift.run.lock import StoreBusy, StoreLock
    from kvdrift.study import run_study
    from kvdrift.study_config import single_model_study

    config = single_model_study(
        str(tiny_model_dir), ("full",), write_docs(tmp_path / "docs.jsonl"), replicates=1,
        horizon=2, temperature=1.0, estimator="rollout", depths=(), seed=0, batch=0,
        device="cpu", dtype="float32", chat_template=True)

    def load(name):
        raise AssertionError(f"{name} was loaded for a store another process writes")

    with StoreLock(tmp_path / "out"), pytest.raises(StoreBusy, match="being written by"):
        run_study(config, tmp_path / "out", load=load)


def test_frontier_out_empty_is_refused_and_the_working_directory_untouched(
        tiny_model_dir, tmp_path, monkeypatch):
    docs = write_docs(tmp_path.parent / f"{tmp_path.name}-docs.jsonl")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*SMALL_FRONTIER, "--model", str(tiny_model_dir), "--docs",
                                 str(docs), "--out", ""])
    check_output(result)
    assert result.exit_code == 2 and "is empty" in result.output, result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra, message", [(["--families", ""], "families must be"),
                                            (["--horizon", "60000"], "context window")])
def test_a_refused_frontier_writes_nothing(tiny_model_dir, tmp_path, extra, message):
    out = tmp_path / "frontier"
    result = runner.invoke(app, [*SMALL_FRONTIER, "--model", str(tiny_model_dir), "--docs",
                                 str(write_docs(tmp_path / "docs.jsonl")), "--out", str(out),
                                 *extra])
    check_output(result)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not out.exists()  # no frontier.json: the corrected command is not "other settings"


def test_a_task_frontier_without_answers_is_refused_before_any_stage(tiny_model_dir, tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl")
    out = tmp_path / "frontier"
    result = runner.invoke(app, [*SMALL_FRONTIER, "--model", str(tiny_model_dir), "--docs",
                                 str(docs), "--measure", "task >= -0.5", "--out", str(out)])
    check_output(result)
    assert result.exit_code == 2 and "needs scored documents" in result.output, result.output
    assert not out.exists()


def test_a_frontier_inside_a_run_is_refused_and_report_never_overwrites_one(
        tiny_model_dir, finished, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(finished[0], base)
    shutil.rmtree(base / "report")
    before = snapshot(base)
    result = runner.invoke(app, [*SMALL_FRONTIER, "--model", str(tiny_model_dir), "--docs",
                                 str(finished[1]), "--out", str(base / "report")])
    check_output(result)
    assert result.exit_code == 2 and "lies inside the kvdrift directory" in result.output
    assert snapshot(base) == before
    # a frontier written there before this check: report refuses to write over it
    (base / "report").mkdir()
    (base / "report" / "frontier.json").write_text('{"config": {}}')
    (base / "report" / "analysis.json").write_text('{"frontier": {}}')
    before = snapshot(base)
    result = runner.invoke(app, ["report", str(base), "--bootstrap", "0"])
    check_output(result)
    assert result.exit_code == 2 and "not a kvdrift report" in result.output, result.output
    assert snapshot(base) == before


@pytest.mark.parametrize("figure", ["/", "", "."])
def test_finite_state_figure_must_name_a_file(tmp_path, monkeypatch, figure):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["finite-state", "--systems", "2", "--replicates", "8",
                                 "--horizon", "2", "--figure", figure])
    check_output(result)
    assert result.exit_code == 2 and "--figure must name a file" in result.output
    assert not Path("/.png").exists() and list(tmp_path.iterdir()) == []


def test_predict_report_must_name_a_file_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in ("/", "", "."):
        result = runner.invoke(app, ["predict", "dev", "eval", "--contrast", "a - b",
                                     "--report", path])
        check_output(result)
        assert result.exit_code == 2 and "--report must name a file" in result.output
    assert list(tmp_path.iterdir()) == []


def test_finite_state_never_writes_its_figure_through_a_link(tmp_path, sentinel):
    (tmp_path / "fig.png").symlink_to(sentinel / "victim.txt")
    before = snapshot(sentinel)
    result = runner.invoke(app, ["finite-state", "--systems", "2", "--replicates", "8",
                                 "--horizon", "2", "--figure", str(tmp_path / "fig.png")])
    check_output(result)
    assert result.exit_code == 2 and LINK_MESSAGE in result.output, result.output
    assert snapshot(sentinel) == before


# --- class 8: slow refusals -----------------------------------------------------------------


HEAVY = ("torch", "transformers", "kvpress", "ray")


def test_bad_arguments_are_refused_before_the_heavy_imports(tiny_model_dir, tmp_path):
    """Checked in a fresh interpreter: frontier imports none of torch, transformers, kvpress
    or ray before a refusal, and neither does run (tests/test_hostile_refusals.py has more)."""
    docs = write_docs(tmp_path / "docs.jsonl")
    code = ("import sys\nfrom kvdrift.cli import app\n"
            "try:\n    app(sys.argv[1:], prog_name='kvdrift')\nexcept SystemExit:\n    pass\n"
            f"print('heavy:', sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    model = ("--model", str(tiny_model_dir), "--docs", str(docs), "--out", str(tmp_path / "f"))
    cases = [([*SMALL_FRONTIER, *model, *extra], []) for extra in (
        ["--alpha", "2"], ["--families", ""], ["--out", ""])]
    cases.append(([*run_args(tiny_model_dir, docs, tmp_path / "f"), "--replicates", "0"], []))
    for args, allowed in cases:
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600,
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert "error:" in done.stderr, (args, done.stderr)
        assert f"heavy: {allowed}" in done.stdout, (args, done.stdout, done.stderr)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


# --- the property: generated hostile folders, every command ---------------------------------

STORE_NAMES = (".lock", "run.json", "steps", "replicates", "report", "report/figures",
               "report/analysis.json", "report/report.html", "steps/UNIT", "replicates/UNIT")
FRONTIER_NAMES = ("frontier.json", "stages", "report", "analysis.json", "stages/01-look1",
                  "stages/01-look1/.lock", "stages/01-look1/run.json")


#: Output folders inside a store (nested), for run, study and frontier.
NESTED = ("report", "steps/more", "report/figures", "new")

#: Settings refused only once the model is loaded: the run must still write nothing.
REFUSED_SETTINGS = (("--horizon", "60000"), ("--actions", "perlayer-knorm:ratios=0.5/0.5/0.5"))


def plant(rng: random.Random, out: Path, names: tuple[str, ...], outside: Path,
          kinds: tuple[str, ...] = ("file", "folder", "dangling", "foreign", "damaged")
          ) -> list[str]:
    """Put one to three hostile entries of ``kinds`` into ``out``: links to a file or folder
    outside or dangling, or files of their own (a foreign file, a damaged kvdrift file).
    Returns the names of the links planted (where a command writes, it must refuse)."""
    linked = []
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(names)
        if name.endswith("UNIT"):
            units = sorted((out / name.split("/")[0]).glob("*.parquet"))
            if not units:
                continue
            name = str(units[0].relative_to(out))
        path = out / name
        if path.is_symlink() or any(p.is_symlink() for p in path.parents if out in p.parents):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        what = rng.choice(kinds)
        if what in ("foreign", "damaged"):
            if what == "foreign":
                path = out / rng.choice(["notes.txt", ".DS_Store", "data"])
            if path.is_dir():
                continue
            path.write_bytes(rng.choice([b"", b"{", b"\xff\xfe garbage", b"[]"]))
            continue
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        path.symlink_to(targets(outside)[what])
        linked.append(name)
    return linked


def study_file(tmp_path: Path, model: Path, docs: Path, horizon: int = 2) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(f'[study]\nname = "hostile"\nmodels = ["{model}"]\nactions = ["full"]\n'
                    f'replicates = 1\nhorizon = {horizon}\n\n[[documents]]\nsource = "jsonl"\n'
                    f'path = "{docs}"\n\n[analysis]\nbootstrap = 0\n')
    return path


def command(rng: random.Random, name: str, tmp_path: Path, model: Path, finished, outside):
    """The arguments of ``name`` against a generated hostile folder, that folder and whether
    the command must refuse."""
    docs = finished[1]
    out = tmp_path / "out"
    if name in ("run", "study", "report"):
        if name == "report" or rng.random() < 0.5:
            shutil.copytree(finished[0], out)  # a finished store: resumed or reported
        else:
            out.mkdir()
        linked = plant(rng, out, STORE_NAMES, outside)
        if name == "report":  # it reads the store and writes only its report folder
            return (["report", str(out), "--bootstrap", "0"], out,
                    any(n.split("/")[0] == "report" for n in linked))
        refused = rng.choice(REFUSED_SETTINGS) if rng.random() < 0.4 else ()
        horizon = 60000 if refused else 2  # a study refused only once its model is loaded
        nested = (out / rng.choice(NESTED) if (out / "run.json").exists() and rng.random() < 0.3
                  else out)  # an output folder inside a store: refused, the store untouched
        args = (run_args(model, docs, nested, *refused) if name == "run" else
                ["study", str(study_file(tmp_path, model, docs, horizon)), "--out", str(nested)])
        return args, out, bool(linked or refused or nested != out)
    if name == "frontier":
        if rng.randrange(3) == 0:  # a frontier inside a run (its report/ would be overwritten)
            shutil.copytree(finished[0], out)
            return ([*SMALL_FRONTIER, "--model", str(model), "--docs", str(docs), "--out",
                     str(out / rng.choice(NESTED))], out, True)
        out.mkdir()
        while not plant(rng, out, FRONTIER_NAMES, outside, ("file", "folder", "dangling")):
            pass  # links only: a damaged report/ file would be found only after the search
        return ([*SMALL_FRONTIER, "--model", str(model), "--docs", str(docs), "--out", str(out)],
                out, True)
    out.mkdir()
    figure = out / "figure.png"
    what = rng.choice(["file", "folder", "dangling"])
    figure.symlink_to(targets(outside)[what])
    return (["finite-state", "--systems", "2", "--replicates", "8", "--horizon", "2",
             "--figure", str(figure)], out, True)


@pytest.mark.parametrize("seed", range(30))
def test_hostile_folders_never_leak_writes(tiny_model_dir, finished, tmp_path, sentinel, seed):
    rng = random.Random(seed)
    name = ("run", "study", "report", "frontier", "finite-state")[seed % 5]
    args, out, must_refuse = command(rng, name, tmp_path, tiny_model_dir, finished, sentinel)
    before, folder = snapshot(sentinel), snapshot(out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = runner.invoke(app, args)
    check_output(result)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak
    assert grown < PEAK_GROWTH, (name, grown)
    assert snapshot(sentinel) == before, (name, result.output)
    if must_refuse:
        assert result.exit_code == 2, (name, folder, result.output)
    if result.exit_code == 2:
        assert snapshot(out) == folder, (name, result.output)
