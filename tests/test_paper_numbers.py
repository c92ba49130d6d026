"""The paper's numbers, exactly (issue 21): rollout-TV risk, the two clocks, the strict
pre-EOS block ratio. Every expected value is computed by hand from the records."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from kvdrift.analysis.clocks import clock_blocks
from kvdrift.analysis.lags import LagWindows, lag_terms
from kvdrift.analysis.results import StudyAnalysis
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.estimate.rollout import RolloutResult, first_mismatch
from kvdrift.run.records import UnitKey, rollout_tables

EOS = 9
H = 16
K = 4


def unit(doc, stratum, action, x, y, delta, f):
    x, y = torch.tensor(x), torch.tensor(y)
    mismatch = x != y
    result = RolloutResult(x=x, y=y, mismatch=mismatch,
                           delta=torch.tensor(delta, dtype=torch.float64),
                           f=torch.tensor(f, dtype=torch.float64),
                           x_eos=(x == EOS).int().cummax(dim=1).values.bool(),
                           y_eos=(y == EOS).int().cummax(dim=1).values.bool(),
                           tau=first_mismatch(mismatch), evaluations=x.numel())
    return rollout_tables(UnitKey("m", doc, action, stratum), result)


def random_unit(rng, doc, stratum, action, flip):
    """K replicates of H steps: tokens 1/2 (Y flips X with probability ``flip``), EOS from a
    random position on either branch (or never), delta and f drawn independently."""
    x = rng.integers(1, 3, size=(K, H))
    y = np.where(rng.random((K, H)) < flip, 3 - x, x)
    for tokens in (x, y):
        for k in range(K):
            start = rng.integers(2, 2 * H)
            if start <= H:
                tokens[k, start - 1:] = EOS
    delta = rng.random((K, H))
    delta[:, 0] = 0.0
    f = 0.5 * rng.random((K, H))
    return unit(doc, stratum, action, x.tolist(), y.tolist(), delta.tolist(), f.tolist())


ACTIONS = {"a": 0.1, "b": 0.3, "c": 0.6}


@pytest.fixture(scope="module")
def study():
    rng = np.random.default_rng(5)
    units = [random_unit(rng, f"d{i}", f"s{i % 2}", a, flip)
             for i in range(8) for a, flip in ACTIONS.items()]
    steps, reps = (pa.concat_tables(t).to_pandas() for t in zip(*units, strict=True))
    analysis = analyze(steps, reps, AnalysisOptions(bootstrap=200, seed=2))
    return steps, reps, analysis


def hand(reps, steps, action, stratum=None):
    """Document means (strata equally weighted) of per-replicate values, by hand."""
    r = reps[reps.action == action]
    s = steps[steps.action == action]
    if stratum is not None:
        r, s = r[r.stratum == stratum], s[s.stratum == stratum]
    tv = s.groupby(["doc_id", "replicate"])["delta"].mean()
    per_doc = r.assign(tv=tv.loc[list(zip(r.doc_id, r.replicate, strict=True))].to_numpy())
    docs = per_doc.groupby(["stratum", "doc_id"])
    means = docs[["risk", "tv", "fixed_risk"]].mean()
    var = docs[["risk", "tv"]].var(ddof=1)
    strat = lambda frame: frame.groupby(level="stratum").mean().mean()  # noqa: E731
    m, v = strat(means), strat(var)
    return {"R": m["risk"], "R_tv": m["tv"], "F": m["fixed_risk"], "var_R": v["risk"],
            "var_R_tv": v["tv"]}


def test_records_carry_rollout_tv_per_replicate(study):
    steps, reps, _ = study
    tv = steps.groupby(["action", "doc_id", "replicate"])["delta"].mean()
    got = reps.set_index(["action", "doc_id", "replicate"])["risk_tv"]
    np.testing.assert_allclose(got.loc[tv.index].to_numpy(), tv.to_numpy(), rtol=1e-12)


def test_rollout_tv_risk_beside_R_for_every_action_contrast_and_stratum(study):
    steps, reps, analysis = study
    out = analysis.to_json()
    for entry in out["actions"]:
        want = hand(reps, steps, entry["action"])
        sc = entry["scalars"]
        for name in ("R", "R_tv", "F", "var_R", "var_R_tv"):
            assert sc[name]["estimate"] == pytest.approx(want[name], abs=1e-12), name
        assert sc["R_tv"]["lo"] <= sc["R_tv"]["estimate"] <= sc["R_tv"]["hi"]
        # the paper's R - F is on rollout TV
        assert sc["R_minus_F"]["estimate"] == pytest.approx(want["R_tv"] - want["F"], abs=1e-12)
        assert sc["var_ratio"]["estimate"] == pytest.approx(want["var_R"] / want["var_R_tv"])
    for c in out["contrasts"]:
        want = hand(reps, steps, c["a"])["R_tv"] - hand(reps, steps, c["b"])["R_tv"]  # a - b
        assert c["dR_tv"]["estimate"] == pytest.approx(want, abs=1e-12)
    for s in out["strata"]:
        for a in s["actions"]:
            want = hand(reps, steps, a["action"], s["stratum"])["R_tv"]
            assert a["scalars"]["R_tv"]["estimate"] == pytest.approx(want, abs=1e-12)
        assert all("dR_tv" in c for c in s["contrasts"])


def test_eos_components_sum_to_the_rollout_tv_gap(study):
    _, _, analysis = study
    out = analysis.to_json()
    scalars = {a["action"]: a["scalars"] for a in out["actions"]}
    assert len(out["eos_contrasts"]) == 3
    for c in out["eos_contrasts"]:
        want = (scalars[c["a"]]["R_minus_F"]["estimate"]
                - scalars[c["b"]]["R_minus_F"]["estimate"])
        assert sum(g["estimate"] for g in c["dG"]) == pytest.approx(want, abs=1e-9)
        assert c["dR_minus_F"]["estimate"] == pytest.approx(want, abs=1e-9)
    for a in out["actions"]:
        assert a["eos_split"]["G_total"]["estimate"] == pytest.approx(
            a["scalars"]["R_minus_F"]["estimate"], abs=1e-9)


def test_rollout_tv_variance_never_exceeds_token_mismatch_on_the_coupling():
    """Per replicate, R_tv = E[D_H | deltas]: on a finite pair run through the coupling its
    within-document variance is the smaller, and both have the same mean."""
    from kvdrift.estimate.rollout import coupled_rollouts
    from kvdrift.finite import random_pair

    pair = random_pair(3, 6, seed=3, mix=0.6, eos_token_id=2)
    result = coupled_rollouts(pair, replicates=4000, horizon=6, seed=0)
    d = result.mismatch.double().mean(dim=1).numpy()
    tv = result.delta.double().mean(dim=1).numpy()
    assert tv.var() < d.var()
    assert abs(d.mean() - tv.mean()) < 4 * d.std() / np.sqrt(d.size)


def test_two_clocks_blocks_are_the_papers():
    assert clock_blocks(128) == [(1, 32), (33, 64), (65, 128)]
    assert clock_blocks(16) == [(1, 4), (5, 8), (9, 16)]
    assert clock_blocks(3) is None


def test_two_clocks_by_hand_pooled_and_per_stratum(study):
    steps, reps, analysis = study
    out = analysis.to_json()
    entries = {(e["stratum"], e["a"], e["b"]): e for e in out["two_clocks"]}
    # a - b, the later action minus the earlier, in the order the actions were run
    assert [(e["a"], e["b"]) for e in out["two_clocks"][:3]] == [("b", "a"), ("c", "a"),
                                                                  ("c", "b")]
    assert set(entries) == {(s, a, b) for s in ("all", "s0", "s1")
                            for a, b in (("b", "a"), ("c", "a"), ("c", "b"))}

    def curve(action, stratum):
        s = steps[steps.action == action]
        if stratum != "all":
            s = s[s.stratum == stratum]
        per_doc = s.groupby(["stratum", "doc_id", "t"])["delta"].mean()
        return per_doc.groupby(level=["stratum", "t"]).mean().groupby(level="t").mean()

    B = {(a["action"]): a["scalars"]["B"]["estimate"] for a in out["actions"]}
    for (stratum, a, b), e in entries.items():
        assert e["model"] == "m" and e["blocks"] == [[1, 4], [5, 8], [9, 16]]
        gap = curve(a, stratum) - curve(b, stratum)
        g = [gap.loc[lo:hi].mean() for lo, hi in e["blocks"]]
        np.testing.assert_allclose([x["estimate"] for x in e["g"]], g, atol=1e-12)
        assert e["delta_g"]["estimate"] == pytest.approx(g[2] - g[0], abs=1e-12)
        assert e["delta_g"]["lo"] <= e["delta_g"]["hi"]
        if stratum == "all":
            assert e["B_a"]["estimate"] == pytest.approx(B[a], nan_ok=True)
            assert e["B_b"]["estimate"] == pytest.approx(B[b], nan_ok=True)
    # typed, and read back from analysis.json
    again = StudyAnalysis.from_json(out)
    assert again.to_json()["two_clocks"] == out["two_clocks"]
    frame = analysis.two_clocks_frame()
    assert {"g_1_4", "g_9_16_lo", "delta_g", "B_a_hi"} <= set(frame.columns)
    assert len(frame) == 9


# ------------------------------------------------------------------ strict pre-EOS B


def test_strict_branch_mean_is_one_ratio_per_lag_block():
    """H = 16: cohort tau <= 8, lags 1..8, early 1..2, late 7..8. Three trajectories diverge
    at t = 2; one reaches EOS at t = 10 so its late lags (positions 9, 10) are cut to one.
    Block ratio: b_late = sum of surviving deltas / count; not the mean of per-lag ratios."""
    w = LagWindows.for_horizon(H)
    assert (w.early, w.late) == ((1, 2), (7, 8))
    delta = np.zeros((3, H))
    delta[:, 2:4] = [[0.2, 0.4], [0.6, 0.8], [0.1, 0.3]]  # lags 1, 2 (positions 3, 4)
    delta[:, 8:10] = [[0.9, 0.7], [0.5, 0.1], [0.2, 0.6]]  # lags 7, 8 (positions 9, 10)
    tau = np.array([2, 2, 2])
    x_eos = np.zeros((3, H), dtype=bool)
    y_eos = np.zeros((3, H), dtype=bool)
    x_eos[0, 9:] = True  # X's EOS at t = 10: trajectory 0 keeps lag 7 (t = 9), loses lag 8
    num, den = lag_terms(delta[None], tau[None], w, (x_eos[None], y_eos[None]))
    early = (0.2 + 0.4 + 0.6 + 0.8 + 0.1 + 0.3) / 6
    late = (0.9 + 0.5 + 0.2 + 0.1 + 0.6) / 5
    assert w.window_gap(num, den)[0] == pytest.approx(late - early)
    per_lag = (np.mean([0.9, 0.5, 0.2]) + np.mean([0.1, 0.6])) / 2 - early
    assert per_lag != pytest.approx(late - early)  # the mean of per-lag ratios differs


def test_strict_B_in_the_analysis_is_the_block_ratio():
    x = [[1] * H for _ in range(3)]
    y = [[1, 2] + [2] * (H - 2) for _ in range(3)]  # tau = 2 on every trajectory
    for t in range(9, H):
        x[0][t] = EOS  # X's EOS at t = 10
    delta = np.zeros((3, H))
    delta[:, 2:4] = [[0.2, 0.4], [0.6, 0.8], [0.1, 0.3]]
    delta[:, 8:10] = [[0.9, 0.7], [0.5, 0.1], [0.2, 0.6]]
    units = [unit("d0", "s", a, x, y, delta.tolist(), np.zeros((3, H)).tolist())
             for a in ("a", "b")]
    steps, reps = (pa.concat_tables(t).to_pandas() for t in zip(*units, strict=True))
    out = analyze(steps, reps, AnalysisOptions(bootstrap=20)).to_json()
    got = out["actions"][0]["scalars"]["B_strict"]["estimate"]
    early = (0.2 + 0.4 + 0.6 + 0.8 + 0.1 + 0.3) / 6
    assert got == pytest.approx((0.9 + 0.5 + 0.2 + 0.1 + 0.6) / 5 - early, abs=1e-12)


# ------------------------------------------------------------------ predict and plan


def _cell_rows(n_per_stratum, contrasts, seed=0, noise=0.01):
    """Rows (doc, action) with an uninformative feature F and a target R whose contrast
    R(a) - R(b) is ``contrasts[stratum]`` (plus small noise)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for s, gap in contrasts.items():
        for i in range(n_per_stratum):
            base = 0.3 + noise * rng.standard_normal()
            for action, value in (("a", base + gap), ("b", base)):
                rows.append(dict(model="m", doc_id=f"{s}-{i:03d}", stratum=s, action=action,
                                 F=rng.uniform(0, 1), R=value))
    return pd.DataFrame(rows)


