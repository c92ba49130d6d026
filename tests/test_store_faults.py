"""The store under faults: one writer at a time, an atomic run.json, units that remember the
settings that made them, and damaged units recomputed on rerun (finite pairs, seconds)."""

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest

from kvdrift.data.document import Document
from kvdrift.finite import random_pair
from kvdrift.records.schema import TIMING_COLUMNS
from kvdrift.run.lock import StoreBusy, StoreLock
from kvdrift.run.records import UnitKey
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore, unit_name

PAIRS = {a: random_pair(3, 8, seed=7, mix=m, eos_token_id=2)
         for a, m in {"mild": 0.2, "strong": 0.7}.items()}
DOCS = [Document(id=f"doc{i}", prompt=f"prompt {i}", stratum="s") for i in range(3)]


def factory(doc, action):
    return PAIRS[action]


def config(**kw):
    base = dict(model="finite", actions=("mild", "strong"), replicates=4, horizon=5, seed=3)
    return RunConfig(**(base | kw))


def run(root, cfg, **store_options):
    store = RunStore.open(root, cfg.as_dict(), **store_options)
    return run_units(cfg, DOCS, factory, store), store


def horizons(root):
    return set(pq.read_table(root / "replicates", columns=["horizon"])["horizon"].to_pylist())


# --- one writer per store ------------------------------------------------------------------


def test_a_second_lock_on_a_store_is_refused_naming_the_holder(tmp_path):
    with StoreLock(tmp_path / "s"):
        with pytest.raises(StoreBusy, match=rf"\(PID {os.getpid()}\)"):
            StoreLock(tmp_path / "s").acquire()
    with StoreLock(tmp_path / "s"):  # released: free again
        pass


def test_the_lock_names_another_process_and_dies_with_it(tmp_path):
    code = ("import sys, time; from kvdrift.run.lock import StoreLock; "
            f"StoreLock({str(tmp_path / 's')!r}).acquire(); print('locked', flush=True); "
            "time.sleep(3600)")  # killed below: its life is no wall-clock bound
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreBusy) as info:
            StoreLock(tmp_path / "s").acquire()
        assert str(info.value) == (f"{tmp_path / 's'} is being written by another kvdrift "
                                   f"process (PID {holder.pid}); wait for it to finish, or use "
                                   "another output directory")
    finally:
        holder.kill()
        holder.wait()
    with StoreLock(tmp_path / "s"):  # a killed holder leaves no stale lock
        pass


def _open_at_once(root, horizon, start, results):
    start.wait()
    try:
        RunStore.open(root, config(horizon=horizon).as_dict())
        results.put("ok")
    except ValueError as exc:
        results.put(str(exc))
    except Exception as exc:  # noqa: BLE001 - the race must never crash
        results.put(f"crash: {exc!r}")


def test_run_json_creation_is_atomic_under_a_race(tmp_path):
    """Many writers create one fresh store at once (no lock): one configuration wins, the
    others are refused in one line; none crashes on a shared temporary file. (Threads of one
    process: the harshest case, since they share a process id.)"""
    for attempt in range(20):
        root = tmp_path / f"r{attempt}"
        start, results = threading.Barrier(6), queue.Queue()
        procs = [threading.Thread(target=_open_at_once, args=(root, 4 + i % 2, start, results))
                 for i in range(6)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=600) for _ in procs]  # a hang guard only
        for p in procs:
            p.join()
        assert not [o for o in outcomes if o.startswith("crash")], outcomes
        saved = json.loads((root / "run.json").read_text())["config"]["horizon"]
        assert outcomes.count("ok") == sum(1 for i in range(6) if 4 + i % 2 == saved)
        assert all(o == "ok" or "differs in: horizon" in o for o in outcomes)
        assert not list(root.glob(".run.json.tmp*"))


def _locked_run(root, horizon, start, results):
    start.wait()
    try:
        with StoreLock(root):
            cfg = config(horizon=horizon)
            run_units(cfg, DOCS, factory, RunStore.open(root, cfg.as_dict()))
            time.sleep(0.2)  # hold the lock a little, as a real run does
        results.put((horizon, "ok"))
    except ValueError as exc:
        results.put((horizon, str(exc)))


def test_two_runs_with_other_horizons_leave_one_consistent_store(tmp_path):
    """Two writers with other horizons start at once on one fresh store: one of them is
    refused, and the store holds the other's units only. (Threads: the lock is per open file,
    so it separates two writers in one process as it does two processes.)"""
    for attempt in range(4):
        root = tmp_path / f"r{attempt}"
        start, results = threading.Barrier(2), queue.Queue()
        procs = [threading.Thread(target=_locked_run, args=(root, h, start, results))
                 for h in (5, 8)]
        for p in procs:
            p.start()
        outcomes = dict(results.get(timeout=600) for _ in procs)  # a hang guard only
        for p in procs:
            p.join()
        winners = [h for h, o in outcomes.items() if o == "ok"]
        assert len(winners) == 1, outcomes
        loser = ({5, 8} - set(winners)).pop()
        assert ("is being written by another kvdrift process" in outcomes[loser]
                or "differs in: horizon" in outcomes[loser])
        assert horizons(root) == set(winners)
        assert json.loads((root / "run.json").read_text())["config"]["horizon"] == winners[0]


# --- units remember their settings -----------------------------------------------------------


