"""Task outcomes: replicate scores from the runner, and the task analysis (accuracy under P and
Q, flips, coupled and uncoupled standard errors, accuracy by divergence time)."""

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from kvdrift.analysis.bootstrap import stratified_counts
from kvdrift.analysis.results import TASK_STATS, StudyAnalysis
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.analysis.task import standard_errors, task_outcomes
from kvdrift.data.document import Document
from kvdrift.finite import random_pair
from kvdrift.records.schema import SCORE_COLUMNS
from kvdrift.run.outcomes import TextDecoder, until_eos, with_scores
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore

H, EOS = 5, 2
PAIRS = {"mild": random_pair(3, H, seed=7, mix=0.3, eos_token_id=EOS),
         "same": random_pair(3, H, seed=7, mix=0.0, eos_token_id=EOS)}  # Q = P ("full")
DOCS = [Document(f"d{i}", f"prompt {i}", stratum="a" if i < 3 else "b", answer="t1")
        for i in range(6)]
FREE = Document("free", "no answer here", stratum="a")


class Factory:
    """A finite pair factory that can also decode: token v reads as ``t<v>``."""

    def __call__(self, doc, action):
        return PAIRS[action]

    def decode(self, token_ids):
        return " ".join(f"t{v}" for v in token_ids)


def hit_probability(pair, side, history=()):
    """Exact probability that the branch emits token 1 before its first EOS within H."""
    if len(history) == H:
        return 0.0
    p = pair.probs(side, history)
    return float(p[1] + p[0] * hit_probability(pair, side, history + (0,)))


def run(tmp_path, docs, factory, **kw):
    cfg = RunConfig(**(dict(model="finite", actions=("mild", "same"), replicates=200, horizon=H,
                            seed=1) | kw))
    store = RunStore.open(tmp_path, cfg.as_dict())
    run_units(cfg, docs, factory, store)
    return store.read("steps").to_pandas(), store.read("replicates").to_pandas()


def test_until_eos_and_decoder_protocol():
    assert until_eos([5, 3, 2, 2], 2) == [5, 3]
    assert until_eos([5, 3], 2) == [5, 3] and until_eos([2, 4], None) == [2, 4]
    assert until_eos([2, 2], 2) == []
    assert isinstance(Factory(), TextDecoder) and not isinstance(lambda d, a: None, TextDecoder)


def test_with_scores_decodes_each_branch_up_to_eos():
    doc = Document("d", "p", answer="t1, t0", meta={"answers": ["t1", "t0"]})
    x = torch.tensor([[1, 0, 2], [0, 2, 1], [2, 1, 1]])
    y = torch.tensor([[1, 2, 0], [3, 3, 3], [1, 1, 1]])
    table = with_scores(pa.table({"r": [0, 1, 2]}), doc, x, y, EOS, Factory())
    assert table.column("score_x").to_pylist() == [1.0, 0.5, 0.0]  # [2, 1, 1]: EOS first
    assert table.column("score_y").to_pylist() == [0.5, 0.0, 0.5]
    free = with_scores(table.select(["r"]), FREE, x, y, EOS, Factory())
    assert free.column_names == ["r"]  # no answer: not scored
    assert with_scores(table.select(["r"]), doc, x, y, EOS, object()).column_names == ["r"]


def test_runner_scores_match_exact_hit_probabilities(tmp_path):
    _, reps = run(tmp_path, DOCS + [FREE], Factory())
    assert set(SCORE_COLUMNS) <= set(reps.columns)
    assert reps.loc[reps.doc_id == "free", "score_x"].isna().all()
    scored = reps[reps.doc_id != "free"]
    for action, pair in PAIRS.items():
        mine = scored[scored.action == action]
        for column, side in (("score_x", "p"), ("score_y", "q")):
            truth = hit_probability(pair, side)
            se = mine[column].std(ddof=1) / math.sqrt(len(mine))
            assert abs(mine[column].mean() - truth) < 4.5 * se, (action, column)
    same = scored[scored.action == "same"]
    assert (same.score_x == same.score_y).all()  # Q = P: the coupling never splits them


def test_runner_leaves_unscored_what_it_cannot_score(tmp_path):
    _, plain = run(tmp_path / "plain", DOCS, lambda doc, action: PAIRS[action])
    _, swrb = run(tmp_path / "swrb", DOCS, Factory(), estimator="swrb")
    for reps in (plain, swrb):
        assert not set(SCORE_COLUMNS) & set(reps.columns)


