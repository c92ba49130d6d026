"""Stores written with one replicate column per depth (``observed_L{L}``, ``capacity_L{L}``)
are read in the current layout: they analyse exactly like the same records written now, and
a resumed one (old units beside new ones) too."""

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvdrift.data.document import Document
from kvdrift.directory import StudyDirectory
from kvdrift.finite import random_pair
from kvdrift.records.depths import depth_terms
from kvdrift.records.legacy import current_layout
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore

DOCS = [Document(id=f"doc{i}", prompt="p", stratum="a" if i < 3 else "b") for i in range(6)]
DEPTH_NAMES = ["depths", "observed", "capacity"]


def pairs(doc, action):
    return random_pair(3, 4, seed=len(doc.id) + DOCS.index(doc) + 7 * (action == "b"),
                       mix=0.6, eos_token_id=2)


def wide_layout(table: pa.Table) -> pa.Table:
    """A replicate table as kvdrift wrote it before depths were one column: a pair of float64
    columns per depth where the list columns are (none without depths), metadata kept."""
    terms = depth_terms(table.to_pandas())
    at = table.column_names.index("depths")
    out = table.drop_columns(DEPTH_NAMES)
    for i, L in enumerate(terms.depths):
        for prefix, values in (("observed", terms.observed), ("capacity", terms.capacity)):
            out = out.add_column(at, f"{prefix}_L{L}", pa.array(values[:, i], pa.float64()))
            at += 1
    return out.replace_schema_metadata(table.schema.metadata)


def make_old(new, old):
    """Copy the store ``new`` to ``old``, its replicate files rewritten in the wide layout."""
    shutil.copytree(new, old)
    for f in (old / "replicates").glob("*.parquet"):
        pq.write_table(wide_layout(pq.read_table(f)), f)


def analysis(path) -> str:
    return json.dumps(StudyDirectory(path).analyze(bootstrap=40).to_json(), sort_keys=True)


SETTINGS = [dict(estimator="rollout", depths=(1, 3)), dict(estimator="swrb", depths=(2,)),
            dict(estimator="rollout", depths=())]


@pytest.mark.parametrize("settings", SETTINGS, ids=["rollout", "swrb", "no-depths"])
def test_an_old_store_analyses_identically_and_resumes(tmp_path, settings):
    cfg = RunConfig(model="f", actions=("a", "b"), replicates=3, horizon=4, seed=2, **settings)
    new, old = tmp_path / "new", tmp_path / "old"
    run_units(cfg, DOCS, pairs, RunStore.open(new, cfg.as_dict()))
    make_old(new, old)
    files = sorted((old / "replicates").glob("*.parquet"))
    wide = [n for n in pq.read_schema(files[0]).names if n.endswith(("_L1", "_L2", "_L3"))]
    assert len(wide) == 2 * len(cfg.depths)
    assert not set(DEPTH_NAMES) & set(pq.read_schema(files[0]).names)  # truly the old layout
    assert analysis(old) == analysis(new)
    read = RunStore(old).read("replicates")
    assert read.schema == RunStore(new).read("replicates").schema  # one layout, same order

    # Resume: drop half the old units; the rerun writes them in the new layout beside the old.
    for f in files[::2]:
        for kind in ("replicates", "steps"):
            (old / kind / f.name).unlink()
    assert run_units(cfg, DOCS, pairs, RunStore.open(old, cfg.as_dict())) == len(files[::2])
    layouts = {"depths" in pq.read_schema(f).names
               for f in (old / "replicates").glob("*.parquet")}
    assert layouts == {True, False}
    assert analysis(old) == analysis(new)


def test_a_selection_of_columns_is_returned_as_read(tmp_path):
    cfg = RunConfig(model="f", actions=("a",), replicates=2, horizon=4, depths=(2,))
    run_units(cfg, DOCS, pairs, RunStore.open(tmp_path / "new", cfg.as_dict()))
    make_old(tmp_path / "new", tmp_path / "old")
    picked = RunStore(tmp_path / "old").read("replicates", ["doc_id", "risk"])
    assert picked.column_names == ["doc_id", "risk"]
    steps = pq.read_table(next((tmp_path / "old" / "steps").glob("*.parquet")))
    assert current_layout("steps", steps) is steps
