"""Records, runner and store pinned by hand-computed values and independent derivations.

Fast (small K): these are the tests ``scripts/mutation.sh`` runs against ``kvdrift.run``.
Statistical checks use |z| < 4.5 (false alarm about 7e-6 each, 6 checks: below 5e-5).
"""

import hashlib

import numpy as np
import pytest
import torch

import kvdrift.run.store as store_module
from kvdrift.data.document import Document
from kvdrift.estimate import RolloutResult, SWRBResult, coupled_rollouts, swrb
from kvdrift.finite import exact, random_pair
from kvdrift.records.depths import depth_terms
from kvdrift.records.schema import TIMING_COLUMNS
from kvdrift.run.records import UnitKey, rollout_tables, swrb_tables
from kvdrift.run.runner import (
    RunConfig,
    run_estimator,
    run_units,
    unit_seed,
    with_timing,
)
from kvdrift.run.store import RunStore, unit_name
from tests.messages import whole

KEY = UnitKey(model="m", doc_id="d", action="a", stratum="s")
PAIR = random_pair(3, 4, seed=7, mix=0.6, eos_token_id=2)
DOCS = [Document(id=f"doc{i}", prompt="p", stratum="a" if i < 2 else "b") for i in range(3)]


def rollout_result():
    # Two replicates, H = 3: row 0 diverges at 2 and re-agrees at 3; row 1 never diverges.
    m = torch.tensor([[False, True, False], [False, False, False]])
    return RolloutResult(
        x=torch.tensor([[0, 1, 2], [1, 1, 1]]), y=torch.tensor([[0, 0, 2], [1, 1, 1]]),
        mismatch=m, delta=torch.tensor([[0.0, 0.5, 0.25], [0.0, 0.1, 0.2]], dtype=torch.float64),
        f=torch.tensor([[0.0, 0.3, 0.6], [0.0, 0.0, 0.3]], dtype=torch.float64),
        x_eos=torch.tensor([[False, False, True], [False, False, False]]),
        y_eos=torch.tensor([[False, False, True], [False, False, False]]),
        tau=torch.tensor([2, 0]), evaluations=6)


def test_rollout_tables_hand_values():
    steps, reps = rollout_tables(KEY, rollout_result(), depths=(1, 2))
    s = steps.to_pydict()
    assert s["replicate"] == [0, 0, 0, 1, 1, 1] and s["t"] == [1, 2, 3, 1, 2, 3]
    assert s["x_token"] == [0, 1, 2, 1, 1, 1] and s["y_token"] == [0, 0, 2, 1, 1, 1]
    assert s["mismatch"] == [False, True, False, False, False, False]
    assert s["delta"] == [0.0, 0.5, 0.25, 0.0, 0.1, 0.2]
    assert s["f"] == [0.0, 0.3, 0.6, 0.0, 0.0, 0.3]
    assert s["tau"] == [2, 2, 2, 0, 0, 0]
    assert s["x_eos"] == [False, False, True, False, False, False]
    assert s["y_eos"] == [False, False, True, False, False, False]
    assert set(s["model"]) == {"m"} and set(s["doc_id"]) == {"d"} and set(s["action"]) == {"a"}
    assert set(s["stratum"]) == {"s"} and set(s["estimator"]) == {"rollout"}
    r = reps.to_pydict()
    assert r["replicate"] == [0, 1] and r["horizon"] == [3, 3] and r["tau"] == [2, 0]
    assert r["risk"] == pytest.approx([1 / 3, 0])
    assert r["occurrence"] == pytest.approx([1 / 3, 0])
    assert r["exposure"] == pytest.approx([1 / 3, 0])  # (H - tau) / H
    assert r["occupation"] == pytest.approx([0, 0])  # no mismatch after tau
    assert r["fixed_risk"] == pytest.approx([0.3, 0.1])
    assert r["evaluations"] == [3, 3]
    assert r["divergence_mass"] == [1.0, 0.0] and r["entry_time_mass"] == [2.0, 0.0]
    assert r["depths"] == [[1, 2], [1, 2]]  # per row, then each depth's terms in that order
    np.testing.assert_allclose(r["observed"], [[1 / 3, 1 / 3], [0, 0]])
    np.testing.assert_allclose(r["capacity"], [[1 / 3, 0], [0, 0]])  # (H - tau - L + 1)_+ / H
    assert set(r["estimator"]) == {"rollout"} and set(r["stratum"]) == {"s"}


