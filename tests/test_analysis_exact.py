"""The study analysis against values computed by hand from small synthetic records.

Records are built directly (no estimator) for 40 documents in two unequal strata and
three actions, passed through the record tables, analysed, and every statistic is
recomputed here with plain loops: stratum weights, replicate means, ratios of means,
the lag profile, EOS split, bounds, Hoeffding enclosures and the certified order (read
back from ``analysis.json``). Nothing here is random except the synthetic records.
"""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from mutation_scope import per_test_under_mutmut

from kvdrift.analysis.bootstrap import percentile_interval, stratified_counts
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.estimate import RolloutResult, first_mismatch
from kvdrift.report.html import write_report
from kvdrift.run.records import UnitKey, rollout_tables

H, K = 8, 3
STRATA = ["s1"] * 30 + ["s2"] * 10
DOC_IDS = [f"d{i:02d}" for i in range(40)]
WEIGHTS = np.array([1 / (2 * 30)] * 30 + [1 / (2 * 10)] * 10)  # strata weigh equally
ACTIONS = ("clean", "noisy", "broken")
BOOT = 300


def synthetic(action: str, doc: int) -> RolloutResult:
    rng = np.random.default_rng([ACTIONS.index(action), doc])
    if action == "clean":
        m = np.zeros((K, H), dtype=bool)
    elif action == "broken":
        m = np.ones((K, H), dtype=bool)
        m[:, 0] = False  # tau = 2 as after prompt eviction
    else:
        start = rng.integers(2, H + 3, size=K)  # some rows never diverge (start > H)
        m = (np.arange(1, H + 1)[None, :] >= start[:, None]) & (rng.random((K, H)) < 0.6)
    delta = np.where(m, rng.uniform(0.5, 1.0, (K, H)), rng.uniform(0.0, 0.3, (K, H)))
    delta[:, 0] = 0.0
    f = delta * rng.uniform(0.2, 1.0, (K, H))
    x_eos = np.cumsum(rng.random((K, H)) < 0.08, axis=1) > 0
    y_eos = np.cumsum(rng.random((K, H)) < 0.12, axis=1) > 0
    mt = torch.from_numpy(m)
    return RolloutResult(x=torch.zeros(K, H, dtype=torch.long), y=mt.long(), mismatch=mt,
                         delta=torch.from_numpy(delta), f=torch.from_numpy(f),
                         x_eos=torch.from_numpy(x_eos), y_eos=torch.from_numpy(y_eos),
                         tau=first_mismatch(mt), evaluations=K * H)


@pytest.fixture(scope=per_test_under_mutmut)
def study(tmp_path_factory):
    raw = {a: [synthetic(a, i) for i in range(40)] for a in ACTIONS}
    steps, reps = [], []
    for a in ACTIONS:
        for i, r in enumerate(raw[a]):
            s, p = rollout_tables(UnitKey("toy", DOC_IDS[i], a, STRATA[i]), r, depths=(2, H))
            steps.append(s.to_pandas())
            reps.append(p.to_pandas())
    options = AnalysisOptions(bootstrap=BOOT, seed=4,
                              endpoints=("R(noisy) - R(clean)", "C(noisy)"))
    analysis = analyze(pd.concat(steps), pd.concat(reps), options)
    out = tmp_path_factory.mktemp("report")
    write_report(analysis, out)
    return raw, analysis.to_json(), json.loads((out / "analysis.json").read_text())


def per_doc(raw, action, fn):
    """``[40]`` document means over replicates of ``fn(result, k)``."""
    return np.array([np.mean([fn(r, k) for k in range(K)]) for r in raw[action]])


def wmean(values):
    return float((WEIGHTS * values).sum() / WEIGHTS.sum())


def tau_of(r, k):
    row = r.mismatch[k].numpy()
    return int(np.argmax(row)) + 1 if row.any() else 0


