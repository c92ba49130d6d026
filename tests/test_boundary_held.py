"""The output boundary holds descriptors; only regular files; kvdrift folders marked (issue 46,
classes 1, 2 and 5, and two messages of class 7).

Every folder kvdrift writes in is held by a descriptor for the whole command
(:class:`kvdrift.output.OutputDir`): a folder replaced by a link while a command runs is refused
at its next use, and nothing outside the output folder is created, changed or deleted (the race
tests swap ``steps/``, ``report/figures`` and ``stages/`` for links, deterministically at every
boundary use of a scripted writer, and from a thread while real commands run). A device, FIFO
or socket where kvdrift reads or writes is refused in one line without blocking. A kvdrift
folder carries a marker naming its kind, and no output folder may lie inside another.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import signal
import stat
import threading
import time
from pathlib import Path

import pytest
from test_hostile_folders import (
    SMALL_FRONTIER,
    check_output,
    make_sentinel,
    run_args,
    runner,
    snapshot,
    write_docs,
)

from kvdrift import output
from kvdrift.cli import app


@pytest.fixture
def outside(tmp_path):
    return make_sentinel(tmp_path)


@pytest.fixture(scope="module")
def finished_store(tiny_model_dir, tmp_path_factory):
    """A finished run (no report), copied into each test that needs one."""
    root = tmp_path_factory.mktemp("finished")
    docs = write_docs(root / "docs.jsonl")
    assert runner.invoke(app, run_args(tiny_model_dir, docs, root / "store")).exit_code == 0
    return root / "store", docs


def copy_store(finished_store, tmp_path: Path, name: str = "out") -> tuple[Path, Path]:
    shutil.copytree(finished_store[0], tmp_path / name)
    return tmp_path / name, finished_store[1]


def one_line_or_done(result) -> None:
    """The command completed, or refused in one line (no traceback)."""
    check_output(result)
    if result.exit_code == 2:
        lines = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, result.output


def swap_for_link(folder: Path, target: Path) -> Path:
    """Move ``folder`` aside (inside its parent) and put a link to ``target`` in its place."""
    away = folder.with_name(folder.name + ".away")
    folder.rename(away)
    folder.symlink_to(target, target_is_directory=True)
    return away


# --- the held folder itself (no command) ------------------------------------------------


def test_a_folder_replaced_by_a_link_is_refused_at_its_next_use(tmp_path, outside):
    root = output.OutputDir(tmp_path / "out")
    steps = root.subdir("steps")
    steps.write_text("a.txt", "one")
    before = snapshot(outside)
    swap_for_link(tmp_path / "out" / "steps", outside / "folder")
    for use in (lambda: steps.write_text("b.txt", "two"), lambda: steps.unlink("a.txt"),
                lambda: steps.read_bytes("a.txt"), lambda: steps.names()):
        with pytest.raises(output.LinkRefused, match="steps is a symbolic link"):
            use()
    assert snapshot(outside) == before
    (tmp_path / "out" / "steps").unlink()
    (tmp_path / "out" / "steps").mkdir()  # another folder under the same name
    with pytest.raises(output.LinkRefused, match="was replaced by another folder"):
        steps.write_text("c.txt", "three")
    assert list((tmp_path / "out" / "steps").iterdir()) == []


def test_the_output_folder_itself_replaced_by_a_link_is_refused(tmp_path, outside):
    root = output.OutputDir(tmp_path / "out")
    root.write_text("a.txt", "one")
    reader = output.OutputDir(tmp_path / "out", create=False)  # a reader follows the user's
    assert reader.read_bytes("a.txt") == b"one"
    before = snapshot(outside)
    swap_for_link(tmp_path / "out", outside / "folder")
    with pytest.raises(output.LinkRefused, match="out is a symbolic link"):
        root.write_text("b.txt", "two")
    with pytest.raises(output.LinkRefused, match="replaced by another folder"):
        reader.read_bytes("a.txt")  # the link now names another folder than the one read
    assert snapshot(outside) == before


def test_a_held_folder_is_opened_on_first_use_and_marked_first(tmp_path):
    root = output.OutputDir(tmp_path / "out", marker="frontier")
    stage = root.subdir("stages/01-look1", marker="run")
    assert not (tmp_path / "out").exists()  # nothing made until something is written
    stage.write_text("run.json", "{}")
    assert (tmp_path / "out" / output.MARKER).read_text() == "kvdrift frontier\n"
    assert (stage.path / output.MARKER).read_text() == "kvdrift run\n"
    assert not (tmp_path / "out" / "stages" / output.MARKER).exists()


def _scripted_writes(root: output.OutputDir) -> None:
    """What a store, a frontier and a report do at the boundary, in order."""
    stage = root.subdir("stages/01-look1", marker="run")
    stage.write_text("run.json", "{}", exclusive=True)
    os.close(stage.lock_file(".lock"))
    for kind in ("steps", "replicates"):
        stage.subdir(kind).write_bytes("u.parquet", b"x")
    stage.subdir("steps").unlink("u.parquet")
    stage.subdir("steps").write_bytes("u.parquet", b"y")
    report = root.subdir("report", marker="report")
    report.write_text("analysis.json", "{}")
    figures = report.subdir("figures")
    for name in ("a.png", "b.png"):
        figures.unlink(name)
        output.write_file(figures / name, b"png")
    report.write_text("report.html", "<html>")


@pytest.mark.parametrize("victim", ["stages", "stages/01-look1/steps", "report/figures"])
def test_a_swap_at_every_boundary_use_never_writes_outside(tmp_path, outside, monkeypatch,
                                                           victim):
    """Deterministic race: the writer above runs once per boundary use, and at that use the
    victim folder (once made) is swapped for a link to a folder outside."""
    held = output.OutputDir._held
    uses = {"n": 0}

    def counting(self, create):
        uses["n"] += 1
        return held(self, create)

    monkeypatch.setattr(output.OutputDir, "_held", counting)
    _scripted_writes(output.OutputDir(tmp_path / "dry"))
    total, refused = uses["n"], 0
    before = snapshot(outside)
    for point in range(1, total + 1):
        out = tmp_path / f"out{point}"
        uses["n"] = 0

        def swapping(self, create, point=point, out=out):
            uses["n"] += 1
            folder = out / victim
            if uses["n"] == point and folder.is_dir() and not folder.is_symlink():
                swap_for_link(folder, outside / "folder")
            return held(self, create)

        monkeypatch.setattr(output.OutputDir, "_held", swapping)
        try:
            _scripted_writes(output.OutputDir(out))
        except output.LinkRefused:
            refused += 1
        assert snapshot(outside) == before, point
    assert refused > 0 and total > 20


def test_the_report_deletes_old_figures_by_name_in_its_held_folder(tmp_path, outside,
                                                                    monkeypatch):
    """``report/figures`` replaced by a link between two figures: the report refuses, and the
    outside folder keeps its files (the unlink is relative to the held folder)."""
    shutil.copy(outside / "victim.txt", outside / "folder" / "timing.png")
    figures = output.OutputDir(tmp_path / "report").subdir("figures")
    figures.write_bytes("timing.png", b"old")
    before = snapshot(outside)
    swap_for_link(tmp_path / "report" / "figures", outside / "folder")
    with pytest.raises(output.LinkRefused):
        figures.unlink("timing.png")
    assert snapshot(outside) == before


# --- the race during real commands (a thread swaps folders for links) --------------------


class Swapper(threading.Thread):
    """Once ``trigger`` exists (the command is writing), swaps ``folder`` for a link to
    ``target`` and back at seeded random moments until stopped; counts the swaps."""

    def __init__(self, folder: Path, target: Path, trigger: Path, seed: int):
        super().__init__(daemon=True)
        self.folder, self.target, self.trigger = folder, target, trigger
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.swaps = 0

    def run(self) -> None:
        away = self.folder.with_name(self.folder.name + ".away")
        while not self.stop.is_set() and not os.path.lexists(self.trigger):
            time.sleep(0.001)
        while not self.stop.is_set():
            time.sleep(self.rng.uniform(0.0, 0.02))
            if not self.folder.is_dir() or self.folder.is_symlink():
                continue
            try:
                swap_for_link(self.folder, self.target)
            except OSError:
                continue
            self.swaps += 1
            time.sleep(self.rng.uniform(0.0, 0.02))
            self.folder.unlink()
            away.rename(self.folder)


def race(args: list[str], folder: Path, trigger: Path, outside: Path, seed: int) -> None:
    """Run ``args`` while ``folder`` is swapped for links from when ``trigger`` exists;
    nothing outside ``--out`` changes, and the command completes or refuses in one line."""
    out = Path(args[args.index("--out") + 1]) if "--out" in args else folder.parent.parent

    def around() -> list[str]:  # what lies beside the output folder
        return sorted(p.name for p in outside.parent.iterdir() if p.name != out.name)

    before, beside = snapshot(outside), around()
    swapper = Swapper(folder, outside / "folder", trigger, seed)
    swapper.start()
    try:
        result = runner.invoke(app, args)
    finally:
        swapper.stop.set()
        swapper.join()
    one_line_or_done(result)
    assert snapshot(outside) == before, result.output
    assert around() == beside
    assert swapper.swaps > 0
    return result


def test_a_run_racing_its_steps_folder(tiny_model_dir, tmp_path, outside):
    docs = write_docs(tmp_path / "docs.jsonl")
    out = tmp_path / "out"
    race(run_args(tiny_model_dir, docs, out, "--replicates", "4"), out / "steps",
         out / "run.json", outside, seed=1)


def test_a_report_racing_its_figures_folder(finished_store, tmp_path, outside):
    out, _ = copy_store(finished_store, tmp_path)
    race(["report", str(out), "--bootstrap", "0"], out / "report" / "figures",
         out / "report" / "analysis.json", outside, seed=2)


def test_a_frontier_racing_its_stages_folder(tiny_model_dir, tmp_path, outside):
    docs = write_docs(tmp_path / "docs.jsonl")
    out = tmp_path / "frontier"
    race([*SMALL_FRONTIER, "--model", str(tiny_model_dir), "--docs", str(docs), "--out",
          str(out)], out / "stages", out / "stages" / "01-look1" / "run.json", outside, seed=3)


# --- only regular files -------------------------------------------------------------------


def test_a_character_device_as_figure_is_refused_and_untouched(tmp_path):
    before = os.stat("/dev/null")
    result = runner.invoke(app, ["finite-state", "--systems", "2", "--replicates", "8",
                                 "--horizon", "2", "--figure", "/dev/null"])
    check_output(result)
    assert result.exit_code == 2 and "is a character device, not a regular file" in result.output
    after = os.stat("/dev/null")
    assert (after.st_ino, after.st_mode, after.st_rdev) == (
        before.st_ino, before.st_mode, before.st_rdev)
    assert stat.S_ISCHR(after.st_mode)
    with pytest.raises(output.NotARegularFile, match="character device"):
        output.write_file("/dev/null", b"x")  # the boundary itself, past the command's check
    assert os.stat("/dev/null").st_ino == before.st_ino


def test_a_fifo_is_never_written_over_nor_read(tmp_path):
    fifo = tmp_path / "fig.png"
    os.mkfifo(fifo)
    with pytest.raises(output.NotARegularFile, match=r"FIFO \(named pipe\)"):
        output.write_file(fifo, b"x")
    with pytest.raises(output.NotARegularFile, match="FIFO"):
        output.open_regular(fifo)  # returns at once, never waits for a writer
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]  # no temporary left
    docs = tmp_path / "docs.jsonl"
    os.mkfifo(docs)
    from kvdrift.data.loaders import load_jsonl

    with pytest.raises(ValueError, match="not a regular file"):
        load_jsonl(docs)


@contextlib.contextmanager
def time_limit(seconds: int):
    """Raise TimeoutError in the test if the block takes longer (an open that blocks on a
    FIFO is interrupted by the signal)."""
    def expired(signum, frame):
        raise TimeoutError(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_fifo_as_a_parquet_part_is_refused_by_report_and_run(tiny_model_dir, finished_store,
                                                                tmp_path):
    out, docs = copy_store(finished_store, tmp_path)
    part = sorted((out / "steps").glob("*.parquet"))[0]
    part.unlink()
    os.mkfifo(part)
    for args in (["report", str(out), "--bootstrap", "0"], run_args(tiny_model_dir, docs, out)):
        with time_limit(60):
            result = runner.invoke(app, args)
        one_line_or_done(result)
        assert result.exit_code == 2, (args, result.output)
        assert "FIFO (named pipe), not a regular file" in result.output, result.output
        assert part.name in result.output.replace("\n", "")
        assert stat.S_ISFIFO(os.lstat(part).st_mode)


# --- kvdrift folders: markers and nesting --------------------------------------------------


def _frontier_folder(root: Path, legacy: bool = False) -> Path:
    """A frontier's folder as its first stage leaves it: marked (or, written before markers,
    with frontier.json), holding a stage store."""
    (root / "stages" / "01-look1").mkdir(parents=True)
    (root / "stages" / "01-look1" / "run.json").write_text('{"config": {"horizon": 2}}')
    if legacy:
        (root / "frontier.json").write_text('{"config": {}}')
    else:
        (root / output.MARKER).write_text("kvdrift frontier\n")
    return root


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("inside", ["stages/02-mine", "stages", "report/x"])
def test_a_run_inside_a_frontier_is_refused(tiny_model_dir, tmp_path, legacy, inside):
    frontier = _frontier_folder(tmp_path / "frontier", legacy)
    before = snapshot(frontier)
    result = runner.invoke(app, run_args(tiny_model_dir, write_docs(tmp_path / "docs.jsonl"),
                                         frontier / inside))
    check_output(result)
    assert result.exit_code == 2, result.output
    assert "lies inside the kvdrift directory" in result.output and "frontier" in result.output
    assert snapshot(frontier) == before


def test_report_never_writes_into_a_frontier(finished_store, tmp_path):
    store, _ = copy_store(finished_store, tmp_path, "store")
    frontier = _frontier_folder(tmp_path / "frontier")
    (frontier / "report").mkdir()
    (frontier / "report" / "report.html").write_text("the frontier's report")
    (frontier / "report" / output.MARKER).write_text("kvdrift report\n")
    before = snapshot(frontier)
    for out in (frontier / "report", frontier, frontier / "stages" / "01-look1" / "report"):
        result = runner.invoke(app, ["report", str(store), "--bootstrap", "0", "--out",
                                     str(out)])
        check_output(result)
        assert result.exit_code == 2 and "kvdrift" in result.output, (out, result.output)
    assert snapshot(frontier) == before


def test_a_store_whose_run_json_was_deleted_is_still_a_kvdrift_folder(tiny_model_dir,
                                                                      finished_store, tmp_path):
    store, docs = copy_store(finished_store, tmp_path, "store")
    assert (store / output.MARKER).read_text() == "kvdrift run\n"  # written with the store
    (store / "run.json").unlink()
    before = snapshot(store)
    for nested in ("steps/more", "new", "replicates"):
        result = runner.invoke(app, run_args(tiny_model_dir, docs, store / nested))
        check_output(result)
        assert result.exit_code == 2 and "lies inside the kvdrift directory" in result.output
    result = runner.invoke(app, ["report", str(store), "--bootstrap", "0"])
    check_output(result)
    assert result.exit_code == 2 and "its run.json was deleted" in result.output, result.output
    assert snapshot(store) == before


def test_a_folder_of_one_kind_is_never_written_as_another(tiny_model_dir, tmp_path):
    frontier = tmp_path / "frontier"
    frontier.mkdir()
    (frontier / output.MARKER).write_text("kvdrift frontier\n")
    result = runner.invoke(app, run_args(tiny_model_dir, write_docs(tmp_path / "docs.jsonl"),
                                         frontier))
    check_output(result)
    assert result.exit_code == 2 and "is a kvdrift frontier directory, not a kvdrift run" in (
        result.output)


# --- messages: a full disk, a read-only --figure -------------------------------------------


def test_a_full_disk_names_the_file_being_written(tmp_path, monkeypatch):
    folder = output.OutputDir(tmp_path / "out")
    with pytest.raises(OSError) as info, folder.open_file("analysis.json") as handle:
        handle.write(b"{")
        raise OSError(errno.ENOSPC, "No space left on device")  # as a flush would
    assert info.value.filename == str(tmp_path / "out" / "analysis.json")
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path / "out") == []  # the temporary file is gone

    import matplotlib.figure

    def full(self, fname, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    figure = tmp_path / "figs" / "check.png"
    result = runner.invoke(app, ["finite-state", "--systems", "2", "--replicates", "8",
                                 "--horizon", "2", "--figure", str(figure)])
    check_output(result)
    assert result.exit_code == 2
    assert f"error: {figure}: No space left on device (errno {errno.ENOSPC})" in result.output


def test_a_read_only_figure_folder_names_the_users_path(tmp_path, monkeypatch):
    """As root a read-only folder can still be written, so the refusal of the temporary file's
    creation is simulated where the boundary creates it."""
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if ".tmp-" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(output.os, "open", read_only)
    figure = tmp_path / "check.png"
    result = runner.invoke(app, ["finite-state", "--systems", "2", "--replicates", "8",
                                 "--horizon", "2", "--figure", str(figure)])
    check_output(result)
    assert result.exit_code == 2
    assert f"error: {figure}: Read-only file system (errno {errno.EROFS})" in result.output
    assert ".tmp-" not in result.output


def test_markers_written_by_every_kind(tiny_model_dir, tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl")
    out = tmp_path / "frontier"
    result = runner.invoke(app, [*SMALL_FRONTIER, "--model", str(tiny_model_dir), "--docs",
                                 str(docs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / output.MARKER).read_text() == "kvdrift frontier\n"
    assert (out / "report" / output.MARKER).read_text() == "kvdrift report\n"
    stage = next((out / "stages").iterdir())
    assert (stage / output.MARKER).read_text() == "kvdrift run\n"
    (out / "frontier.json").unlink()  # still a frontier: nothing nests in it
    result = runner.invoke(app, run_args(tiny_model_dir, docs, out / "stages" / "mine"))
    assert result.exit_code == 2 and "lies inside the kvdrift directory" in result.output
    json.loads((out / "analysis.json").read_text())
