"""Typed results: the interval type, frames against the JSON, directory analyses, the grammar."""

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from test_analysis_exact import ACTIONS, DOC_IDS, STRATA, synthetic
from test_plan import PAIRED_A, PAIRED_B, _replicates
from test_predict import _study_inputs

from kvdrift.analysis.bounds import hoeffding_enclosure, sharp_interval
from kvdrift.analysis.endpoints import parse_endpoint
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.plan import plan_study
from kvdrift.analysis.predict import ActionContrast, parse_contrast, predict_study
from kvdrift.analysis.results import StudyAnalysis
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.directory import StudyDirectory
from kvdrift.json_values import to_json_safe
from kvdrift.run.records import UnitKey, rollout_tables
from kvdrift.run.store import RunStore


def _records(models=("toy", "toy2"), docs=12):
    steps, reps = [], []
    for m, model in enumerate(models):
        for a in ACTIONS:
            for i in range(docs):
                s, p = rollout_tables(UnitKey(model, DOC_IDS[i], a, STRATA[i + 24 * (i % 2)]),
                                      synthetic(a, i + 50 * m), depths=(2, 8))
                steps.append(s.to_pandas())
                reps.append(p.to_pandas())
    return pd.concat(steps), pd.concat(reps)


@pytest.fixture(scope="module")
def study():
    options = AnalysisOptions(bootstrap=60, seed=2, endpoints=("R(noisy) - R(clean)",))
    return analyze(*_records(), options)


# ------------------------------------------------------------------ the interval type


def test_interval_fields_json_and_refusals():
    iv = Interval(0.3, 0.1, 0.4, 0.95)
    assert iv.to_json() == {"estimate": 0.3, "lo": 0.1, "hi": 0.4}
    assert iv.minimax == pytest.approx(0.25) and iv.worst_error == pytest.approx(0.15)
    assert iv.contains(0.1) and iv.contains(0.4) and not iv.contains(0.41)
    assert iv.excludes_zero() and not Interval(0.0, -0.1, 0.1, 0.9).excludes_zero()
    assert Interval.from_json({"estimate": None, "lo": 0.1, "hi": 0.2}, 0.9).defined is False
    with pytest.raises(ValueError, match=r"^interval needs lo <= hi; got \[0\.5, 0\.2\]$"):
        Interval(0.3, 0.5, 0.2, 0.95)
    with pytest.raises(ValueError, match=r"^interval level must be within \(0, 1\]; got 0$"):
        Interval(0.3, 0.1, 0.4, 0)
    assert Interval(math.nan, math.nan, math.nan, 0.95).defined is False  # NaN ends are allowed
    with pytest.raises(ValueError, match=r"^interval level must be within \(0, 1\]; got 1\.5$"):
        Interval(0.3, 0.1, 0.4, 1.5)
    assert Interval(0.3, 0.1, 0.4, 1).level == 1  # a sharp set is certain
    # an end at 0 does not exclude 0
    assert not Interval(0.05, 0.0, 0.1, 0.95).excludes_zero()
    assert not Interval(-0.05, -0.1, 0.0, 0.95).excludes_zero()
    assert Interval(-0.05, -0.1, -0.01, 0.95).excludes_zero()


def test_enclosures_estimate_is_the_minimax_point_and_levels_are_kept():
    sharp = sharp_interval(0.2, 0.1)
    assert (sharp.estimate, sharp.lo, sharp.hi, sharp.level) == pytest.approx((0.25, 0.2, 0.3, 1))
    enc = hoeffding_enclosure(np.array([0.1, 0.2]), np.array([0.3, 0.4]), alpha=0.1)
    assert enc.level == pytest.approx(0.9)
    assert enc.estimate == pytest.approx((enc.lo + enc.hi) / 2)


# ------------------------------------------------------------------ the study's frames