def swrb_result():
    # Two replicates, H = 3. Row 0: scan e = (0, 0.5, 0.5), J = 2, continuation 1, 0.
    # Row 1: no divergence possible (M = 0).
    w = torch.tensor([[0.0, 0.5, 0.25], [0.0, 0.0, 0.0]], dtype=torch.float64)
    return SWRBResult(
        depths=(1, 3), z_R=torch.tensor([0.25, 0.0], dtype=torch.float64),
        z_O=torch.tensor([0.25, 0.0], dtype=torch.float64),
        z_Pi=torch.tensor([0.0, 0.0], dtype=torch.float64),
        z_L=torch.tensor([[0.25, 0.25], [0.0, 0.0]], dtype=torch.float64),
        z_tail=torch.tensor([[0.0, 0.0], [0.0, 0.0]], dtype=torch.float64),
        w_L=torch.tensor([[0.25, 0.0], [0.0, 0.0]], dtype=torch.float64),
        M=torch.tensor([0.75, 0.0], dtype=torch.float64), J=torch.tensor([2, 0]),
        overlap_tv=torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]], dtype=torch.float64),
        weights=w, shared=torch.tensor([[1, 0, 1], [0, 1, 1]]),
        x=torch.tensor([[-1, 0, 1], [-1, -1, -1]]), y=torch.tensor([[-1, 1, 1], [-1, -1, -1]]),
        mismatch=torch.tensor([[False, True, False], [False, False, False]]),
        evaluations=torch.tensor([4, 3]))


def test_swrb_tables_hand_values():
    steps, reps = swrb_tables(KEY, swrb_result())
    s = steps.to_pydict()
    assert s["replicate"] == [0, 0, 0, 1, 1, 1] and s["t"] == [1, 2, 3, 1, 2, 3]
    assert s["x_token"] == [-1, 0, 1, -1, -1, -1] and s["y_token"] == [-1, 1, 1, -1, -1, -1]
    assert s["mismatch"] == [False, True, False, False, False, False]
    assert s["tau"] == [2, 2, 2, 0, 0, 0]
    assert s["shared_token"] == [1, 0, 1, 0, 1, 1]
    assert s["scan_tv"] == [0.0, 0.5, 0.5, 0.0, 0.0, 0.0]
    assert s["weight"] == [0.0, 0.5, 0.25, 0.0, 0.0, 0.0]
    assert np.isnan(s["delta"]).all() and np.isnan(s["f"]).all()
    assert not any(s["x_eos"]) and not any(s["y_eos"]) and set(s["estimator"]) == {"swrb"}
    r = reps.to_pydict()
    assert r["tau"] == [2, 0] and r["horizon"] == [3, 3] and r["replicate"] == [0, 1]
    assert r["risk"] == [0.25, 0.0] and r["occurrence"] == [0.25, 0.0]
    assert r["occupation"] == [0.0, 0.0]
    assert r["exposure"] == pytest.approx([(0.5 * 1 + 0.25 * 0) / 3, 0])  # sum w_s (H - s) / H
    assert r["entry_time_mass"] == pytest.approx([0.5 * 2 + 0.25 * 3, 0])  # sum w_s s
    assert r["divergence_mass"] == [0.75, 0.0] and r["evaluations"] == [4, 3]
    assert np.isnan(r["fixed_risk"]).all()
    assert r["depths"] == [[1, 3], [1, 3]]
    assert r["observed"] == [[0.25, 0.25], [0.0, 0.0]]  # z_L's rows
    assert r["capacity"] == [[0.25, 0.0], [0.0, 0.0]]  # w_L's rows