def test_edited_run_json_does_not_mix_horizons(tmp_path):
    run(tmp_path, config(horizon=5))
    meta = json.loads((tmp_path / "run.json").read_text())
    meta["config"]["horizon"] = 8
    (tmp_path / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError) as info:
        run(tmp_path, config(horizon=8))
    assert str(info.value) == (
        f"unit finite · doc0 · mild in {tmp_path} is not mixed in: it was computed with "
        "horizon H = 5, this run has horizon H = 8; rerun with the same settings, pass "
        "--recompute to recompute such units, or use another output directory")
    assert horizons(tmp_path) == {5}  # refused before any unit ran
    notes = []
    ran, store = run(tmp_path, config(horizon=8), recompute=True, notice=notes.append)
    assert ran == 6 and horizons(tmp_path) == {8} and len(notes) == 6
    assert "it was computed with horizon H = 5" in notes[0] and "(--recompute)" in notes[0]
    assert store.read("steps").num_rows == 6 * 4 * 8


def test_deleted_run_json_does_not_mix_horizons(tmp_path):
    run(tmp_path, config(horizon=5))
    (tmp_path / "run.json").unlink()
    with pytest.raises(ValueError, match="computed with horizon H = 5, this run has horizon H"):
        run(tmp_path, config(horizon=8))
    assert horizons(tmp_path) == {5}
    (tmp_path / "run.json").unlink()
    assert run(tmp_path, config(horizon=5))[0] == 0  # same settings: resumes, nothing redone


@pytest.mark.parametrize("change, named", [
    (dict(replicates=5), "replicates K = 4, this run has replicates K = 5"),
    (dict(temperature=0.5), "temperature = 1.0, this run has temperature = 0.5"),
    (dict(seed=4), "seed = 3, this run has seed = 4"),
    (dict(estimator="swrb"), "estimator = 'rollout', this run has estimator = 'swrb'"),
    (dict(depths=(2,)), "depths = [], this run has depths = [2]"),
    (dict(extra={"dtype": "bfloat16"}), "dtype = None, this run has dtype = 'bfloat16'"),
])
def test_every_setting_that_shapes_records_is_checked(tmp_path, change, named):
    run(tmp_path, config())
    (tmp_path / "run.json").unlink()
    with pytest.raises(ValueError, match=named):
        run(tmp_path, config(**change))


def test_a_changed_prompt_and_an_unfingerprinted_unit_are_refused(tmp_path):
    cfg = config()
    store = RunStore.open(tmp_path, cfg.as_dict())
    run_units(cfg, DOCS, factory, store)
    changed = [Document(id="doc0", prompt="another text", stratum="s")]
    with pytest.raises(ValueError, match="the document's prompt text has changed"):
        run_units(cfg, changed, factory, store)
    key = UnitKey("finite", "doc1", "mild", "s")
    path = tmp_path / "replicates" / f"{unit_name(key)}.parquet"
    pq.write_table(pq.read_table(path).replace_schema_metadata({}), path)
    with pytest.raises(ValueError, match="stored without the settings that made it"):
        run_units(cfg, DOCS, factory, store)


@pytest.mark.parametrize("damage, kind, reason", [
    ("rows", "steps", "step records are incomplete (12 of 20 rows)"),
    ("rows", "replicates", "replicate records are incomplete (3 of 4 rows)"),
    ("bytes", "steps", "is unreadable"),
    ("bytes", "replicates", "is unreadable"),
    ("missing", "steps", "its steps file is missing"),
])
def test_damaged_units_are_named_and_recomputed(tmp_path, damage, kind, reason):
    cfg = config()
    whole = RunStore.open(tmp_path / "whole", cfg.as_dict())
    run_units(cfg, DOCS, factory, whole)
    key = UnitKey("finite", "doc1", "strong", "s")
    path = tmp_path / "whole" / kind / f"{unit_name(key)}.parquet"
    expected = pq.read_table(path)
    if damage == "rows":  # the fingerprint is kept: the rows are held against its K and H
        pq.write_table(expected.slice(0, 3 if kind == "replicates" else 12), path)
    elif damage == "bytes":
        path.write_bytes(path.read_bytes()[:50])
    else:
        path.unlink()
    notes = []
    store = RunStore.open(tmp_path / "whole", cfg.as_dict(), notice=notes.append)
    assert run_units(cfg, DOCS, factory, store) == 1
    assert len(notes) == 1 and notes[0].startswith("unit finite · doc1 · strong in ")
    assert reason in notes[0] and notes[0].endswith("; recomputing it")
    timing = [c for c in TIMING_COLUMNS if c in expected.column_names]  # wall times differ
    assert pq.read_table(path).drop_columns(timing).equals(expected.drop_columns(timing))
    assert store.read("steps").num_rows == 6 * 4 * 5


def test_damaged_run_json_is_one_line(tmp_path):
    (tmp_path / "run.json").write_text("[]")
    with pytest.raises(ValueError) as info:
        RunStore.open(tmp_path, config().as_dict())
    assert str(info.value) == (
        f"{tmp_path / 'run.json'} is damaged: not a JSON object with a 'config' object; delete "
        "it (finished units keep their own settings and are checked on resume) or use another "
        "output directory")
    (tmp_path / "run.json").write_bytes(b"\xff{")
    with pytest.raises(ValueError, match=r"run.json is damaged: not valid JSON"):
        _ = RunStore(tmp_path).metadata
