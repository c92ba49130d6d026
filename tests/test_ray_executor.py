"""The Ray executor on a local Ray instance with 2 workers: the local executor's records, unit
by unit; a worker killed mid-unit is replaced without losing or duplicating a unit; retries
are bounded; bad executor input gets one line.
"""

import os
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray
import torch
from typer.testing import CliRunner

import kvdrift
from kvdrift.cli import app
from kvdrift.data import Document, write_jsonl
from kvdrift.finite import random_pair
from kvdrift.records.schema import TIMING_COLUMNS
from kvdrift.run import UnitFailed
from kvdrift.run.executors import ExecutorConfig
from kvdrift.run.executors.ray import RayExecutor
from kvdrift.run.records import UnitKey
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import KINDS, RunStore

# The fault-injecting pair builders below travel to the workers by value (tests/ is not on
# their path).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

runner = CliRunner()
PAIRS = {a: random_pair(3, 5, seed=7, mix=m, eos_token_id=2)
         for a, m in {"mild": 0.2, "strong": 0.7}.items()}
DOCS = [Document(id=f"doc{i}", prompt=f"prompt {i}", stratum="a" if i < 2 else "b")
        for i in range(3)]
VICTIM = ("doc1", "strong")


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray instance with 2 CPUs: 2 workers of one CPU each."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def finite_factory(doc, action):
    return PAIRS[action]


def finite_pairs():
    """The builder a worker calls once: here the factory needs no loading."""
    return finite_factory


@dataclass(frozen=True)
class DyingFinitePairs:
    """Builds a pair factory whose process kills itself (SIGKILL) when it starts the
    victim unit, as long as fewer than ``deaths`` workers have died that way."""

    marker_dir: str
    deaths: int

    def __call__(self):
        def make_pair(doc, action):
            if (doc.id, action) == VICTIM and len(os.listdir(self.marker_dir)) < self.deaths:
                Path(self.marker_dir, str(os.getpid())).touch()
                os.kill(os.getpid(), signal.SIGKILL)
            return PAIRS[action]

        return make_pair


def stored_units(root: Path) -> dict[str, dict[str, object]]:
    """Every stored file of a run, by kind and file name, as an Arrow table (without the
    measured wall times, which differ between any two runs)."""

    def records(path: Path):
        table = pq.read_table(path)
        return table.drop_columns([c for c in TIMING_COLUMNS if c in table.column_names])

    return {kind: {p.name: records(p) for p in sorted((root / kind).glob("*.parquet"))}
            for kind in KINDS}


def assert_same_units(a: Path, b: Path, units: int) -> None:
    left, right = stored_units(a), stored_units(b)
    for kind in KINDS:
        assert len(left[kind]) == units and left[kind].keys() == right[kind].keys()
        for name, table in left[kind].items():
            other = right[kind][name]
            differ = [(c, table.column(c).to_pylist(), other.column(c).to_pylist())
                      for c in table.column_names if not table.column(c).equals(other.column(c))]
            assert table.equals(other), (kind, name, differ)


def test_study_on_ray_stores_the_local_records(ray_cluster, tiny_model_dir, tmp_path):
    # Workers import this checkout's kvdrift (they inherit the driver's PYTHONPATH).
    assert ray.get(ray.remote(lambda: kvdrift.__file__).remote()) == kvdrift.__file__
    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id=f"d{i}", prompt=f"Document {i}. " + "The cat sat. " * (12 + 4 * i))
                 for i in range(2)], docs)
    config = tmp_path / "study.toml"
    config.write_text(f"""
[study]
models = ["{tiny_model_dir}"]
actions = ["snapkv-half", "recent-half@int8"]
replicates = 3
horizon = 6
depths = [2]
device = "cpu"
executor = "ray"

[[documents]]
source = "jsonl"
path = "{docs}"
""")
    ray_out, local_out = tmp_path / "ray", tmp_path / "local"
    result = runner.invoke(app, ["study", str(config), "--out", str(ray_out), "--no-report"])
    assert result.exit_code == 0, result.output
    # Each worker computes with one thread (Ray's OMP_NUM_THREADS = cpus_per_worker = 1); the
    # local executor must too for bit-identical floats (the reduction order follows threads).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = runner.invoke(app, ["study", str(config), "--out", str(local_out),
                                    "--no-report", "--executor", "local"])
    finally:
        torch.set_num_threads(threads)
    assert local.exit_code == 0, local.output
    assert_same_units(ray_out, local_out, units=2 * 2)
    from kvdrift.directory import StudyDirectory

    recorded = StudyDirectory(ray_out).documents  # as the workers saw them, with their digests
    assert len(recorded) == 2 and recorded == StudyDirectory(local_out).documents
    assert all(len(d.fingerprint["weights_sha256"]) == 64 for d in recorded.values())