def test_ridge_cells_recover_a_contrast_that_differs_by_stratum():
    from kvdrift.analysis.observations import observation_types
    from kvdrift.analysis.predict import ActionContrast, predicted_contrast

    contrasts = {"s1": -0.001, "s2": 0.095, "s3": 0.302}
    train = _cell_rows(200, contrasts, seed=1)
    test = _cell_rows(5, contrasts, seed=2)
    test["doc_id"] = "e" + test["doc_id"]
    fixed = observation_types(32)[0]
    got = predicted_contrast("ridge", train, test, fixed, ActionContrast("a", "b"))
    for s, want in contrasts.items():
        docs = test.loc[test.stratum == s, "doc_id"].unique()
        np.testing.assert_allclose(got.loc[docs], want, atol=0.005)
    # an unseen stratum: the average over training strata of its action's cells
    unseen = test[test.stratum == "s1"].assign(stratum="new")
    pred = predicted_contrast("ridge", train, unseen, fixed, ActionContrast("a", "b"))
    np.testing.assert_allclose(pred, np.mean(list(contrasts.values())), atol=0.005)


def _tv_records(docs, seed, H=8, K=2):
    import pandas as pd

    rng = np.random.default_rng(seed)
    steps, reps = [], []
    for doc, stratum in docs:
        for action, rate in (("a", 0.5), ("b", 0.2)):
            for k in range(K):
                m = rng.random(H) < rate
                delta = np.clip(0.6 * m + 0.3 * rng.random(H), 0, 1)
                tau = int(np.argmax(m)) + 1 if m.any() else 0
                key = dict(model="m", doc_id=doc, stratum=stratum, action=action, replicate=k)
                steps += [key | dict(t=t + 1, mismatch=bool(m[t]), delta=float(delta[t]),
                                     x_eos=False, y_eos=False) for t in range(H)]
                reps.append(key | dict(estimator="rollout", horizon=H, risk=m.mean(),
                                       fixed_risk=0.5 * rng.random(), tau=tau))
    return pd.DataFrame(steps), pd.DataFrame(reps)