def test_replicate_batches_continue_one_generator():
    # Batches draw in turn from ONE generator seeded once: reseeding every batch (or
    # starting each batch from the same state) gives different records.
    cfg = RunConfig(model="f", actions=("a",), replicates=10, horizon=4, batch=4, seed=0)
    got = run_estimator(cfg, PAIR, seed=123)
    gen = torch.Generator().manual_seed(123)
    parts = [coupled_rollouts(PAIR, n, 4, 1.0, gen) for n in (4, 4, 2)]
    assert torch.equal(got.x, torch.cat([p.x for p in parts]))
    assert torch.equal(got.y, torch.cat([p.y for p in parts]))
    assert torch.equal(got.delta, torch.cat([p.delta for p in parts]))
    assert got.evaluations == 40
    assert not torch.equal(got.x[:4], got.x[4:8])  # the second batch is not a replay
    cfg_s = RunConfig(model="f", actions=("a",), replicates=10, horizon=4, batch=4,
                      estimator="swrb", depths=(2,), temperature=0.5)
    got_s = run_estimator(cfg_s, PAIR, seed=9)
    gen = torch.Generator().manual_seed(9)
    parts_s = [swrb(PAIR, n, 4, (2,), 0.5, gen) for n in (4, 4, 2)]
    assert torch.equal(got_s.z_R, torch.cat([p.z_R for p in parts_s]))
    assert torch.equal(got_s.J, torch.cat([p.J for p in parts_s]))
    assert got_s.depths == (2,) and got_s.replicates == 10


def test_unit_seed_is_sha256_of_seed_and_document():
    digest = hashlib.sha256(b"3\x00doc1").digest()
    assert unit_seed(3, "doc1") == int.from_bytes(digest[:8], "little") >> 1
    assert unit_seed(3, "doc1") < 2**63 and unit_seed(3, "doc1") != unit_seed(4, "doc1")


def window_by_hand(row, L):
    """(observed, capacity) of one complete rollout at depth L, by a plain loop over t."""
    H = len(row)
    tau = next((t for t in range(1, H + 1) if row[t - 1]), None)
    if tau is None:
        return 0.0, 0.0
    observed = sum(1 for t in range(tau, min(tau + L, H + 1)) if row[t - 1])
    return observed / H, max(H - tau - L + 1, 0) / H


def test_units_use_document_seeds_shared_across_actions(tmp_path):
    cfg = RunConfig(model="f", actions=("a", "b"), replicates=6, horizon=4, seed=3,
                    temperature=0.8, depths=(1, 3))
    store = RunStore.open(tmp_path, cfg.as_dict())
    seen, built = [], []
    # One pair per (document, action): a runner that passes another document (or action)
    # to the factory, or runs a unit on another unit's pair, writes other records.
    pairs = {(d.id, a): random_pair(3, 4, seed=10 + 2 * i + j, mix=0.6, eos_token_id=2)
             for i, d in enumerate(DOCS) for j, a in enumerate(("a", "b"))}

    def factory(doc, action):
        assert doc in DOCS
        built.append((doc.id, action))
        return pairs[(doc.id, action)]

    def on_unit(key, skipped):
        seen.append((key.doc_id, key.action, key.stratum, skipped))

    assert run_units(cfg, DOCS, factory, store, on_unit=on_unit) == 6
    assert seen == [(d.id, a, d.stratum, False) for d in DOCS for a in ("a", "b")]
    assert built == [(d.id, a) for d in DOCS for a in ("a", "b")]
    reps = store.read("replicates").to_pandas()
    steps = store.read("steps").to_pandas()
    for doc in DOCS:
        for action in ("a", "b"):  # every action of a document draws with the same seed
            want = coupled_rollouts(pairs[(doc.id, action)], 6, 4, 0.8, unit_seed(3, doc.id))
            unit = (reps.doc_id == doc.id) & (reps.action == action)
            got = reps[unit].sort_values("replicate")
            assert got["tau"].tolist() == want.tau.tolist()
            np.testing.assert_allclose(got["fixed_risk"], want.f.mean(dim=1).numpy())
            assert set(got["stratum"]) == {doc.stratum} and set(got["model"]) == {"f"}
            rows = steps[(steps.doc_id == doc.id) & (steps.action == action)]
            rows = rows.sort_values(["replicate", "t"])
            assert rows["x_token"].tolist() == want.x.ravel().tolist()
            # The configured depths reach the records: window terms at L = 1 and 3.
            terms = depth_terms(got)
            assert terms.depths == (1, 3)
            for i, L in enumerate(terms.depths):
                hand = [window_by_hand(r, L) for r in want.mismatch.tolist()]
                assert terms.observed[:, i].tolist() == pytest.approx([h[0] for h in hand])
                assert terms.capacity[:, i].tolist() == pytest.approx([h[1] for h in hand])
    assert (depth_terms(reps).capacity > 0).any()  # not all zero
    assert run_units(cfg, DOCS, factory, store, on_unit=on_unit) == 0
    assert seen[6:] == [(d.id, a, d.stratum, True) for d in DOCS for a in ("a", "b")]
    assert len(built) == 6  # finished units build no pair