def hand(raw, action):
    out = {}
    out["R"] = wmean(per_doc(raw, action, lambda r, k: r.mismatch[k].double().mean().item()))
    out["O"] = wmean(per_doc(raw, action, lambda r, k: (tau_of(r, k) > 0) / H))
    out["E"] = wmean(per_doc(raw, action, lambda r, k: (H - tau_of(r, k)) / H
                             if tau_of(r, k) else 0.0))
    out["Pi"] = wmean(per_doc(raw, action, lambda r, k: r.mismatch[k, tau_of(r, k):].sum().item()
                              / H if tau_of(r, k) else 0.0))
    out["C"] = out["Pi"] / out["E"] if out["E"] > 0 else 0.0
    out["F"] = wmean(per_doc(raw, action, lambda r, k: r.f[k].mean().item()))
    out["R_tv"] = wmean(per_doc(raw, action, lambda r, k: r.delta[k].double().mean().item()))
    out["R_minus_F"] = out["R_tv"] - out["F"]
    div = wmean(per_doc(raw, action, lambda r, k: float(tau_of(r, k) > 0)))
    out["p_diverge"] = div
    entry = wmean(per_doc(raw, action, lambda r, k: float(tau_of(r, k))))
    out["mean_entry_time"] = entry / div if div > 0 else float("nan")
    out["S99"] = wmean(per_doc(raw, action, lambda r, k: (r.delta[k] > 0.99).double().mean()
                               .item()))
    # Lag profile: cohort tau <= 4, lags 1..4; early window lag 1, late window lag 4.
    profile = []
    for j in range(1, 5):
        num = wmean(per_doc(raw, action, lambda r, k, j=j: r.delta[k, tau_of(r, k) + j - 1]
                            .item() if 1 <= tau_of(r, k) <= 4 else 0.0))
        den = wmean(per_doc(raw, action, lambda r, k: float(1 <= tau_of(r, k) <= 4)))
        profile.append(num / den if den > 0 else float("nan"))
    out["lag_profile"] = profile
    out["B"] = profile[3] - profile[0]
    out["timing_cdf"] = [wmean(per_doc(raw, action, lambda r, k, t=t: float(
        1 <= tau_of(r, k) <= t))) for t in range(1, H + 1)]
    out["expected_delta"] = [wmean(per_doc(raw, action, lambda r, k, t=t: r.delta[k, t].item()))
                             for t in range(H)]
    return out


def test_point_estimates_match_hand_computation(study):
    raw, analysis, _ = study
    assert analysis["meta"]["documents"] == {"s1": 30, "s2": 10}
    assert analysis["meta"]["replicates"] == K and analysis["meta"]["horizon"] == H
    for entry in analysis["actions"]:
        want = hand(raw, entry["action"])
        for name in ("R", "R_tv", "O", "E", "Pi", "C", "F", "R_minus_F", "p_diverge", "S99"):
            assert entry["scalars"][name]["estimate"] == pytest.approx(want[name], abs=1e-12), (
                entry["action"], name)
        for name in ("mean_entry_time", "B"):
            got = entry["scalars"][name]["estimate"]
            assert got == pytest.approx(want[name], abs=1e-12, nan_ok=True), name
        np.testing.assert_allclose(entry["curves"]["timing_cdf"]["estimate"], want["timing_cdf"],
                                   atol=1e-12)
        np.testing.assert_allclose(entry["curves"]["expected_delta"]["estimate"],
                                   want["expected_delta"], atol=1e-12)
        if entry["action"] != "clean":
            np.testing.assert_allclose(entry["curves"]["lag_profile"]["estimate"],
                                       want["lag_profile"], atol=1e-12)
    clean = next(e for e in analysis["actions"] if e["action"] == "clean")["scalars"]
    assert math.isnan(clean["mean_entry_time"]["estimate"])  # nobody diverged: undefined
    assert clean["C"]["estimate"] == 0.0  # E = 0: C is 0 by convention


