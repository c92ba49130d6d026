"""Study statistics: lag profile, EOS split, bootstrap, endpoints, and the assembled analysis."""

import math

import numpy as np
import pandas as pd
import pytest
from mutation_scope import per_test_under_mutmut

from kvdrift.analysis.bootstrap import percentile_interval, stratified_counts, weighted_means
from kvdrift.analysis.endpoints import parse_endpoint
from kvdrift.analysis.features import eos_categories
from kvdrift.analysis.lags import LagWindows, lag_terms
from kvdrift.analysis.quantities import contrast_terms
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.data.document import Document
from kvdrift.finite import exact, random_pair
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore


def test_lag_windows_match_the_paper_at_h128():
    w = LagWindows.for_horizon(128)
    assert (w.max_entry, w.lags, w.early, w.late) == (64, 64, (1, 16), (49, 64))
    assert LagWindows.for_horizon(3) is None
    assert LagWindows.for_horizon(8) == LagWindows(4, 4, (1, 1), (4, 4))


def test_lag_terms_exact_values():
    w = LagWindows.for_horizon(8)  # cohort tau <= 4, lags 1..4
    delta = np.array([[0, 0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],    # tau = 2 (in cohort)
                      [0, 0, 0, 0, 0, 0.3, 0.2, 0.1]])          # tau = 5 (not in cohort)
    tau = np.array([2, 5])
    no_eos = np.zeros_like(delta, dtype=bool)
    num, den = lag_terms(delta, tau, w)
    np.testing.assert_allclose(num, [0.25, 0.3, 0.35, 0.4])  # delta_{3..6} / 2 replicates
    np.testing.assert_allclose(den, [0.5] * 4)
    # Strict: X emits EOS at position 5, so only tau + j < 5, i.e. j = 1, 2, survive.
    x_eos = no_eos.copy()
    x_eos[0, 4:] = True
    num_s, den_s = lag_terms(delta, tau, w, (x_eos, no_eos))
    np.testing.assert_allclose(num_s, [0.25, 0.3, 0, 0])
    np.testing.assert_allclose(den_s, [0.5, 0.5, 0, 0])
    for both in ((no_eos, x_eos), (x_eos, x_eos)):  # Y's EOS cuts alike; the first one counts
        np.testing.assert_allclose(lag_terms(delta, tau, w, both)[0], num_s)
    assert w.gap(np.array([0.1, 0.2, 0.3, 0.5])) == pytest.approx(0.4)
    # wider windows (H = 32: early 1..4, late 13..16), one profile per bootstrap draw
    w32 = LagWindows.for_horizon(32)
    profiles = np.stack([np.arange(1.0, 17.0), np.arange(1.0, 17.0) ** 2])
    np.testing.assert_allclose(w32.gap(profiles), [14.5 - 2.5, np.mean(np.arange(13, 17) ** 2)
                                                   - np.mean(np.arange(1, 5) ** 2)])
    # tau = 1 and tau = 4 = max_entry are in the cohort; lags reach position H = 8 (strict too)
    edge = np.tile(np.arange(1.0, 9.0) / 10, (2, 1))
    num, den = lag_terms(edge, np.array([1, 4]), w, (no_eos, no_eos))
    np.testing.assert_allclose(den, [1.0] * 4)
    np.testing.assert_allclose(num, [(0.2 + 0.5) / 2, (0.3 + 0.6) / 2, (0.4 + 0.7) / 2,
                                     (0.5 + 0.8) / 2])


def test_eos_categories():
    x = np.array([[0, 1, 1, 1, 1]], dtype=bool)
    y = np.array([[0, 0, 0, 1, 1]], dtype=bool)
    assert eos_categories(x, y).tolist() == [[0, 1, 2, 2, 3]]


def test_stratified_counts_keep_stratum_sizes():
    strata = np.array(["a"] * 3 + ["b"] * 5)
    counts = stratified_counts(strata, 200, seed=1)
    assert counts.shape == (200, 8)
    assert np.all(counts[:, :3].sum(axis=1) == 3) and np.all(counts[:, 3:].sum(axis=1) == 5)
    assert stratified_counts(strata, 0, seed=0).shape == (0, 8)  # point estimates only
    with pytest.raises(ValueError, match="bootstrap draws"):
        stratified_counts(strata, -1, seed=0)


def test_bootstrap_interval_coverage():
    # 95% percentile intervals for a mean of 40 documents: over 300 experiments at a fixed
    # seed, coverage must lie in [0.88, 0.99] (the bootstrap is slightly liberal at n = 40;
    # a broken resampler - e.g. one ignoring counts - lands far outside).
    rng = np.random.default_rng(0)
    strata = np.array(["a"] * 20 + ["b"] * 20)
    weights = np.full(40, 1 / 40)
    hits = 0
    for i in range(300):
        x = rng.beta(2, 5, size=(40, 1))
        counts = stratified_counts(strata, 400, seed=i)
        lo, hi = percentile_interval(weighted_means({"x": x}, weights, counts)["x"], 0.05)
        hits += bool(lo[0] <= 2 / 7 <= hi[0])
    assert 0.88 <= hits / 300 <= 0.99