def test_predict_supporting_intervals_are_pointwise_and_state_their_level():
    from kvdrift.analysis.predict import predict_study

    dev = _tv_records([(f"d{i}", f"s{i % 2}") for i in range(12)], seed=1)
    ev = _tv_records([(f"e{i}", f"s{i % 2}") for i in range(10)], seed=2)
    out = predict_study(dev, ev, "a - b", window=4, draws=400).to_json()
    assert out["target"] == "tv" and out["cells"] == 2
    for o in out["models"][0]["observations"]:
        assert o["error"]["level"] == pytest.approx(1 - 0.05 / 2)
        for iv in o["supporting"].values():
            assert iv["level"] == pytest.approx(0.95)
        full = o["supporting"]["full_horizon_gap"]
        narrower = full["hi"] - full["lo"]
        # the same draws at 1 - alpha/k would be wider
        wide = predict_study(dev, ev, "a - b", window=4, draws=400, alpha=0.025).to_json()
        w = [x for x in wide["models"][0]["observations"]
             if x["observation"] == o["observation"]][0]["supporting"]["full_horizon_gap"]
        assert w["hi"] - w["lo"] >= narrower
    # the target: rollout TV by default, the token mismatch on request
    tv_gap = out["models"][0]["observations"][0]["supporting"]["full_horizon_gap"]["estimate"]
    steps, reps = ev
    tv = steps.groupby(["action", "stratum", "doc_id"])["delta"].mean()
    per = tv.groupby(level=["action", "stratum"]).mean().groupby(level="action").mean()
    assert tv_gap == pytest.approx(per["a"] - per["b"], abs=1e-12)
    tokens = predict_study(dev, ev, "a - b", window=4, draws=400, target="tokens").to_json()
    tok = reps.groupby(["action", "stratum", "doc_id"])["risk"].mean()
    tper = tok.groupby(level=["action", "stratum"]).mean().groupby(level="action").mean()
    assert tokens["target"] == "tokens"
    assert tokens["models"][0]["observations"][0]["supporting"]["full_horizon_gap"][
        "estimate"] == pytest.approx(tper["a"] - tper["b"], abs=1e-12)
    with pytest.raises(ValueError, match="^target must be one of tv, tokens; got 'x'$"):
        predict_study(dev, ev, "a - b", window=4, draws=10, target="x")