def test_bootstrap_intervals_are_percentiles_of_document_resamples(study):
    raw, analysis, _ = study
    counts = stratified_counts(np.array(STRATA), BOOT, seed=4)
    entry = next(e for e in analysis["actions"] if e["action"] == "noisy")
    d_h = per_doc(raw, "noisy", lambda r, k: r.mismatch[k].double().mean().item())
    w = counts * WEIGHTS[None, :]
    draws = (w * d_h[None, :]).sum(axis=1) / w.sum(axis=1)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    assert (entry["scalars"]["R"]["lo"], entry["scalars"]["R"]["hi"]) == pytest.approx((lo, hi))
    assert lo < entry["scalars"]["R"]["estimate"] < hi


def test_eos_total_interval_is_a_percentile_of_document_resamples(study):
    raw, analysis, _ = study
    counts = stratified_counts(np.array(STRATA), BOOT, seed=4)
    entry = next(e for e in analysis["actions"] if e["action"] == "noisy")
    g = per_doc(raw, "noisy", lambda r, k: (r.delta[k] - r.f[k]).sum().item() / H)
    w = counts * WEIGHTS[None, :]
    draws = (w * g[None, :]).sum(axis=1) / w.sum(axis=1)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    total = entry["eos_split"]["G_total"]
    assert (total["estimate"], total["lo"], total["hi"]) == pytest.approx((wmean(g), lo, hi))


def test_contrasts_and_endpoints_match_hand_computation(study):
    raw, analysis, _ = study
    a, b = hand(raw, "clean"), hand(raw, "noisy")
    # a - b: the later action (noisy) minus the earlier (clean)
    c = next(x for x in analysis["contrasts"] if (x["a"], x["b"]) == ("noisy", "clean"))
    assert c["dR"]["estimate"] == pytest.approx(b["R"] - a["R"])
    assert c["dO"]["estimate"] == pytest.approx(b["O"] - a["O"])
    assert c["dE"]["estimate"] == pytest.approx(b["E"] - a["E"])
    assert c["dC"]["estimate"] == pytest.approx(b["C"] - a["C"])
    assert c["exposure_term"]["estimate"] == pytest.approx((b["E"] - a["E"]) * (a["C"] + b["C"])
                                                           / 2)
    assert c["rate_term"]["estimate"] == pytest.approx((b["C"] - a["C"]) * (a["E"] + b["E"]) / 2)
    assert c["exposure_share"]["estimate"] == pytest.approx(
        (b["E"] - a["E"]) * (a["C"] + b["C"]) / 2 / (b["R"] - a["R"]))
    gap = np.array(b["expected_delta"]) - np.array(a["expected_delta"])
    assert c["block_gap"]["blocks"] == [[t, t] for t in range(1, H + 1)]  # 8 blocks of 1 at H=8
    np.testing.assert_allclose(c["block_gap"]["estimate"], gap, atol=1e-12)
    assert [(x["a"], x["b"]) for x in analysis["contrasts"]] == [
        ("noisy", "clean"), ("broken", "clean"), ("broken", "noisy")]
    e1, e2 = analysis["endpoints"]
    assert (e1["name"], e2["name"]) == ("R(noisy) - R(clean)", "C(noisy)")
    assert e1["estimate"] == pytest.approx(b["R"] - a["R"])
    assert e1["estimate"] == c["dR"]["estimate"]  # one sign: the endpoint reads as the contrast
    assert e2["estimate"] == pytest.approx(b["C"])
    assert e1["alpha"] == e2["alpha"] == pytest.approx(0.05 / 2)
    counts = stratified_counts(np.array(STRATA), BOOT, seed=4)
    w = counts * WEIGHTS[None, :]
    d_a = per_doc(raw, "clean", lambda r, k: r.mismatch[k].double().mean().item())
    d_b = per_doc(raw, "noisy", lambda r, k: r.mismatch[k].double().mean().item())
    draws = (w * (d_b - d_a)[None, :]).sum(axis=1) / w.sum(axis=1)
    lo, hi = percentile_interval(draws[:, None], 0.05 / 2)
    assert (e1["lo"], e1["hi"]) == pytest.approx((lo[0], hi[0]))