def test_study_frame_rows_and_columns_match_the_json(study):
    data = study.to_json()
    frame = study.to_frame()
    assert list(frame.columns[:2]) == ["model", "action"]
    assert {"R", "R_lo", "R_hi", "O", "E", "Pi", "C", "F", "B_hi"} <= set(frame.columns)
    assert len(frame) == len(data["actions"]) == 6
    for row, entry in zip(frame.itertuples(index=False), data["actions"], strict=True):
        assert (row.model, row.action) == (entry["model"], entry["action"])
        for q, iv in entry["scalars"].items():
            got = [getattr(row, q), getattr(row, f"{q}_lo"), getattr(row, f"{q}_hi")]
            np.testing.assert_array_equal(got, [iv["estimate"], iv["lo"], iv["hi"]])
    # the typed objects read the same numbers as the JSON
    noisy = study.action("toy2", "noisy")
    assert noisy.scalars["R"].to_json() == data["actions"][4]["scalars"]["R"]
    assert noisy.scalars["R"].level == pytest.approx(0.95)


def test_contrast_and_strata_frames_match_the_json(study):
    data = study.to_json()
    contrasts = study.contrasts_frame()
    assert [tuple(r) for r in contrasts[["model", "a", "b"]].itertuples(index=False)] == [
        (c["model"], c["a"], c["b"]) for c in data["contrasts"]]
    last = data["contrasts"][-1]
    assert contrasts.iloc[-1]["dR"] == last["dR"]["estimate"]
    assert contrasts.iloc[-1]["exposure_share_hi"] == last["exposure_share"]["hi"]
    strata = study.strata_frame()
    want = [(s["model"], s["stratum"], a["action"], a["scalars"]["E"]["lo"])
            for s in data["strata"] for a in s["actions"]]
    assert [tuple(r) for r in strata[["model", "stratum", "action", "E_lo"]]
            .itertuples(index=False)] == want
    assert len(study.stratum_contrasts_frame()) == sum(len(s["contrasts"])
                                                        for s in data["strata"])
    # a stratum's contrasts carry its model, though the JSON stores it once per stratum
    assert {(s.model, c.model) for s in study.strata for c in s.contrasts} == {
        ("toy", "toy"), ("toy2", "toy2")}
    ends = study.endpoints_frame()
    assert ends["estimate"].tolist() == [e["estimate"] for e in data["endpoints"]]
    bounds = study.bounds_frame()
    assert bounds["L"].tolist() == [b["L"] for a in data["actions"] for b in a["bounds"]]
    assert (bounds["minimax"] == (bounds["lo"] + bounds["hi"]) / 2).all()


def test_from_json_reads_analysis_json_back(study, tmp_path):
    text = json.dumps(to_json_safe(study.to_json()), allow_nan=False)
    back = StudyAnalysis.from_json(json.loads(text))
    assert json.dumps(to_json_safe(back.to_json()), allow_nan=False) == text
    assert back.lags == study.lags and back.meta.documents == study.meta.documents


def test_a_directory_analysis_uses_the_saved_options_and_overrides(tmp_path):
    steps, reps = _records(models=("toy",), docs=6)
    H = int(reps["horizon"].iloc[0])  # a kvdrift run.json always names its horizon
    analysis = {"bootstrap": 30, "alpha": 0.2, "seed": 2, "endpoints": ["C(noisy)"]}
    config = {"horizon": H, "temperature": 0.7, "analysis": analysis}
    store = RunStore.open(tmp_path / "run", config)
    for name, table in (("steps", steps), ("replicates", reps)):
        (store.root / name).mkdir(exist_ok=True)
        table.to_parquet(store.root / name / "part-0.parquet")
    got = StudyDirectory(tmp_path / "run").analyze()
    assert (got.meta.bootstrap, got.meta.alpha, got.meta.temperature) == (30, 0.2, 0.7)
    assert [e.name for e in got.endpoints] == ["C(noisy)"]
    want = analyze(steps, reps, AnalysisOptions(bootstrap=30, alpha=0.2, seed=2,
                                                endpoints=("C(noisy)",)))
    assert got.to_frame().equals(want.to_frame())
    assert StudyDirectory(tmp_path / "run").analyze(bootstrap=40, alpha=0.1).meta.alpha == 0.1


# ------------------------------------------------------------------ plan and predict results


def test_plan_result_frame_matches_its_json():
    result = plan_study(_replicates(PAIRED_A, PAIRED_B, ["s"] * 3), "R(a) - R(b)", 0.1)
    [m] = result.to_json()["models"]
    row = result.to_frame().iloc[0]
    assert row["model"] == m["model"] and row["replicates"] == m["recommended"]["replicates"]
    assert row["between"] == m["variance"]["between"]
    assert row["current_halfwidth"] == m["current"]["halfwidth"]
    assert row["cheaper"] == m["comparison"]["cheaper"]