def test_paper_bootstrap_defaults():
    import inspect

    from kvdrift.analysis.predict import predict_study

    assert AnalysisOptions().bootstrap == 2000
    assert AnalysisOptions(endpoints=("S99(a)",)).bootstrap == 10000
    assert AnalysisOptions(bootstrap=500, endpoints=("S99(a)",)).bootstrap == 500
    assert inspect.signature(predict_study).parameters["draws"].default == 10000


def test_plan_costs_evaluations_from_the_targets_actions_only():
    import pandas as pd

    from kvdrift.analysis.plan import plan_study

    rows = []
    for action, evals in (("a", 6), ("b", 6), ("c", 60)):  # c is not in the target
        for i in range(3):
            for k in range(2):
                rows.append(dict(model="m", doc_id=f"d{i}", stratum="s", action=action,
                                 replicate=k, estimator="swrb", horizon=4,
                                 risk=0.1 * i + 0.05 * k + (action == "a") * 0.1,
                                 fixed_risk=np.nan, tau=2, evaluations=evals,
                                 setup_seconds=1.0, replicate_seconds=0.5))
    [m] = plan_study(pd.DataFrame(rows), "a - b", 0.1).to_json()["models"]
    assert m["comparison"]["evaluations_per_replicate"]["swrb"] == 6.0