def test_swrb_replicate_records_match_exact_means(tmp_path):
    cfg = RunConfig(model="f", actions=("a",), replicates=1500, horizon=4, seed=1,
                    estimator="swrb", depths=(2,))
    store = RunStore.open(tmp_path, cfg.as_dict())
    run_units(cfg, DOCS[:1], lambda d, a: PAIR, store)
    reps = store.read("replicates").to_pandas()
    truth = exact(PAIR)
    s = np.arange(1, 5)
    terms = depth_terms(reps)
    assert terms.depths == (2,)
    for column, value in (("exposure", truth.E), ("occurrence", truth.O),
                          ("occupation", truth.Pi), ("divergence_mass", truth.p_tau.sum()),
                          ("entry_time_mass", (s * truth.p_tau).sum()),
                          ("capacity", truth.B_L(2))):
        x = terms.capacity[:, 0] if column == "capacity" else reps[column].to_numpy()
        assert abs(x.mean() - value) < 4.5 * x.std(ddof=1) / np.sqrt(x.size), column


def test_crash_between_the_two_files_of_a_unit_is_redone(tmp_path, monkeypatch):
    cfg = RunConfig(model="f", actions=("a", "b"), replicates=5, horizon=4, seed=2)
    whole = RunStore.open(tmp_path / "whole", cfg.as_dict())
    run_units(cfg, DOCS, lambda d, a: PAIR, whole)

    real = store_module._write_atomically
    writes = []

    def crash_on_third_replicate_file(table, folder, name):
        if folder.path.name != "documents":  # a document is written with its first unit
            writes.append(folder.path / name)
        if folder.path.name == "replicates" and len(writes) == 6:
            raise KeyboardInterrupt  # killed after the steps file of unit 3 was written
        real(table, folder, name)

    monkeypatch.setattr(store_module, "_write_atomically", crash_on_third_replicate_file)
    store = RunStore.open(tmp_path / "crashed", cfg.as_dict())
    with pytest.raises(KeyboardInterrupt):
        run_units(cfg, DOCS, lambda d, a: PAIR, store)
    monkeypatch.setattr(store_module, "_write_atomically", real)
    assert len(list((store.root / "steps").glob("*.parquet"))) == 3  # one orphan steps file
    assert store.read("steps").num_rows == 2 * 5 * 4  # the orphan is not read
    assert store.read("replicates").num_rows == 2 * 5
    third = UnitKey("f", DOCS[1].id, "a", DOCS[1].stratum)
    assert not store.is_done(third)
    ran = run_units(cfg, DOCS, lambda d, a: PAIR, RunStore.open(store.root, cfg.as_dict()))
    assert ran == 4
    order = [("doc_id", "ascending"), ("action", "ascending"), ("replicate", "ascending"),
             ("t", "ascending")]
    assert store.read("steps").sort_by(order).equals(whole.read("steps").sort_by(order))
    def records(st: RunStore):  # the measured wall times differ between any two runs
        return st.read("replicates").drop_columns(list(TIMING_COLUMNS)).sort_by(order[:3])

    assert records(store).equals(records(whole))
    assert not list(store.root.rglob("*.tmp-*"))  # no temporary files left behind