@pytest.mark.slow
def test_a_ray_resume_with_other_weights_under_the_same_name_is_refused(ray_cluster,
                                                                        tiny_model_dir, tmp_path):
    """The driver has not loaded the weights: a worker loads them to tell their digest."""
    import shutil

    from transformers import LlamaForCausalLM

    from kvdrift.directory import StudyDirectory
    from kvdrift.lm.loading.digest import short, weights_digest

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    write_jsonl([Document(id="d0", prompt="The cat sat. " * 12)], tmp_path / "docs.jsonl")
    args = ["run", "--model", str(model), "--docs", str(tmp_path / "docs.jsonl"), "--actions",
            "recent-half", "--replicates", "2", "--horizon", "3", "--out", str(tmp_path / "run"),
            "--executor", "ray"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    was = StudyDirectory(tmp_path / "run").unit_fingerprint(str(model), "d0", "recent-half")
    weights = LlamaForCausalLM.from_pretrained(model)
    with torch.no_grad():
        weights.model.norm.weight.mul_(1.5)
    weights.save_pretrained(model)
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    assert (f"(weights {short(was['weights_sha256'])}, this run has "
            f"{short(weights_digest(weights))})") in refused.output
    assert runner.invoke(app, [*args, "--recompute"]).exit_code == 0


def test_killed_worker_is_replaced_and_every_unit_is_stored_once(ray_cluster, tmp_path):
    config = RunConfig(model="finite", actions=("mild", "strong"), replicates=20, horizon=5,
                       seed=3)
    local = RunStore.open(tmp_path / "local", config.as_dict())
    run_units(config, DOCS, finite_factory, local)

    markers = tmp_path / "deaths"
    markers.mkdir()
    store = RunStore.open(tmp_path / "ray", config.as_dict())
    live, seen = [], []
    with RayExecutor(ExecutorConfig("ray", max_retries=2), on_workers=live.append) as executor:
        ran = executor.run(config, DOCS, DyingFinitePairs(str(markers), deaths=1), store,
                           on_unit=lambda key, skipped: seen.append((key.doc_id, key.action)))
    assert len(os.listdir(markers)) == 1  # the victim's worker was killed once, mid-unit
    assert ran == 6 and sorted(seen) == sorted(set(seen)) and len(seen) == 6
    # workers became ready at least twice (the lost one was replaced) and all were retired;
    # how many overlap depends on scheduling, so the count's peak is not pinned
    starts = sum(1 for before, after in zip([0, *live], live, strict=False) if after > before)
    assert starts >= 2 and live[-1] == 0, live
    assert_same_units(tmp_path / "ray", tmp_path / "local", units=6)
    reps = store.read("replicates").to_pandas()
    assert (reps.groupby(["doc_id", "action"]).size() == 20).all()

    # A rerun finds every unit done and starts no worker.
    again = []
    with RayExecutor(ExecutorConfig("ray"), on_workers=again.append) as executor:
        assert executor.run(config, DOCS, finite_pairs, store) == 0
    assert again == []


def test_interrupt_keeps_finished_units_and_a_rerun_resumes(ray_cluster, tmp_path):
    config = RunConfig(model="finite", actions=("mild", "strong"), replicates=8, horizon=5)
    local = RunStore.open(tmp_path / "local", config.as_dict())
    run_units(config, DOCS, finite_factory, local)
    store = RunStore.open(tmp_path / "ray", config.as_dict())
    first = []

    def interrupt_after_two(key, skipped):
        first.append(key)
        if len(first) == 2:
            raise KeyboardInterrupt  # as Ctrl-C in the driver would

    with RayExecutor(ExecutorConfig("ray")) as executor:
        with pytest.raises(KeyboardInterrupt):
            executor.run(config, DOCS, finite_pairs, store, on_unit=interrupt_after_two)
    assert len(list((tmp_path / "ray" / "replicates").glob("*.parquet"))) == 2
    assert all(store.is_done(key) for key in first)
    calls = []
    with RayExecutor(ExecutorConfig("ray")) as executor:
        ran = executor.run(config, DOCS, finite_pairs, store,
                           on_unit=lambda key, skipped: calls.append((key, skipped)))
    assert ran == 4 and sorted(k.doc_id + k.action for k, s in calls if s) \
        == sorted(k.doc_id + k.action for k in first)
    assert_same_units(tmp_path / "ray", tmp_path / "local", units=6)


def test_retries_are_bounded_and_the_error_names_the_unit(ray_cluster, tmp_path):
    config = RunConfig(model="finite", actions=("mild", "strong"), replicates=4, horizon=5)
    markers = tmp_path / "deaths"
    markers.mkdir()
    store = RunStore.open(tmp_path / "ray", config.as_dict())
    with RayExecutor(ExecutorConfig("ray", max_retries=1)) as executor:
        with pytest.raises(UnitFailed) as info:
            executor.run(config, DOCS[:2], DyingFinitePairs(str(markers), deaths=99), store)
    assert "finite · doc1 · strong failed: its worker died 2 times (max_retries = 1)" \
        in str(info.value)
    assert len(os.listdir(markers)) == 2
    victim = UnitKey(model="finite", doc_id="doc1", action="strong", stratum="a")
    assert not store.is_done(victim)
    assert store.is_done(replace(victim, action="mild"))  # finished before the victim started


def test_bad_executor_input_gets_one_line(ray_cluster, tiny_model_dir, tmp_path):
    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id="d0", prompt="The cat sat on the mat.")], docs)
    base = ["run", "--model", str(tiny_model_dir), "--docs", str(docs), "--actions",
            "snapkv-half", "--replicates", "2", "--horizon", "3", "--device", "cpu"]
    config = tmp_path / "gpu.toml"
    config.write_text(f"""
[study]
models = ["{tiny_model_dir}"]
actions = ["snapkv-half"]
executor = "ray"
gpus_per_worker = 1

[[documents]]
source = "jsonl"
path = "{docs}"
""")
    cases = [
        (base + ["--out", str(tmp_path / "a"), "--executor", "magic"],
         "error: executor must be one of local, ray; got 'magic'"),
        (base + ["--out", str(tmp_path / "b"), "--ray-address", "127.0.0.1:1"],
         "cannot reach a Ray cluster at 127.0.0.1:1"),
        (["study", str(config), "--out", str(tmp_path / "c"), "--no-report"],
         "gpus_per_worker = 1 asked for, but the local Ray instance has no GPUs"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        text = " ".join(result.output.split())  # the console wraps long lines
        assert message in text and "Traceback" not in text and text.count("error:") == 1


@pytest.mark.slow
def test_an_interrupted_ray_driver_leaves_no_ray_process_behind(tiny_model_dir, tmp_path):
    """Ctrl-C in the driver: it exits with 130 and every Ray process it started (GCS, raylet,
    workers, agents) is gone within 10 s of its exit (their process tree is followed)."""
    import subprocess
    import time

    import psutil

    from kvdrift.data import Document, write_jsonl

    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id=f"d{i}", prompt="The cat sat on the mat. " * 40)
                 for i in range(4)], docs)
    code = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv = ['kvdrift'] + sys.argv[1:]; from kvdrift.cli import main; main()")
    driver = subprocess.Popen(
        [sys.executable, "-c", code, "run", "--executor", "ray", "--model", str(tiny_model_dir),
         "--docs", str(docs), "--actions", "full,snapkv-half", "--replicates", "2",
         "--horizon", "2000", "--out", str(tmp_path / "out"), "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and driver.poll() is None:
        procs = psutil.Process(driver.pid).children(recursive=True)
        seen |= {p.pid for p in procs}
        if any("UnitWorker" in " ".join(_cmdline(p)) for p in procs):
            break
        time.sleep(0.5)
    assert driver.poll() is None, driver.communicate()[0].decode()
    time.sleep(3)  # units running
    seen |= {p.pid for p in psutil.Process(driver.pid).children(recursive=True)}
    driver.send_signal(signal.SIGINT)
    output = driver.communicate(timeout=600)[0].decode()  # hang guards only, not bounds:
    assert driver.returncode == 130, output  # what is checked is that each process ended
    assert "interrupted" in output
    _, alive = psutil.wait_procs([p for p in map(_process, seen) if p is not None], timeout=300)
    assert not alive, [(p.pid, _cmdline(p)) for p in alive]


def _process(pid: int):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _cmdline(p) -> list[str]:
    import psutil

    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []
