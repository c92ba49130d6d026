"""The runner and store on finite pairs: records, resume after interruption, summaries."""

import numpy as np
import pyarrow.compute as pc
import pytest

from kvdrift.analysis.bootstrap import stratum_weights
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.data.document import Document
from kvdrift.finite import exact, random_pair
from kvdrift.records.depths import depth_terms
from kvdrift.report.terminal import run_rows
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore
from tests.messages import whole

MIX = {"mild": 0.2, "strong": 0.7}
DOCS = [Document(id=f"doc{i}", prompt=f"prompt {i}", stratum="a" if i < 2 else "b")
        for i in range(4)]
STEP_COLUMNS = {"model", "doc_id", "action", "replicate", "t", "x_token", "y_token", "mismatch",
                "delta", "f", "tau", "x_eos", "y_eos"}


PAIRS = {a: random_pair(3, 5, seed=7, mix=m, eos_token_id=2) for a, m in MIX.items()}


def factory(doc, action):
    # The pair depends only on the action here; tests/test_run_exact.py uses one pair per
    # (document, action) and checks that each unit ran on its own document's pair.
    assert doc in DOCS
    return PAIRS[action]


def point_rows(steps, reps) -> dict[str, dict]:
    """``kvdrift run``'s rows (point estimates of the study analysis) by action."""
    return {r["action"]: r for r in run_rows(analyze(steps, reps, AnalysisOptions(bootstrap=0)))}


def config(**kw):
    base = dict(model="finite", actions=("mild", "strong"), replicates=400, horizon=5, seed=3)
    return RunConfig(**(base | kw))


def test_records_and_summary_match_exact(tmp_path):
    cfg = config(depths=(1, 3))
    store = RunStore.open(tmp_path, cfg.as_dict())
    assert run_units(cfg, DOCS, factory, store) == len(DOCS) * 2
    steps = store.read("steps")
    assert STEP_COLUMNS <= set(steps.column_names)
    assert steps.num_rows == len(DOCS) * 2 * 400 * 5
    assert set(pc.unique(steps["t"]).to_pylist()) == set(range(1, 6))
    reps = store.read("replicates").to_pandas()
    table = point_rows(store.read("steps").to_pandas(), reps)
    for action, mix in MIX.items():
        truth = exact(random_pair(3, 5, seed=7, mix=mix, eos_token_id=2))
        s = table[action]
        assert s["documents"] == len(DOCS)
        # Equal-size strata: the summary is the mean of 1,600 independent trajectories, so
        # each check allows 4.5 of its standard errors (false alarm ~7e-6 each, 6 checks).
        mine = reps[reps.action == action]
        for got, column, value in ((s["R"], "risk", truth.R), (s["F"], "fixed_risk", truth.F),
                                   (s["p_diverge"], "divergence_mass", truth.p_tau.sum())):
            se = mine[column].std(ddof=1) / np.sqrt(len(mine))
            assert abs(got - value) < 4.5 * se, (action, column)
        assert s["R"] == pytest.approx(s["O"] + s["E"] * s["C"])
        assert s["R_minus_F"] == pytest.approx(s["R_tv"] - s["F"])
        assert abs(s["R_tv"] - truth.R) < 4.5 * mine["risk_tv"].std(ddof=1) / np.sqrt(len(mine))


def test_swrb_through_the_runner(tmp_path):
    cfg = config(estimator="swrb", depths=(2,))
    store = RunStore.open(tmp_path, cfg.as_dict())
    run_units(cfg, DOCS, factory, store)
    reps = store.read("replicates").to_pandas()
    assert {"depths", "observed", "capacity", "divergence_mass"} <= set(reps.columns)
    assert depth_terms(reps).depths == (2,)  # SWRB's depths as configured
    strong = point_rows(store.read("steps").to_pandas(), reps)["strong"]
    truth = exact(random_pair(3, 5, seed=7, mix=0.7, eos_token_id=2))
    risk = reps[reps.action == "strong"]["risk"]
    assert abs(strong["R"] - truth.R) < 4.5 * risk.std(ddof=1) / np.sqrt(len(risk))
    assert np.isnan(strong["F"])