def test_store_metadata_names_and_errors(tmp_path):
    cfg = RunConfig(model="f", actions=("a",), replicates=2, horizon=3)
    store = RunStore.open(tmp_path / "r", cfg.as_dict())
    meta = store.metadata
    assert meta["config"] == cfg.as_dict() and meta["versions"]["numpy"] == np.__version__
    with pytest.raises(ValueError, match="has no finished units yet"):
        store.read("steps")
    with pytest.raises(ValueError, match=whole(
            "record kind must be one of steps, replicates; got 'bogus'")):
        store.read("bogus")
    with pytest.raises(FileNotFoundError, match=whole(
            f"{tmp_path / 'empty'} does not exist; name a run or study directory")):
        _ = RunStore(tmp_path / "empty").metadata
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=whole(
            f"{tmp_path / 'empty'} is not a kvdrift run or study directory (it has no "
            "run.json)")):
        _ = RunStore(tmp_path / "empty").metadata
    with pytest.raises(ValueError, match=r"differs in: horizon, replicates\)"):
        RunStore.open(tmp_path / "r", RunConfig(model="f", actions=("a",), replicates=3,
                                                horizon=4).as_dict())
    a = unit_name(UnitKey("m", "doc/1", "snapkv:ratio=0.5"))
    b = unit_name(UnitKey("m", "doc_1", "snapkv:ratio=0.5"))
    assert a != b and "/" not in a and a.startswith("snapkv_ratio_0.5__doc_1-")
    with pytest.raises(ValueError, match="no documents to run"):
        run_units(cfg, [], lambda d, a: PAIR, store)


STEP_TYPES = {"model": "string", "doc_id": "string", "stratum": "string", "action": "string",
              "estimator": "string", "replicate": "int32", "t": "int32", "x_token": "int64",
              "y_token": "int64", "mismatch": "bool", "delta": "double", "f": "double",
              "tau": "int32", "x_eos": "bool", "y_eos": "bool"}
REPLICATE_TYPES = {"model": "string", "estimator": "string", "replicate": "int32",
                   "horizon": "int32", "tau": "int32", "risk": "double", "evaluations": "int64",
                   "divergence_mass": "double", "entry_time_mass": "double"}


def test_record_schemas_are_the_same_for_both_estimators():
    # Units are concatenated across estimators and runs: the column types are part of the
    # stored format (a float tau or replicate index would not join with older units).
    for steps, reps in (rollout_tables(KEY, rollout_result(), (1,)),
                        swrb_tables(KEY, swrb_result())):
        assert {k: str(steps.schema.field(k).type) for k in STEP_TYPES} == STEP_TYPES
        assert {k: str(reps.schema.field(k).type) for k in REPLICATE_TYPES} == REPLICATE_TYPES
    steps, reps = swrb_tables(KEY, swrb_result())
    assert str(steps.schema.field("shared_token").type) == "int64"
    assert reps.column("estimator").to_pylist() == ["swrb", "swrb"]


def test_divergence_at_the_first_position_counts():
    r = rollout_result()
    m = torch.tensor([[True, False, False], [False, False, False]])
    r = RolloutResult(x=r.x, y=r.y, mismatch=m, delta=r.delta, f=r.f, x_eos=r.x_eos,
                      y_eos=r.y_eos, tau=torch.tensor([1, 0]), evaluations=6)
    _, reps = rollout_tables(KEY, r)
    assert reps.column("divergence_mass").to_pylist() == [1.0, 0.0]
    assert reps.column("entry_time_mass").to_pylist() == [1.0, 0.0]
    assert reps.column("exposure").to_pylist() == pytest.approx([2 / 3, 0])


