"""The record schema: every column a unit writes is declared there, with the type it has."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from kvdrift.data.document import Document
from kvdrift.directory import StudyDirectory
from kvdrift.finite import random_pair
from kvdrift.records.depths import DepthTerms, depth_arrays, depth_terms
from kvdrift.records.schema import REPLICATES, STEPS
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore
from kvdrift.study_config import load_study, recorded_study

DOCS = [Document(id=f"doc{i}", prompt="p", stratum="a" if i < 2 else "b") for i in range(3)]


@pytest.mark.parametrize("estimator", ["rollout", "swrb"])
def test_every_written_column_is_declared_with_its_type(tmp_path, estimator):
    cfg = RunConfig(model="f", actions=("a",), replicates=3, horizon=4, seed=1,
                    estimator=estimator, depths=(1, 3))
    store = RunStore.open(tmp_path, cfg.as_dict())
    run_units(cfg, DOCS, lambda d, a: random_pair(3, 4, seed=7, mix=0.6, eos_token_id=2), store)
    for table, declared in (("steps", STEPS), ("replicates", REPLICATES)):
        schema = store.read(table).schema
        types = {c.name: c.dtype for c in declared}
        for field in schema:
            assert field.name in types, f"{table}.{field.name} is not in the schema"
            assert field.type == types[field.name], field.name
    reps = store.read("replicates")
    assert {"depths", "observed", "capacity"} <= set(reps.column_names)
    assert depth_terms(reps.to_pandas()).depths == (1, 3)


def test_depth_terms_are_written_and_read_back_in_one_place():
    observed = np.array([[0.5, 0.25, 0.0], [0.1, 0.2, 0.3]])
    capacity = np.array([[0.0, 0.5, 0.75], [0.9, 0.8, 0.7]])
    table = pa.table(depth_arrays(DepthTerms((2, 4, 12), observed, capacity)))
    assert table.to_pydict()["depths"] == [[2, 4, 12], [2, 4, 12]]
    back = depth_terms(table.to_pandas())
    assert back.depths == (2, 4, 12)
    assert np.array_equal(back.observed, observed) and np.array_equal(back.capacity, capacity)
    none = depth_terms(pa.table(depth_arrays(DepthTerms((), np.empty((3, 0)),
                                                        np.empty((3, 0))))).to_pandas())
    assert none.depths == () and none.observed.shape == (3, 0)


def test_records_that_mix_depths_are_refused():
    one = pa.table(depth_arrays(DepthTerms((2,), np.zeros((1, 1)), np.zeros((1, 1)))))
    two = pa.table(depth_arrays(DepthTerms((2, 4), np.zeros((1, 2)), np.zeros((1, 2)))))
    mixed = pd.concat([one.to_pandas(), two.to_pandas()])
    with pytest.raises(ValueError, match=r"mix observation depths \[\(2,\), \(2, 4\)\]"):
        depth_terms(mixed)
    short = one.to_pandas().assign(observed=[np.zeros(2)])
    with pytest.raises(ValueError, match="observed lists do not hold one value per depth"):
        depth_terms(short)


@pytest.mark.parametrize("name", ["cpu-demo", "cpu-dev", "paper-study2"])
def test_a_recorded_study_parses_back_into_its_config(name):
    from importlib import resources

    config = load_study(resources.files("kvdrift.configs") / f"{name}.toml")
    assert recorded_study(config.as_dict() | {"documents_sha256": "0" * 64}) == config


def test_a_store_of_units_run_without_a_study_has_no_study(tmp_path):
    cfg = RunConfig(model="f", actions=("a",), replicates=2, horizon=3)
    RunStore.open(tmp_path, cfg.as_dict())
    directory = StudyDirectory(tmp_path)
    assert directory.study is None and directory.temperature == 1.0
    assert directory.options().endpoints == ()


def test_an_estimator_is_parsed_once_and_stored_by_name():
    from kvdrift.run.estimators import SWRB, parse_estimator

    cfg = RunConfig(model="f", estimator="swrb")
    assert cfg.estimator == SWRB() and parse_estimator(cfg.estimator) is cfg.estimator
    assert cfg.as_dict()["estimator"] == "swrb"
    with pytest.raises(ValueError, match="^unknown estimator 'magic'; allowed: rollout, swrb$"):
        RunConfig(model="f", estimator="magic")


def test_the_records_say_what_their_estimator_holds():
    from kvdrift.records.schema import recorded_estimator
    from kvdrift.run.estimators import ESTIMATORS

    assert recorded_estimator("rollout").complete_branches
    assert not recorded_estimator("swrb").complete_branches
    assert all(e.records is recorded_estimator(name) for name, e in ESTIMATORS.items())
    with pytest.raises(ValueError, match="^unknown estimator 'x'; allowed: rollout, swrb$"):
        recorded_estimator("x")