def test_study_task_entries(tmp_path):
    steps, reps = run(tmp_path, DOCS + [FREE], Factory())
    result = analyze(steps, reps, AnalysisOptions(bootstrap=300))
    out = json.loads(json.dumps(result.to_json()))
    assert [e["action"] for e in out["task"]] == ["mild", "same"]
    for entry in out["task"]:
        assert list(entry) == ["model", "action", "documents", *TASK_STATS]
        assert entry["documents"] == len(DOCS)
        for k in TASK_STATS:
            assert set(entry[k]) == {"estimate", "lo", "hi"}
    same = {e["action"]: e for e in out["task"]}["same"]
    assert same["acc_p"] == same["acc_q"]
    for k in ("diff", "flips_lost", "flips_gained", "se_coupled"):
        assert same[k] == {"estimate": 0.0, "lo": 0.0, "hi": 0.0}
    mild = result.task[0].stats
    assert mild["diff"].estimate == pytest.approx(
        mild["flips_gained"].estimate - mild["flips_lost"].estimate)
    assert mild["se_uncoupled"].estimate > mild["se_coupled"].estimate > 0
    # diff = P(tau <= H) * E[s_Y - s_X | tau <= H]: undiverged branches score alike
    curve = result.task_by_divergence[0]
    assert curve.curve.x == tuple(range(1, H + 1))
    assert mild["diff"].estimate == pytest.approx(curve.p_diverged[-1] * curve.curve.estimate[-1])
    # strata: task entries per stratum; the free document is counted out, with a note
    for stratum in out["strata"]:
        assert [e["action"] for e in stratum["task"]] == ["mild", "same"]
        assert stratum["task"][0]["documents"] == 3
    assert any("6 of 7 documents" in n for n in result.meta.notes)
    back = StudyAnalysis.from_json(out)
    assert json.dumps(back.to_json()) == json.dumps(result.to_json())  # NaN-safe
    assert list(result.task_frame()["action"]) == ["mild", "same"]
    assert len(result.stratum_task_frame()) == 4


def test_swrb_and_unscored_studies_have_no_task_entries(tmp_path):
    steps, reps = run(tmp_path / "swrb", DOCS, Factory(), estimator="swrb")
    result = analyze(steps, reps, AnalysisOptions(bootstrap=50))
    assert result.task == () and result.task_by_divergence == ()
    assert any("not measured under SWRB" in n for n in result.meta.notes)
    steps, reps = run(tmp_path / "plain", DOCS, lambda doc, action: PAIRS[action])
    result = analyze(steps, reps, AnalysisOptions(bootstrap=50))
    assert result.to_json()["task"] == [] and not any("task" in n for n in result.meta.notes)


def _replicates(sx, sy, tau, strata):
    n, K = sx.shape
    return pd.DataFrame({
        "doc_id": np.repeat([f"d{i}" for i in range(n)], K),
        "stratum": np.repeat(strata, K), "replicate": np.tile(np.arange(K), n),
        "action": "a", "tau": tau.ravel(), "score_x": sx.ravel(), "score_y": sy.ravel()})


def test_task_stats_by_hand():
    sx = np.array([[1, 1], [0, 1], [1, 0.5]])
    sy = np.array([[1, 0], [1, 1], [0, 0.5]])
    tau = np.array([[0, 2], [1, 0], [3, 0]])
    reps = _replicates(sx, sy, tau, ["a", "a", "b"])
    out = task_outcomes("m", reps, ["a"], np.array(["d0", "d1", "d2"]), 3, 200, 0.05, 0)
    s = out.actions[0].stats
    # stratum a (docs 0, 1) and b (doc 2) weigh 1/2 each
    assert s["acc_p"].estimate == pytest.approx(0.5 * (1 + 0.5) / 2 + 0.5 * 0.75)
    assert s["acc_q"].estimate == pytest.approx(0.5 * (0.5 + 1) / 2 + 0.5 * 0.25)
    assert s["flips_lost"].estimate == pytest.approx(0.5 * (0.5 + 0) / 2 + 0.5 * 0.5)
    assert s["flips_gained"].estimate == pytest.approx(0.5 * (0 + 0.5) / 2 + 0.5 * 0)
    # se: stratum a: D = (-0.5, 0.5), var(D) = 0.5, replicate variances of the gap 0.5 and
    # 0.5 (mean 0.5 / K = 0.25), so sigma_b^2 = 0.25; stratum b: one document, var 0.5 / 2.
    var_c = (0.25 + 0.25) / (4 * 2) + (0 + 0.5 / 2) / (4 * 1)
    assert s["se_coupled"].estimate == pytest.approx(math.sqrt(var_c))
    # uncoupled: var(s_X) + var(s_Y) per document: 0 + 0.5, 0.5 + 0, 0.125 + 0.125
    var_u = (0.25 + 0.5 / 2) / (4 * 2) + (0 + 0.25 / 2) / (4 * 1)
    assert s["se_uncoupled"].estimate == pytest.approx(math.sqrt(var_u))
    curve = out.by_divergence[0]
    # tau <= 1: doc1 rep0 (gap +1); <= 2 adds doc0 rep1 (-1); <= 3 adds doc2 rep0 (-1)
    assert curve.p_diverged == pytest.approx((0.5 * 0.5 / 2, 0.5 * 1 / 2, 0.5 * 0.5 + 0.5 * 0.5))
    assert curve.curve.estimate[0] == pytest.approx(1.0)
    assert curve.curve.estimate[1] == pytest.approx(0.0)
    assert curve.curve.estimate[2] == pytest.approx(s["diff"].estimate / curve.p_diverged[2])