def test_store_names_versions_and_reads_by_hand(tmp_path, monkeypatch):
    key = UnitKey("m", "Doc-" + "x" * 70, "SnapKV:Ratio=0.5")
    digest = hashlib.sha1("m\0Doc-{}\0SnapKV:Ratio=0.5".format("x" * 70).encode()).hexdigest()
    readable = ("SnapKV_Ratio_0.5__Doc-" + "x" * 70)[:60]  # upper case kept, 60 characters
    assert unit_name(key) == f"{readable}-{digest[:12]}"

    def version(name):
        if name == "kvpress":
            raise store_module.metadata.PackageNotFoundError(name)
        return "1.0"

    monkeypatch.setattr(store_module.metadata, "version", version)
    versions = store_module.package_versions()
    assert versions["kvpress"] == "not installed" and versions["numpy"] == "1.0"
    assert versions["python"] == store_module.platform.python_version()
    monkeypatch.undo()

    # A nested, not yet existing directory is created; a key missing on one side is a
    # difference too.
    cfg = RunConfig(model="f", actions=("a",), replicates=2, horizon=3).as_dict()
    store = RunStore.open(tmp_path / "a" / "b", cfg)
    message = (r"differs in: extra_key\); rerun with the same arguments to resume, or use "
               r"another output directory$")
    with pytest.raises(ValueError, match=message):
        RunStore.open(tmp_path / "a" / "b", cfg | {"extra_key": 1})
    run_units(RunConfig(**cfg), DOCS[:1], lambda d, a: PAIR, store)
    assert store.read("replicates", columns=["tau", "risk"]).column_names == ["tau", "risk"]


def test_run_config_normalises_and_refuses_by_hand():
    cfg = RunConfig(actions=["a", "b"], depths=[3, 1, 3], horizon=4, temperature=0)
    assert cfg.actions == ("a", "b") and isinstance(cfg.actions, tuple)
    assert cfg.depths == (1, 3) and cfg.temperature == 0  # greedy is allowed
    with pytest.raises(ValueError, match=whole(
            "actions must be one or more distinct names (e.g. snapkv-half); got []")):
        RunConfig(actions=())
    with pytest.raises(ValueError, match=whole(
            "actions must be one or more distinct names (e.g. snapkv-half); got ['a', 'a']")):
        RunConfig(actions=("a", "a"))
    with pytest.raises(ValueError, match="batch must be an integer >= 0"):
        RunConfig(batch=1.5)
    with pytest.raises(ValueError, match="^no documents to run$"):
        run_units(RunConfig(), [], lambda d, a: PAIR, None)


def test_timing_columns_by_hand_and_measured_within_the_wall_time(tmp_path):
    import time

    import pyarrow as pa

    t = with_timing(pa.table({"replicate": [0, 1, 2, 3]}), 2, 8)
    assert t.column(TIMING_COLUMNS[0]).to_pylist() == [2.0] * 4
    assert t.column(TIMING_COLUMNS[1]).to_pylist() == [2.0] * 4  # 8 s over 4 replicates
    assert [str(t.schema.field(c).type) for c in TIMING_COLUMNS] == ["double", "double"]
    cfg = RunConfig(model="f", actions=("a",), replicates=8, horizon=4, batch=4, seed=1)
    store = RunStore.open(tmp_path, cfg.as_dict())
    start = time.perf_counter()
    run_units(cfg, DOCS[:1], lambda d, a: PAIR, store)
    wall = time.perf_counter() - start
    reps = store.read("replicates").to_pandas()
    assert sorted(reps["replicate"]) == list(range(8))  # two batches of 4, both kept
    assert ((reps[TIMING_COLUMNS[0]] >= 0) & (reps[TIMING_COLUMNS[0]] <= wall)).all()
    assert 0 <= reps[TIMING_COLUMNS[1]].sum() <= wall