def test_interrupted_run_resumes_without_loss_or_duplicates(tmp_path):
    cfg = config(replicates=20)
    whole = RunStore.open(tmp_path / "whole", cfg.as_dict())
    run_units(cfg, DOCS, factory, whole)

    calls = []

    def flaky(doc, action):
        calls.append((doc.id, action))
        if len(calls) == 4:
            raise KeyboardInterrupt
        return factory(doc, action)

    store = RunStore.open(tmp_path / "resumed", cfg.as_dict())
    with pytest.raises(KeyboardInterrupt):
        run_units(cfg, DOCS, flaky, store)
    assert store.read("replicates").num_rows == 3 * 20
    skipped = []
    ran = run_units(cfg, DOCS, factory, RunStore.open(tmp_path / "resumed", cfg.as_dict()),
                    on_unit=lambda key, was_done: skipped.append(was_done))
    assert ran == 5 and sum(skipped) == 3
    sort = [("doc_id", "ascending"), ("action", "ascending"), ("replicate", "ascending"),
            ("t", "ascending")]
    a = whole.read("steps").sort_by(sort)
    b = store.read("steps").sort_by(sort)
    assert a.equals(b)


@pytest.mark.parametrize("estimator", ["rollout", "swrb"])
def test_replicate_batches_cover_all_replicates(tmp_path, estimator):
    cfg = config(replicates=20, batch=7, estimator=estimator, depths=(2,))
    store = RunStore.open(tmp_path, cfg.as_dict())
    run_units(cfg, DOCS[:1], factory, store)
    reps = store.read("replicates").to_pandas()
    for _, unit in reps.groupby("action"):
        assert sorted(unit["replicate"]) == list(range(20))
    steps = store.read("steps").to_pandas()
    assert len(steps) == 2 * 20 * 5
    whole = point_rows(steps, reps)
    assert set(whole) == set(MIX)


def test_resume_with_other_configuration_is_refused(tmp_path):
    RunStore.open(tmp_path, config().as_dict())
    with pytest.raises(ValueError, match="differs in: replicates"):
        RunStore.open(tmp_path, config(replicates=7).as_dict())


def test_stratum_weights_give_strata_equal_weight():
    import pandas as pd

    w = stratum_weights(pd.Series(["a", "a", "a", "b"]))
    assert w.tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 1 / 2])


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(estimator="magic"), whole("estimator must be one of rollout, swrb; got 'magic'")),
        (dict(actions=()), whole("actions must be one or more distinct names (e.g. snapkv-half); "
                                 "got []")),
        (dict(actions=("mild", "mild")), whole("actions must be one or more distinct names "
                                               "(e.g. snapkv-half); got ['mild', 'mild']")),
        (dict(temperature=-1.0), "temperature must be a finite number >= 0"),
        (dict(temperature=float("inf")), r"temperature must be a finite number >= 0 \(0 = "
                                         r"greedy\); got inf"),
        (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
        (dict(depths=(9,)), "depth L must be an integer within 1..H"),
        (dict(batch=-1), "batch must be an integer >= 0"),
    ],
)
def test_bad_run_configuration(kw, message):
    with pytest.raises(ValueError, match=message):
        config(**kw)


def test_units_record_their_measured_cost(tmp_path):
    import time

    def slow_factory(doc, action):
        time.sleep(0.05)  # building a pair (prefill and eviction) is the unit's setup cost
        return factory(doc, action)

    cfg = config(replicates=10)
    store = RunStore.open(tmp_path, cfg.as_dict())
    run_units(cfg, DOCS[:2], slow_factory, store)
    reps = store.read("replicates").to_pandas()
    for _, unit in reps.groupby(["doc_id", "action"]):
        assert unit["setup_seconds"].nunique() == 1 and unit["setup_seconds"].iloc[0] >= 0.05
        assert unit["replicate_seconds"].nunique() == 1 and unit["replicate_seconds"].iloc[0] > 0