def test_contrast_identity_on_every_draw():
    rng = np.random.default_rng(3)

    def fake():
        return {"R": None, "O": rng.random(50), "E": rng.random(50), "C": rng.random(50)}

    a, b = fake(), fake()
    for d in (a, b):
        d["R"] = d["O"] + d["E"] * d["C"]
    t = contrast_terms(a, b)
    np.testing.assert_allclose(t["dR"], t["occurrence_term"] + t["exposure_term"] + t["rate_term"])


@pytest.mark.parametrize("text, message", [
    ("Q(snapkv)", r"^statistic in endpoint 'Q\(snapkv\)' must be one of p_diverge, .+; got 'Q'$"),
    ("B snapkv", "cannot read 'B snapkv'"),
    ("B(a) - Z(b)",
     r"^statistic in endpoint 'B\(a\) - Z\(b\)' must be one of p_diverge, .+; got 'Z'$"),
])
def test_bad_endpoints(text, message):
    with pytest.raises(ValueError, match=message):
        parse_endpoint(text)


def test_endpoint_difference_parses():
    e = parse_endpoint(" B(snapkv-90) - B(recent-90) ")
    assert (e.stat, e.action, e.minus) == ("B", "snapkv-90", ("B", "recent-90"))


@pytest.fixture(scope=per_test_under_mutmut)
def finite_study(tmp_path_factory):
    mix = {"mild": 0.2, "strong": 0.7}
    docs = [Document(id=f"d{i}", prompt="x", stratum="s1" if i < 10 else "s2") for i in range(20)]
    cfg = RunConfig(model="finite", actions=("mild", "strong"), replicates=60, horizon=6,
                    depths=(2, 6), seed=5)
    store = RunStore.open(tmp_path_factory.mktemp("study"), cfg.as_dict())
    pairs = {a: random_pair(3, 6, seed=9, mix=m) for a, m in mix.items()}
    run_units(cfg, docs, lambda d, a: pairs[a], store)
    analysis = analyze(store.read("steps").to_pandas(), store.read("replicates").to_pandas(),
                       AnalysisOptions(bootstrap=400,
                                       endpoints=("R(strong) - R(mild)", "B(mild)"))).to_json()
    truth = {a: exact(pair) for a, pair in pairs.items()}
    return analysis, truth


def test_analysis_matches_exact_quantities(finite_study):
    analysis, truth = finite_study
    for entry in analysis["actions"]:
        t, s = truth[entry["action"]], entry["scalars"]
        # 1,200 trajectories per action; 95% intervals should cover the truth. Each check
        # allows a margin of half an interval width (|z| up to about 3.9); with 20 documents
        # the intervals run a little narrow (z-scores' sd 1.16 over config seeds 0-99, 95%
        # coverage 0.90), and this test fails at 1 of those 100 seeds (seed 37; with torch's
        # own 32-bit CPU seeding also 1 of 100, seed 55): a false-alarm rate of about 1% for
        # the fixed seed 5.
        for name, value in (("R", t.R), ("O", t.O), ("E", t.E), ("Pi", t.Pi), ("F", t.F),
                            ("p_diverge", t.p_tau.sum())):
            iv = s[name]
            margin = (iv["hi"] - iv["lo"]) / 2
            assert iv["lo"] - margin <= value <= iv["hi"] + margin, (entry["action"], name)
        assert s["R"]["estimate"] == pytest.approx(
            s["O"]["estimate"] + s["E"]["estimate"] * s["C"]["estimate"])
        curve = entry["curves"]["expected_delta"]
        np.testing.assert_allclose(curve["estimate"], t.expected_delta, atol=0.06)
        timing = entry["curves"]["timing_cdf"]["estimate"]
        np.testing.assert_allclose(timing, np.cumsum(t.p_tau), atol=0.06)
        full = [b for b in entry["bounds"] if b["L"] == 6][0]
        assert full["B_L"] == 0 and full["R_L"] == pytest.approx(s["R"]["estimate"])
        split = entry["eos_split"]
        assert sum(split["R"]) == pytest.approx(np.mean(curve["estimate"]))