def test_prediction_frame_matches_its_json():
    dev, ev = _study_inputs(H=4)
    result = predict_study(dev, ev, "R(a) - R(b)", window=2, draws=50)
    data = result.to_json()
    frame = result.to_frame()
    want = [(m["model"], o["observation"], o["error"]["lo"], o["supporting"]
             ["full_horizon_gap"]["hi"]) for m in data["models"] for o in m["observations"]]
    assert [tuple(r) for r in frame[["model", "observation", "error_lo", "full_horizon_gap_hi"]]
            .itertuples(index=False)] == want
    assert result.models[0].observations[0].error.level == pytest.approx(1 - data["alpha_adjusted"])


# ------------------------------------------------------------------ one contrast grammar


def test_shorthand_is_the_risk_contrast_everywhere():
    long, short = parse_endpoint("R(snapkv-half) - R(recent-half)"), parse_endpoint(
        " snapkv-half  -  recent-half ")
    assert (short.stat, short.action, short.minus) == (long.stat, long.action, long.minus)
    assert parse_contrast("R(snapkv-half) - R(recent-half)") == ActionContrast("snapkv-half",
                                                                             "recent-half")
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3)
    assert plan_study(reps, "a - b", 0.1).models == plan_study(reps, "R(a) - R(b)", 0.1).models
    dev, ev = _study_inputs(H=4)
    assert (predict_study(dev, ev, "R(a) - R(b)", window=2, draws=50).to_json()
            == predict_study(dev, ev, "a - b", window=2, draws=50).to_json())


@pytest.mark.parametrize("text, message", [
    ("F(a) - F(b)", "predict reads a contrast of risks; got 'F(a) - F(b)'; write 'R(a) - R(b)' "
                    "or 'a - b', e.g. 'snapkv-half - recent-half'"),
    ("R(a)", "predict reads a contrast of risks; got 'R(a)'; write 'R(a) - R(b)' or 'a - b', "
             "e.g. 'snapkv-half - recent-half'"),
])
def test_predict_refuses_what_is_not_a_risk_contrast(text, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        parse_contrast(text)


SELF = ("'R(a) - R(a)' subtracts R(a) from itself, which is always 0; name two different "
        "actions (or statistics)")


def test_plan_refuses_the_same_term_twice():
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3)
    with pytest.raises(ValueError, match="^" + re.escape(SELF) + "$"):
        plan_study(reps, "R(a) - R(a)", 0.1)
    assert plan_study(reps, "R(a) - F(a)", 0.1).models  # another statistic is a real contrast


def test_predict_refuses_the_same_action_twice():
    dev, ev = _study_inputs(H=4)
    with pytest.raises(ValueError, match="^" + re.escape(SELF) + "$"):
        predict_study(dev, ev, "R(a) - R(a)", window=2, draws=50)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_plan_refuses_a_non_finite_halfwidth(value):
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3)
    with pytest.raises(ValueError, match="^" + re.escape(
            f"the target half-width must be a finite number >= 1e-06 (kvdrift's limit; 0.01 = 1 "
            f"percentage point); got {value}") + "$"):
        plan_study(reps, "R(a)", value)


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_predict_refuses_a_non_finite_margin(value):
    dev, ev = _study_inputs(H=4)
    with pytest.raises(ValueError, match="^" + re.escape(
            f"margin must be a finite number > 0; got {value}") + "$"):
        predict_study(dev, ev, "a - b", window=2, draws=50, margin=value)


def test_predict_refuses_cohorts_at_different_temperatures():
    dev, ev = _study_inputs(H=4)
    with pytest.raises(ValueError, match="^" + re.escape(
            "the cohorts were sampled at different temperatures: development 1, evaluation "
            "0.7; run both at one temperature") + "$"):
        predict_study(dev, ev, "a - b", window=2, draws=50, temperatures=(1.0, 0.7))
    same = predict_study(dev, ev, "a - b", window=2, draws=50, temperatures=(0.7, 0.7))
    assert same.to_json() == predict_study(dev, ev, "a - b", window=2, draws=50).to_json()