def test_bounds_and_certified_order_read_from_analysis_json(study):
    raw, analysis, saved = study
    for entry in saved["actions"]:
        action = entry["action"]
        for bound in entry["bounds"]:
            L = bound["L"]
            lower = per_doc(raw, action, lambda r, k, L=L: r.mismatch[k, tau_of(r, k) - 1:
                                                                     tau_of(r, k) - 1 + L]
                            .sum().item() / H if tau_of(r, k) else 0.0)
            cap = per_doc(raw, action, lambda r, k, L=L: max(H - tau_of(r, k) - L + 1, 0) / H
                          if tau_of(r, k) else 0.0)
            assert bound["R_L"] == pytest.approx(wmean(lower))
            assert bound["B_L"] == pytest.approx(wmean(cap))
            assert bound["minimax"] == pytest.approx(wmean(lower) + wmean(cap) / 2)
            eps = math.sqrt(math.log(4 / 0.05) * (WEIGHTS**2).sum() / WEIGHTS.sum() ** 2 / 2)
            upper = np.minimum(lower + cap, 1.0)
            assert bound["hoeffding_lo"] == pytest.approx(max(0.0, wmean(lower) - eps))
            assert bound["hoeffding_hi"] == pytest.approx(min(1.0, wmean(upper) + eps))
    # Orders use alpha / 3 (three actions), eps = 0.27 here. At L = 8 (no unobserved tail)
    # broken (risk 7/8) is certainly worse than clean (0) and noisy; at L = 2 broken's
    # observed part is only 2/8 with a 5/8 tail, so nothing separates.
    eps3 = math.sqrt(math.log(4 / (0.05 / 3)) * (WEIGHTS**2).sum() / 2)
    want = []
    for L in (2, H):
        enc = {}
        for a in ACTIONS:
            lower = per_doc(raw, a, lambda r, k, L=L: r.mismatch[k, tau_of(r, k) - 1:
                                                                tau_of(r, k) - 1 + L]
                            .sum().item() / H if tau_of(r, k) else 0.0)
            cap = per_doc(raw, a, lambda r, k, L=L: max(H - tau_of(r, k) - L + 1, 0) / H
                          if tau_of(r, k) else 0.0)
            enc[a] = (max(0.0, wmean(lower) - eps3), min(1.0, wmean(np.minimum(lower + cap, 1))
                                                         + eps3))
        want += [{"model": "toy", "L": L, "better": a, "worse": b}
                 for a in ACTIONS for b in ACTIONS if a != b and enc[a][1] < enc[b][0]]
    assert saved["certified_order"] == want
    assert want == [{"model": "toy", "L": H, "better": "clean", "worse": "broken"},
                    {"model": "toy", "L": H, "better": "noisy", "worse": "broken"}]
    assert saved["certified_order"] == analysis["certified_order"]


def test_eos_split_sums_delta_by_category(study):
    raw, analysis, _ = study
    entry = next(e for e in analysis["actions"] if e["action"] == "noisy")
    split = entry["eos_split"]

    def category(r, k, t):
        xb = bool(r.x_eos[k, t - 1]) if t > 0 else False
        yb = bool(r.y_eos[k, t - 1]) if t > 0 else False
        if xb and yb:
            return 3
        if xb or yb:
            return 2
        return 1 if (r.x_eos[k, t] or r.y_eos[k, t]) else 0

    for cat in range(4):
        r_cat = wmean(per_doc(raw, "noisy", lambda r, k, c=cat: sum(
            r.delta[k, t].item() for t in range(H) if category(r, k, t) == c) / H))
        f_cat = wmean(per_doc(raw, "noisy", lambda r, k, c=cat: sum(
            r.f[k, t].item() for t in range(H) if category(r, k, t) == c) / H))
        assert split["R"][cat] == pytest.approx(r_cat, abs=1e-12)
        assert split["F"][cat] == pytest.approx(f_cat, abs=1e-12)
        assert split["R_minus_F"][cat] == pytest.approx(r_cat - f_cat, abs=1e-12)
    assert min(split["R"]) > 0  # every category occurs in these records


