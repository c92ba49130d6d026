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
        want = hand(reps, steps, c["b"])["R_tv"] - hand(reps, steps, c["a"])["R_tv"]
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
        want = (scalars[c["b"]]["R_minus_F"]["estimate"]
                - scalars[c["a"]]["R_minus_F"]["estimate"])
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
    assert set(entries) == {(s, a, b) for s in ("all", "s0", "s1")
                            for a, b in (("a", "b"), ("a", "c"), ("b", "c"))}

    def curve(action, stratum):
        s = steps[steps.action == action]
        if stratum != "all":
            s = s[s.stratum == stratum]
        per_doc = s.groupby(["stratum", "doc_id", "t"])["delta"].mean()
        return per_doc.groupby(level=["stratum", "t"]).mean().groupby(level="t").mean()

    B = {(a["action"]): a["scalars"]["B"]["estimate"] for a in out["actions"]}
    for (stratum, a, b), e in entries.items():
        assert e["model"] == "m" and e["blocks"] == [[1, 4], [5, 8], [9, 16]]
        gap = curve(b, stratum) - curve(a, stratum)
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