# ------------------------------------------------------------------ report


def test_report_has_the_papers_tables_and_figure7(study, tmp_path):
    from kvdrift.analysis.predict import predict_study
    from kvdrift.report import write_report
    from kvdrift.report.paper import write_prediction_report

    _, _, analysis = study
    html = write_report(analysis, tmp_path).read_text(encoding="utf-8")
    assert "The paper&#x27;s tables" in html or "The paper's tables" in html
    for text in ("Table 1: saturation", "Table 2: the two clocks", "Study 1 headline",
                 "P(&tau; &le; 16)", "&Delta;g = g<sub>last</sub>", "rollout-TV gap"):
        assert text in html, text
    assert (tmp_path / "figures" / "paper_figure7.png").stat().st_size > 0
    assert 'id="fig-paper_figure7"' in html
    dev = _tv_records([(f"d{i}", f"s{i % 2}") for i in range(12)], seed=1)
    ev = _tv_records([(f"e{i}", f"s{i % 2}") for i in range(6)], seed=2)
    result = predict_study(dev, ev, "a - b", window=4, draws=100)
    write_prediction_report(result, tmp_path / "t4.html")
    page = (tmp_path / "t4.html").read_text(encoding="utf-8")
    assert "Table 4" in page and "full-H rollout-TV gap (pp, 95%)" in page
    assert "error (pp, 97.5%)" in page