def test_contrasts_endpoints_and_order(finite_study):
    analysis, truth = finite_study
    (c,) = analysis["contrasts"]
    assert (c["a"], c["b"]) == ("strong", "mild")  # a - b: the later action minus the earlier
    d = {k: v["estimate"] for k, v in c.items() if isinstance(v, dict)}
    assert d["dR"] == pytest.approx(d["occurrence_term"] + d["exposure_term"] + d["rate_term"])
    assert c["dR"]["lo"] > 0  # strong drift is clearly worse
    curves = {e["action"]: np.array(e["curves"]["expected_delta"]["estimate"])
              for e in analysis["actions"]}
    gap = c["block_gap"]
    for (lo, hi), est in zip(gap["blocks"], gap["estimate"], strict=True):
        assert est == pytest.approx((curves["strong"] - curves["mild"])[lo - 1:hi].mean())
    names = [e["name"] for e in analysis["endpoints"]]
    assert names == ["R(strong) - R(mild)", "B(mild)"]
    assert all(e["alpha"] == pytest.approx(0.025) for e in analysis["endpoints"])
    ep = analysis["endpoints"][0]
    assert ep["estimate"] == pytest.approx(d["dR"])
    assert ep["hi"] - ep["lo"] >= c["dR"]["hi"] - c["dR"]["lo"]  # adjusted interval is wider
    assert analysis["meta"]["documents"] == {"s1": 10, "s2": 10}


def test_empty_records_are_refused():
    reps = pd.DataFrame()
    with pytest.raises(ValueError, match="no finished units"):
        analyze(pd.DataFrame(), reps, AnalysisOptions())


def test_swrb_study_has_no_lag_windows_and_clamps_enclosures_at_one(tmp_path):
    """SWRB follows no fixed-history path: no lag windows, local agreement or cohort support.
    Its per-replicate window values are estimates that can exceed 1; each document's upper
    bound Z_L + W_L is clamped at 1 before the Hoeffding enclosure."""
    docs = [Document(id=f"d{i:02d}", prompt="x", stratum="s") for i in range(40)]
    cfg = RunConfig(model="finite", actions=("mild",), replicates=4, horizon=4, depths=(2,),
                    estimator="swrb", seed=3)
    store = RunStore.open(tmp_path, cfg.as_dict())
    pair = random_pair(3, 4, seed=9, mix=0.3)
    run_units(cfg, docs, lambda d, a: pair, store)
    steps, reps = store.read("steps").to_pandas(), store.read("replicates").to_pandas()
    # documents 0..9: lower 1 and capacity 0.6 (upper 1.6 -> 1); the rest: 0 and 0.1
    first = reps["doc_id"] < "d10"
    reps["observed"] = [np.array([v]) for v in np.where(first, 1.0, 0.0)]  # the one depth, 2
    reps["capacity"] = [np.array([v]) for v in np.where(first, 0.6, 0.1)]
    out = analyze(steps, reps, AnalysisOptions(bootstrap=50)).to_json()
    assert out["lags"] is None and out["meta"]["estimator"] == "swrb"
    assert out["local_agreement"] == [] and out["cohort_support"] == []
    [entry] = out["actions"]
    # P(tau <= t) from the scan's weights: the replicate mean of their running sums
    w = steps.sort_values(["doc_id", "replicate", "t"])["weight"].to_numpy().reshape(40, 4, 4)
    np.testing.assert_allclose(entry["curves"]["timing_cdf"]["estimate"],
                               w.cumsum(axis=2).mean(axis=(0, 1)), rtol=1e-12)
    assert set(entry["curves"]) == {"timing_cdf"}
    [bound] = entry["bounds"]
    eps = math.sqrt(math.log(4 / 0.05) / (2 * 40))
    assert bound["hoeffding_lo"] == pytest.approx(0.25 - eps)
    assert bound["hoeffding_hi"] == pytest.approx(0.25 * 1.0 + 0.75 * 0.1 + eps)


def test_a_depths_bounds_do_not_depend_on_the_other_depths_recorded(tmp_path):
    """Each depth's bound averages its own window terms: a study recording depths 1..6 gives,
    to the last bit, the bounds at L = 3 of the same study recording L = 3 alone (a joint or
    strided matrix product over the depths would round them differently)."""
    docs = [Document(id=f"d{i:02d}", prompt="x", stratum="s" if i < 23 else "t")
            for i in range(37)]
    pair = random_pair(3, 6, seed=4, mix=0.5)
    bounds = {}
    for depths in ((3,), (1, 2, 3, 4, 5, 6)):
        cfg = RunConfig(model="finite", actions=("a", "b"), replicates=7, horizon=6, seed=2,
                        depths=depths)
        store = RunStore.open(tmp_path / str(len(depths)), cfg.as_dict())
        run_units(cfg, docs, lambda d, a: pair, store)
        out = analyze(store.read("steps").to_pandas(), store.read("replicates").to_pandas(),
                      AnalysisOptions(bootstrap=20)).to_json()
        assert [b["L"] for b in out["actions"][0]["bounds"]] == list(depths)
        bounds[depths] = [b for e in out["actions"] for b in e["bounds"] if b["L"] == 3]
    assert bounds[(3,)] == bounds[(1, 2, 3, 4, 5, 6)]