def test_weighted_mean_hand_values_and_refusals():
    from kvdrift.analysis.decompose import weighted_mean

    assert weighted_mean([5.0]) == 5.0  # one value is a sample
    assert weighted_mean([1.0, 3.0], [0.0, 1.0]) == 3.0  # a zero weight is allowed
    assert weighted_mean([1.0, 3.0], [0.25, 0.25]) == 2.0  # weights need not sum to 1
    assert weighted_mean([1, 4], [2, 1]) == 2.0  # integers: (2 + 4) / 3
    # float32 records (from a GPU run) are summed in float64: float32 would lose the 1 here
    cancel = np.array([1e8, 1.0, -1e8], dtype=np.float32)
    assert weighted_mean(cancel) == pytest.approx(1 / 3, rel=1e-12)
    assert weighted_mean(cancel, np.ones(3, dtype=np.float32)) == pytest.approx(1 / 3, rel=1e-12)
    heavy = np.array([3e7, 1.0, 3e7], dtype=np.float32)
    assert weighted_mean([0.0, 1.0, 0.0], heavy) == pytest.approx(1 / 60000001, rel=1e-12, abs=0)
    with pytest.raises(ValueError, match="^cannot average an empty sample$"):
        weighted_mean([])
    message = "^weights must be non-negative, match the values' shape and not all be 0$"
    for weights in ([2.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.0]):
        with pytest.raises(ValueError, match=message):
            weighted_mean([1.0, 3.0], weights)


def test_decompose_weights_every_term():
    from kvdrift.analysis.decompose import decompose
    from kvdrift.records.terms import trajectory_terms

    # Row 0 diverges at t = 2 of H = 4 (mismatches at 2 and 4); row 1 never diverges.
    terms = trajectory_terms(np.array([[False, True, False, True], [False] * 4]))
    d = decompose(terms, np.array([3.0, 1.0]))
    # Row 0: O = 1/4, E = (H - tau)/H = 2/4, Pi = 1/4 (one mismatch after tau); row 1: 0.
    assert (d.O, d.E, d.Pi) == pytest.approx((0.75 / 4, 1.5 / 4, 0.75 / 4))
    assert d.R == pytest.approx(0.75 * 2 / 4)
    one = trajectory_terms(np.array([[True]]))  # H = 1 is a valid horizon
    assert one.occurrence.tolist() == [1.0] and one.exposure.tolist() == [0.0]
    assert trajectory_terms(np.array([[0, 1, 0, 1]])).occupation.tolist() == [0.25]
    with pytest.raises(ValueError, match="must be a \\[trajectories, H\\] array"):
        trajectory_terms(np.array([True, False]))