def test_standard_errors_match_both_designs_by_simulation():
    """Over many simulated studies, the mean of se^2 matches the variance of the coupled
    estimate and of an uncoupled one (independent X and Y samples, same K)."""
    rng = np.random.default_rng(0)
    sims, n, K = 4000, 12, 4
    strata = np.array(["a"] * 6 + ["b"] * 6)
    p = rng.uniform(0.2, 0.9, (sims, n))  # each document's P(right) under P ...
    q = np.clip(p - rng.uniform(0, 0.3, (sims, n)), 0, 1)  # ... and under Q (q <= p)
    u = rng.random((sims, n, K))
    x = (u < p[..., None]).astype(float)  # maximal coupling of two Bernoullis: one uniform
    y = (u < q[..., None]).astype(float)
    y_indep = (rng.random((sims, n, K)) < q[..., None]).astype(float)
    weights = np.where(strata == "a", 1 / 12, 1 / 12)  # two strata of 6: equal weights
    coupled = ((y - x).mean(axis=2) * weights).sum(axis=1)
    uncoupled = ((y_indep - x).mean(axis=2) * weights).sum(axis=1)
    gap = y - x
    se_c, se_u = np.empty(sims), np.empty(sims)
    for i in range(sims):
        c, u_ = standard_errors(gap[i].mean(axis=1), gap[i].var(axis=1, ddof=1),
                                x[i].var(axis=1, ddof=1) + y[i].var(axis=1, ddof=1), strata,
                                K, np.ones((1, n)))
        se_c[i], se_u[i] = c[0], u_[0]
    assert np.mean(se_c ** 2) == pytest.approx(coupled.var(ddof=1), rel=0.1)
    assert np.mean(se_u ** 2) == pytest.approx(uncoupled.var(ddof=1), rel=0.1)
    assert uncoupled.var() > 1.5 * coupled.var()  # the gain the coupling buys here


def test_se_coupled_agrees_with_the_bootstrap_spread():
    rng = np.random.default_rng(3)
    n, K = 40, 6
    p = rng.uniform(0.3, 0.9, n)
    u = rng.random((n, K))
    sx, sy = (u < p[:, None]) * 1.0, (u < p[:, None] - 0.2) * 1.0
    strata = np.array(["a"] * 20 + ["b"] * 20)
    reps = _replicates(sx, sy, np.where(sx != sy, 1, 0), strata)
    ids = np.array(sorted(reps.doc_id.unique()))
    out = task_outcomes("m", reps, ["a"], ids, 2, 4000, 0.05, 1)
    s = out.actions[0].stats
    counts = stratified_counts(np.array([("a" if int(i[1:]) < 20 else "b") for i in ids]),
                               4000, 1)
    assert counts.shape == (4000, n)
    halfwidth = (s["diff"].hi - s["diff"].lo) / (2 * 1.96)  # percentile interval ~ normal
    assert s["se_coupled"].estimate == pytest.approx(halfwidth, rel=0.15)


def test_report_has_task_table_and_figure(tmp_path):
    from kvdrift.report.html import write_report

    steps, reps = run(tmp_path / "run", DOCS + [FREE], Factory())
    page = write_report(analyze(steps, reps, AnalysisOptions(bootstrap=50)),
                        tmp_path / "report").read_text()
    assert '<section id="task">' in page and "SE uncoupled (pp)" in page
    assert (tmp_path / "report" / "figures" / "task_by_divergence.png").exists()
    assert 'id="fig-task_by_divergence"' in page
    data = json.loads((tmp_path / "report" / "analysis.json").read_text())
    assert [e["action"] for e in data["task"]] == ["mild", "same"]
    steps, reps = run(tmp_path / "swrb", DOCS, Factory(), estimator="swrb")
    page = write_report(analyze(steps, reps, AnalysisOptions(bootstrap=50)),
                        tmp_path / "swrb_report").read_text()
    assert "No task outcomes in this analysis: SWRB does not sample both" in page
    assert not (tmp_path / "swrb_report" / "figures" / "task_by_divergence.png").exists()
