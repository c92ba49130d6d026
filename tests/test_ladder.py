"""The ladder of observation windows (analysis/features.py): for rollouts, every ladder depth
below H gets its sharp interval from the step records, equal to the one recorded at that depth;
a recorded depth is not duplicated; SWRB gets only what it recorded."""

from __future__ import annotations

import pytest

from kvdrift.analysis import features
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.data.document import Document
from kvdrift.finite import random_pair
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore

DOCS = [Document(id=f"d{i:02d}", prompt="x", stratum="s" if i < 7 else "t") for i in range(12)]


def bounds(tmp_path, depths, estimator="rollout"):
    pair = random_pair(3, 6, seed=4, mix=0.5)
    cfg = RunConfig(model="finite", actions=("a",), replicates=5, horizon=6, seed=2,
                    depths=depths, estimator=estimator)
    store = RunStore.open(tmp_path / f"{estimator}-{'-'.join(map(str, depths))}", cfg.as_dict())
    run_units(cfg, DOCS, lambda d, a: pair, store)
    out = analyze(store.read("steps").to_pandas(), store.read("replicates").to_pandas(),
                  AnalysisOptions(bootstrap=20)).to_json()
    return {b["L"]: b for b in out["actions"][0]["bounds"]}


def test_the_ladder_below_h_comes_from_the_steps_and_equals_the_recorded_depths(
        tmp_path, monkeypatch):
    monkeypatch.setattr(features, "LADDER", (2, 4, 6, 64))  # H = 6: 2 and 4 only
    derived = bounds(tmp_path, ())
    recorded = bounds(tmp_path, (2, 4))
    assert sorted(derived) == sorted(recorded) == [2, 4]
    for L in (2, 4):
        for key in ("R_L", "B_L", "lo", "hi", "hoeffding_lo", "hoeffding_hi"):
            assert derived[L][key] == pytest.approx(recorded[L][key], abs=1e-12), (L, key)
    assert derived[2]["B_L"] > derived[4]["B_L"] > 0  # a longer window leaves less unseen
    both = bounds(tmp_path, (1, 4))  # recorded depths kept, the ladder fills in the others
    assert sorted(both) == [1, 2, 4]


def test_swrb_keeps_only_its_recorded_depths(tmp_path, monkeypatch):
    monkeypatch.setattr(features, "LADDER", (2, 4))
    assert sorted(bounds(tmp_path, (3,), "swrb")) == [3]


def test_the_shipped_ladder():
    assert features.LADDER == (64, 256, 1024)