def test_hoeffding_enclosure_closed_form_and_refusals():
    from kvdrift.analysis.bounds import hoeffding_enclosure

    n = 1000
    got = hoeffding_enclosure(np.full(n, 0.3), np.full(n, 0.4))  # default alpha = 0.05
    eps = math.sqrt(math.log(4 / 0.05) / (2 * n))  # 0.0468
    assert (got.lo, got.hi) == pytest.approx((0.3 - eps, 0.4 + eps), abs=1e-12)
    # Weights 1 and 3 alternating (not normalised): lower mean 0.25*0.1 + 0.75*0.5 = 0.4.
    lo = np.tile([0.1, 0.5], n // 2)
    w = np.tile([1.0, 3.0], n // 2)
    wn = w / w.sum()
    eps_w = math.sqrt(math.log(4 / 0.1) * float((wn**2).sum()) / 2)
    got = hoeffding_enclosure(lo, lo + 0.1, alpha=0.1, weights=w)
    assert (got.lo, got.hi) == pytest.approx((0.4 - eps_w, 0.5 + eps_w), abs=1e-12)
    assert hoeffding_enclosure(lo, lo + 0.1, weights=np.tile([0.0, 1.0], n // 2)).lo == (
        pytest.approx(0.5 - math.sqrt(math.log(80) / n)))  # zero weights are allowed
    one = hoeffding_enclosure([0.4], [0.5])  # one document: eps > 1, clipped to [0, 1]
    assert (one.lo, one.hi) == (0.0, 1.0)
    shape = "^lower and upper must be non-empty 1-D arrays of equal length$"
    for lower, upper in (([0.1, 0.2], [0.1]), ([[0.1]], [[0.2]]), ([], [])):
        with pytest.raises(ValueError, match=shape):
            hoeffding_enclosure(lower, upper)
    for alpha in (0.0, 1.0):
        with pytest.raises(ValueError, match="alpha must be within"):
            hoeffding_enclosure([0.1], [0.2], alpha=alpha)
    weights = "^weights must be non-negative, one per document, and not all 0$"
    for bad in ([1.0, -0.5], [1.0], [0.0, 0.0]):
        with pytest.raises(ValueError, match=weights):
            hoeffding_enclosure([0.1, 0.2], [0.2, 0.3], weights=bad)


def test_quantities_helpers_hand_values():
    from kvdrift.analysis.quantities import contrast_terms, curve, position_blocks

    assert position_blocks(16) == [(2 * i + 1, 2 * i + 2) for i in range(8)]  # 8 by default
    assert position_blocks(3) == [(1, 1), (2, 2), (3, 3)]  # never more blocks than positions
    assert position_blocks(10, 4) == [(1, 2), (3, 5), (6, 8), (9, 10)]  # edges 0 2 5 8 10
    c = curve(np.array([0.1, 0.2, 0.3]), np.tile([0.1, 0.2, 0.3], (50, 1)), 0.1).to_json()
    assert c["x"] == [1, 2, 3] and c["estimate"] == [0.1, 0.2, 0.3]
    assert c["lo"] == pytest.approx([0.1, 0.2, 0.3]) and c["hi"] == pytest.approx(c["lo"])
    # dR = 1, 0 and -0.5 in three draws; exposure term dE * (C_a + C_b) / 2.
    a = {"R": np.array([0.0, 0.2, 0.5]), "O": np.zeros(3), "E": np.full(3, 0.5),
         "C": np.zeros(3)}
    b = {"R": np.array([1.0, 0.2, 0.0]), "O": np.full(3, 0.1), "E": np.ones(3),
         "C": np.ones(3)}
    d = contrast_terms(b, a)  # b - a, minuend first
    assert d["dR"].tolist() == [1.0, 0.0, -0.5]
    assert d["exposure_term"].tolist() == [0.25, 0.25, 0.25]
    assert d["rate_term"].tolist() == [0.75, 0.75, 0.75]
    share = d["exposure_share"]
    assert share[0] == 0.25 and np.isnan(share[1]) and share[2] == -0.5


def test_lag_windows_and_eos_contrast_hand_values():
    from kvdrift.analysis.eos import eos_contrast
    from kvdrift.analysis.lags import LagWindows

    assert LagWindows.for_horizon(3) is None
    assert LagWindows.for_horizon(4) == LagWindows(2, 2, (1, 1), (2, 2))  # smallest with room
    assert LagWindows.for_horizon(128) == LagWindows(64, 64, (1, 16), (49, 64))  # the paper's
    assert LagWindows.for_horizon(8).as_dict() == {"max_entry": 4, "lags": [1, 2, 3, 4],
                                                   "early": [1, 1], "late": [4, 4]}
    # Two draws, categories (pre-EOS, EOS kinds...): share = sum of EOS categories / total.
    g_a = np.array([[0.1, 0.0, 0.1], [0.2, 0.1, 0.0]])
    g_b = np.array([[0.2, 0.1, 0.2], [0.1, 0.2, 0.0]])  # row 2: EOS moves, total 0
    c = eos_contrast(g_b, g_a)  # b - a
    assert c["dR_minus_F"] == pytest.approx([0.3, 0.0])
    assert c["pre_eos"] == pytest.approx([0.1, -0.1])
    assert c["eos_share"][0] == pytest.approx(0.2 / 0.3) and np.isnan(c["eos_share"][1])
