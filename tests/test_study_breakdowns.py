"""Per-stratum results, EOS contrasts, local agreement and cohort support on hand-made records.

Every record table here is written by hand (tokens, TV values, EOS), so each statistic is
checked against a value computed on paper.
"""

import math
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from kvdrift.analysis.agreement import agreement_flags, cohort_support, run_length
from kvdrift.analysis.eos import eos_contrast
from kvdrift.analysis.features import EOS_CATEGORIES
from kvdrift.analysis.lags import LagWindows
from kvdrift.analysis.readings import NOT_RECORDED
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.estimate.rollout import RolloutResult, first_mismatch
from kvdrift.run.records import UnitKey, rollout_tables
from tests.messages import whole

EOS = 9


def unit(doc, stratum, action, x, y, delta=None, f=None, depths=()):
    """Step and replicate tables of one (document, action) from ``[K, H]`` token lists."""
    x, y = torch.tensor(x), torch.tensor(y)
    mismatch = x != y
    delta = mismatch.double() if delta is None else torch.tensor(delta, dtype=torch.float64)
    f = torch.zeros_like(delta) if f is None else torch.tensor(f, dtype=torch.float64)
    result = RolloutResult(x=x, y=y, mismatch=mismatch, delta=delta, f=f,
                           x_eos=(x == EOS).int().cummax(dim=1).values.bool(),
                           y_eos=(y == EOS).int().cummax(dim=1).values.bool(),
                           tau=first_mismatch(mismatch), evaluations=x.numel())
    return rollout_tables(UnitKey("m", doc, action, stratum), result, depths)


def records(units):
    steps, reps = zip(*units, strict=True)
    return pa.concat_tables(steps).to_pandas(), pa.concat_tables(reps).to_pandas()


def study(units, bootstrap=300):
    return analyze(*records(units), AnalysisOptions(bootstrap=bootstrap, seed=1)).to_json()


# ------------------------------------------------------------------ local agreement

W16 = LagWindows.for_horizon(16)  # cohort tau <= 8, run length 2
A, B = 1, 2  # two ordinary tokens


def row(pattern, eos_at=None):
    """Tokens (x, y) from a mismatch pattern string ('.' agree, 'x' mismatch), EOS optional."""
    x = [A] * len(pattern)
    y = [B if c == "x" else A for c in pattern]
    if eos_at is not None:  # X emits EOS at eos_at (1-based) and stays there; Y does not
        for t in range(eos_at - 1, len(pattern)):
            x[t] = EOS
            y[t] = B
    return x, y


PATTERNS = [
    # tau = 2; agreements at 3, 4 (a run of 2), mismatch at 5: both flags
    (".x..xxxxxxxxxxxx", None),
    # tau = 3; mismatch 4, agreement 5, mismatch 6: relapse, longest run 1
    ("..xx.xxxxxxxxxxx", None),
    # tau = 2; agreements 3..5 but X emits EOS at 4: only t = 3 is pre-EOS; neither flag
    (".x...xxxxxxxxxxx", 4),
    # tau = 10 > 8: outside the cohort despite a long agreement run
    (".........x......", None),
    # never diverges: outside the cohort
    ("................", None),
    # tau = 2 and never agrees again: in the cohort, neither flag
    (".xxxxxxxxxxxxxxx", None),
]


def test_agreement_run_length_scales_like_the_lag_windows():
    assert run_length(LagWindows.for_horizon(128)) == 16
    assert run_length(LagWindows.for_horizon(32)) == 4
    assert run_length(W16) == 2 and W16.max_entry == 8


def test_agreement_flags_by_hand():
    xs, ys = zip(*(row(p, e) for p, e in PATTERNS), strict=True)
    x, y = np.array(xs), np.array(ys)
    m = x != y
    tau = np.where(m.any(1), m.argmax(1) + 1, 0)
    assert tau.tolist() == [2, 3, 2, 10, 0, 2]
    cohort, run, relapse = agreement_flags(m, tau, np.maximum.accumulate(x == EOS, axis=1),
                                           np.maximum.accumulate(y == EOS, axis=1), W16)
    assert cohort.tolist() == [True, True, True, False, False, True]
    assert run.tolist() == [True, False, False, False, False, False]
    assert relapse.tolist() == [True, True, False, False, False, False]
    # documents stacked [n, K, H]: each replicate's own history, not its neighbours'
    stacked = agreement_flags(np.stack([m, m]), np.stack([tau, tau]),
                              np.stack([np.maximum.accumulate(x == EOS, axis=1)] * 2),
                              np.stack([np.maximum.accumulate(y == EOS, axis=1)] * 2), W16)
    assert stacked[2].tolist() == [relapse.tolist()] * 2


def test_local_agreement_and_support_in_the_analysis():
    # Document d1 (stratum s1) holds rows 0-2, d2 (stratum s2) rows 3-5, both actions alike.
    units = []
    for action in ("a", "b"):
        for doc, stratum, rows in (("d1", "s1", PATTERNS[:3]), ("d2", "s2", PATTERNS[3:])):
            xs, ys = zip(*(row(p, e) for p, e in rows), strict=True)
            units.append(unit(doc, stratum, action, xs, ys))
    analysis = study(units)
    la = {e["action"]: e for e in analysis["local_agreement"]}["a"]
    # Strata weigh 1/2 each; per-document replicate means: d1 cohort 3/3, run 1/3, relapse 2/3;
    # d2 cohort 1/3, run 0, relapse 0. Ratio of weighted means: (1/3)/(4/3) and (2/3)/(4/3).
    assert (la["run_length"], la["max_entry"]) == (2, 8)
    assert la["agree_run"]["estimate"] == pytest.approx(0.25)
    assert la["relapse"]["estimate"] == pytest.approx(0.5)
    assert la["agree_run"]["lo"] <= 0.25 <= la["agree_run"]["hi"]
    support = {e["action"]: e for e in analysis["cohort_support"]}["a"]
    assert support == {"model": "m", "action": "a", "max_entry": 8, "documents": 2,
                       "documents_total": 2, "trajectories": 4, "trajectories_total": 6}


def test_cohort_support_counts_only_given_documents():
    reps = pd.DataFrame({"doc_id": ["d1", "d1", "d2", "d2", "d3"], "tau": [2, 0, 9, 0, 1]})
    got = cohort_support("m", "a", reps, np.array(["d1", "d2"]), W16)
    assert got.to_json() == {"model": "m", "action": "a", "max_entry": 8, "documents": 1,
                             "documents_total": 2, "trajectories": 1, "trajectories_total": 4}


# ------------------------------------------------------------------ EOS contrasts


def test_eos_contrast_by_hand():
    g_a = np.array([0.10, 0.02, 0.03, 0.0])
    g_b = np.array([0.15, 0.01, 0.08, 0.0])
    c = eos_contrast(g_b, g_a)  # b - a
    np.testing.assert_allclose(c["dG"], [0.05, -0.01, 0.05, 0.0])
    assert c["dR_minus_F"] == pytest.approx(0.09)
    assert c["pre_eos"] == pytest.approx(0.05)
    assert c["eos_share"] == pytest.approx(0.04 / 0.09)
    assert np.isnan(eos_contrast(g_a, g_a)["eos_share"])  # Delta(R - F) = 0: undefined
    # a negative total keeps its share; draws [B, 4] give one share per draw
    negative = eos_contrast(g_a - [0.05, 0, 0.05, 0], g_a)
    assert negative["dR_minus_F"] == pytest.approx(-0.1)
    assert negative["eos_share"] == pytest.approx(0.5)
    draws = eos_contrast(np.stack([g_b, g_a]), np.stack([g_a, g_a]))["eos_share"]
    assert draws.shape == (2,) and draws[0] == pytest.approx(0.04 / 0.09) and np.isnan(draws[1])


def eos_unit(doc, stratum, action, shift):
    """H = 4, one replicate: X emits EOS at t = 2, Y at t = 3.

    Categories: t = 1 pre-EOS, t = 2 first EOS, t = 3 one absorbed, t = 4 both absorbed;
    delta - f per position: (shift, 0.4 + shift, 0.2, 0).
    """
    x = [[A, EOS, EOS, EOS]]
    y = [[A, B, EOS, EOS]]
    delta = [[0.1 + shift, 0.6 + shift, 0.3, 0.0]]
    f = [[0.1, 0.2, 0.1, 0.0]]
    return unit(doc, stratum, action, x, y, delta, f)


def test_eos_split_and_contrasts_in_the_analysis():
    # Action b adds 0.08 to delta at t = 1 and t = 2 of every document: pre-EOS and first-EOS
    # parts of R - F each grow by 0.08 / H = 0.02 on every document, so the paired
    # bootstrap interval of each Delta G_r is a single point.
    units = []
    for i, shift in enumerate((0.0, 0.04, 0.12)):
        units.append(eos_unit(f"d{i}", "s", "a", shift))
        units.append(eos_unit(f"d{i}", "s", "b", shift + 0.08))
    analysis = study(units)
    split = {e["action"]: e["eos_split"] for e in analysis["actions"]}["a"]
    mean_shift = (0.0 + 0.04 + 0.12) / 3
    expected = [mean_shift / 4, (0.4 + mean_shift) / 4, 0.2 / 4, 0.0]
    np.testing.assert_allclose(split["R_minus_F"], expected)
    np.testing.assert_allclose([g["estimate"] for g in split["G"]], expected)
    assert split["G_total"]["estimate"] == pytest.approx(sum(expected))
    assert split["G"][0]["lo"] < split["G"][0]["hi"]  # documents differ: a real interval
    (c,) = analysis["eos_contrasts"]
    assert (c["a"], c["b"]) == ("b", "a")  # the later action minus the earlier
    for g, want in zip(c["dG"], [0.02, 0.02, 0.0, 0.0], strict=True):
        assert g["estimate"] == pytest.approx(want)
        assert g["lo"] == pytest.approx(want) and g["hi"] == pytest.approx(want)  # paired
    assert c["dR_minus_F"]["estimate"] == pytest.approx(0.04)
    assert c["pre_eos"]["estimate"] == pytest.approx(0.02)
    assert c["eos_share"]["estimate"] == pytest.approx(0.5)


# ------------------------------------------------------------------ per stratum


def strata_units():
    """H = 8. Stratum s1: two identical documents; s2: two documents that differ.

    Action a never diverges in s1; b diverges at t = 3 and mismatches at 3, 4, 6.
    """
    never = [[A] * 8, [A] * 8]
    late = [[A, A, B, B, A, B, A, A], [A, A, B, B, A, B, A, A]]  # vs X = A...: I at 3, 4, 6
    early = [[A, B, B, B, B, B, B, B], [A, A, A, A, A, A, A, B]]  # tau 2 (7 mismatches); tau 8
    x = [[A] * 8, [A] * 8]
    return [
        unit("d1", "s1", "a", x, never), unit("d2", "s1", "a", x, never),
        unit("d1", "s1", "b", x, late), unit("d2", "s1", "b", x, late),
        unit("d3", "s2", "a", x, late), unit("d4", "s2", "a", x, never),
        unit("d3", "s2", "b", x, early), unit("d4", "s2", "b", x, late),
    ]


def test_per_stratum_quantities_by_hand():
    analysis = study(strata_units())
    got = {(s["stratum"], a["action"]): a["scalars"]
           for s in analysis["strata"] for a in s["actions"]}
    assert {s["stratum"]: s["documents"] for s in analysis["strata"]} == {"s1": 2, "s2": 2}
    H = 8
    # s1, b: every trajectory tau = 3, mismatches at 3, 4, 6.
    s1b = got[("s1", "b")]
    assert s1b["R"]["estimate"] == pytest.approx(3 / H)
    assert s1b["O"]["estimate"] == pytest.approx(1 / H)
    assert s1b["E"]["estimate"] == pytest.approx(5 / H)
    assert s1b["C"]["estimate"] == pytest.approx(2 / 5)
    assert s1b["p_diverge"]["estimate"] == pytest.approx(1.0)
    # Identical documents: the within-stratum bootstrap cannot move the estimate.
    assert s1b["R"]["lo"] == pytest.approx(3 / H) and s1b["R"]["hi"] == pytest.approx(3 / H)
    assert got[("s1", "a")]["R"]["estimate"] == 0.0
    # s2, a: d3 has R = 3/8 (both replicates), d4 has 0: the mean 3/16, and a real interval.
    s2a = got[("s2", "a")]["R"]
    assert s2a["estimate"] == pytest.approx(3 / 16)
    assert s2a["lo"] == pytest.approx(0.0) and s2a["hi"] == pytest.approx(3 / 8)
    # s2, b: d3 replicates R = 7/8 and 1/8, d4 3/8: (4/8 + 3/8) / 2.
    assert got[("s2", "b")]["R"]["estimate"] == pytest.approx(7 / 16)
    # The whole study weighs strata equally: R(b) = (3/8 + 7/16) / 2.
    whole = {a["action"]: a["scalars"] for a in analysis["actions"]}
    assert whole["b"]["R"]["estimate"] == pytest.approx((3 / 8 + 7 / 16) / 2)


def test_per_stratum_contrasts_by_hand():
    analysis = study(strata_units())
    c = {s["stratum"]: s["contrasts"][0] for s in analysis["strata"]}["s1"]
    assert (c["a"], c["b"]) == ("b", "a")  # the later action minus the earlier
    # a: R = O = E = C = 0; b: O = 1/8, E = 5/8, C = 2/5, R = 3/8.
    assert c["dR"]["estimate"] == pytest.approx(3 / 8)
    assert c["occurrence_term"]["estimate"] == pytest.approx(1 / 8)
    assert c["exposure_term"]["estimate"] == pytest.approx(5 / 8 * (0 + 2 / 5) / 2)
    assert c["rate_term"]["estimate"] == pytest.approx(2 / 5 * (0 + 5 / 8) / 2)
    assert c["exposure_share"]["estimate"] == pytest.approx((1 / 8) / (3 / 8))
    # Block gap: delta = mismatch here, so E[delta_t] of b minus a is 1 at t = 3, 4, 6, else 0;
    # 8 positions in 8 blocks of one.
    gap = c["block_gap"]
    assert gap["blocks"] == [[t, t] for t in range(1, 9)]
    np.testing.assert_allclose(gap["estimate"], [0, 0, 1, 1, 0, 1, 0, 0])
    np.testing.assert_allclose(gap["lo"], gap["hi"])  # identical documents
    # B(a) per stratum: H = 8 cohort tau <= 4, lags 1..4, early j = 1, late j = 4.
    # b in s1: tau = 3, delta at 4, 5, 6, 7 = 1, 0, 1, 0: B = 0 - 1 = -1.
    b_s1 = {a["action"]: a["scalars"] for s in analysis["strata"] if s["stratum"] == "s1"
            for a in s["actions"]}["b"]["B"]
    assert b_s1["estimate"] == pytest.approx(-1.0)


# ------------------------------------------------------------------ the analysis' fields


def pattern_unit(doc, stratum, action, patterns, depths=(2, 10)):
    rows = [row(p) for p in patterns]
    return unit(doc, stratum, action, [r[0] for r in rows], [r[1] for r in rows],
                depths=depths)


FIELD_UNITS = [
    # H = 12, K = 2; strata s (two documents) and t (one)
    ("d1", "s", "a", [".x.xxxxxxxxx", "............"]),
    ("d2", "s", "a", ["..xxxxxxxxxx", "...x..xxxxxx"]),
    ("d3", "t", "a", ["............", "..........x."]),
    ("d1", "s", "b", ["xxxxxxxxxxxx", "x..........."]),
    ("d2", "s", "b", [".x..........", "xxxxxxxxxxxx"]),
    ("d3", "t", "b", ["x.x.x.x.x.x.", "............"]),
]


def field_records():
    return records([pattern_unit(*u) for u in FIELD_UNITS])


def test_analysis_fields_by_hand():
    steps, reps = field_records()
    options = AnalysisOptions(bootstrap=20, alpha=0.1, endpoints=("R(a)",), seed=0)
    out = analyze(steps, reps, options, meta={"run": "demo"}).to_json()
    assert out["meta"] == {
        "run": "demo", "estimator": "rollout", "horizon": 12, "replicates": 2, "bootstrap": 20,
        "alpha": 0.1, "documents": {"s": 2, "t": 1},
        "notes": ["m: strata with a single document (t) contribute no between-document "
                  "variation, so intervals understate uncertainty; use at least two documents "
                  "per stratum.",
                  NOT_RECORDED.format(model="m")]}  # these records have no logp_x, ... columns
    windows = LagWindows.for_horizon(12)
    assert out["lags"] == windows.as_dict()
    for entry, action in zip(out["actions"], "ab", strict=True):
        assert set(entry) == {"model", "action", "documents", "kv_bytes", "kv_fraction",
                              "kv_bytes_generation", "kv_fraction_generation", "compressions",
                              "scalars", "curves", "eos_split", "bounds"}
        # records without Q's cache size (only language-model pairs tell it): NaN (null)
        assert math.isnan(entry["kv_bytes"]) and math.isnan(entry["kv_fraction"])
        assert math.isnan(entry["kv_bytes_generation"]) and entry["compressions"] == []
        assert (entry["model"], entry["action"], entry["documents"]) == ("m", action, 3)
        assert set(entry["curves"]) == {"timing_cdf", "expected_delta", "lag_profile",
                                        "lag_profile_strict"}
        split = entry["eos_split"]
        assert split["categories"] == list(EOS_CATEGORIES)
        assert split["G_total"]["estimate"] == pytest.approx(sum(split["R_minus_F"]))
        assert [b["L"] for b in entry["bounds"]] == [2, 10]  # by depth, not as text
        for b in entry["bounds"]:
            assert set(b) == {"L", "R_L", "B_L", "lo", "hi", "minimax", "hoeffding_lo",
                              "hoeffding_hi"}
            assert b["lo"] == b["R_L"] and b["hi"] == pytest.approx(b["R_L"] + b["B_L"])
    [c] = out["contrasts"]
    assert (c["model"], c["a"], c["b"]) == ("m", "b", "a")
    [e] = out["endpoints"]
    assert (e["model"], e["name"], e["alpha"]) == ("m", "R(a)", 0.1)  # one endpoint, one model
    r_a = out["actions"][0]["scalars"]["R"]["estimate"]
    assert e["estimate"] == pytest.approx(r_a)
    assert out["eos_contrasts"] and all(x["model"] == "m" for x in out["eos_contrasts"])
    assert all(x["categories"] == list(EOS_CATEGORIES) for x in out["eos_contrasts"])
    assert out["strata"] and all(x["model"] == "m" for x in out["strata"])
    s = next(x for x in out["strata"] if x["stratum"] == "s")
    b_a = s["actions"][0]["scalars"]["B"]
    assert all(np.isfinite([b_a["estimate"], b_a["lo"], b_a["hi"]]))  # draws have lag windows
    # cohort support: each action's own replicates (cohort tau <= 6 here)
    for support, action in zip(out["cohort_support"], "ab", strict=True):
        own = reps[reps["action"] == action]
        want = cohort_support("m", action, own, np.array(["d1", "d2", "d3"]), windows)
        assert support == want.to_json()
    assert out["cohort_support"][0] != out["cohort_support"][1] | {"action": "a"}
    assert [x["action"] for x in out["local_agreement"]] == ["a", "b"]


def test_endpoints_share_alpha_over_models_and_endpoints():
    steps, reps = field_records()
    two = (pd.concat([steps, steps.assign(model="n")]), pd.concat([reps, reps.assign(model="n")]))
    out = analyze(*two, AnalysisOptions(bootstrap=20, alpha=0.1,
                                        endpoints=("R(a)", "R(b) - R(a)"))).to_json()
    assert [(e["model"], e["name"]) for e in out["endpoints"]] == [
        ("m", "R(a)"), ("m", "R(b) - R(a)"), ("n", "R(a)"), ("n", "R(b) - R(a)")]
    assert all(e["alpha"] == pytest.approx(0.1 / 4) for e in out["endpoints"])
    r = {x["action"]: x["scalars"]["R"]["estimate"] for x in out["actions"][:2]}
    assert out["endpoints"][1]["estimate"] == pytest.approx(r["b"] - r["a"])
    with pytest.raises(ValueError, match="^" + re.escape(
            "action in endpoint 'R(z) - R(a)' must be one of the actions of model 'm': a, b; "
            "got 'z'") + "$"):
        analyze(steps, reps, AnalysisOptions(bootstrap=20, endpoints=("R(z) - R(a)",))).to_json()


def test_only_documents_finished_for_every_action_count():
    units = [pattern_unit(*u) for u in FIELD_UNITS if (u[0], u[2]) != ("d1", "b")]
    out = analyze(*records(units), AnalysisOptions(bootstrap=20)).to_json()
    assert [e["documents"] for e in out["actions"]] == [2, 2]
    assert out["meta"]["documents"] == {"s": 1, "t": 1}
    one = [pattern_unit(*u) for u in FIELD_UNITS if u[0] == "d2" or (u[0], u[2]) == ("d1", "a")]
    assert [e["documents"] for e in analyze(*records(one), AnalysisOptions(
        bootstrap=20)).to_json()["actions"]] == [1, 1]
    apart = [pattern_unit(*u) for u in FIELD_UNITS if (u[0] == "d1") == (u[2] == "a")]
    with pytest.raises(ValueError, match="^no document has finished for every action of this "
                                         "model yet$"):
        analyze(*records(apart), AnalysisOptions(bootstrap=20)).to_json()


def test_every_lonely_stratum_is_named():
    steps, reps = field_records()
    for frame in (steps, reps):
        frame.loc[frame["doc_id"] == "d2", "stratum"] = "u"
    out = analyze(steps, reps, AnalysisOptions(bootstrap=20)).to_json()
    assert out["meta"]["notes"][:1] == [  # then: no teacher-forced columns in these records
        "m: strata with a single document (s, t, u) contribute no between-document variation, "
        "so intervals understate uncertainty; use at least two documents per stratum."]
    with pytest.raises(ValueError, match="^no finished units to analyze$"):
        analyze(steps.iloc[:0], reps.iloc[:0], AnalysisOptions(bootstrap=20))


def test_mixed_horizons_are_refused():
    steps, reps = field_records()
    reps.loc[reps["action"] == "b", "horizon"] = 16
    with pytest.raises(ValueError, match=re.escape("the records mix horizon values ['12', "
                                                   "'16']; analyse runs with one each")):
        analyze(steps, reps, AnalysisOptions(bootstrap=20)).to_json()


def test_certified_order_uses_weighted_enclosures_at_alpha_over_actions():
    """At L = H: action 'good' has bounds [0, 0], 'bad' [u, u] in every document. Enclosures
    are [0, eps] and [u - eps, u + eps] with eps at alpha / 2 (two actions) and Hoeffding's
    weighted sum over strata s (18 documents) and t (6): the order is certified iff
    u > 2 eps."""
    H = 12
    docs = [(f"d{i:02d}", "s" if i < 18 else "t") for i in range(24)]
    units = [pattern_unit(doc, stratum, action, ["." * H] * 2, depths=(6, H))
             for doc, stratum in docs for action in ("good", "bad")]
    steps, reps = records(units)
    w = np.array([1 / 36] * 18 + [1 / 12] * 6)
    eps = math.sqrt(math.log(4 / (0.05 / 2)) * float((w ** 2).sum()) / 2)
    assert 2 * eps < 1
    for u, certified in ((2 * eps - 0.002, False), (2 * eps + 0.002, True)):
        r = reps.copy()
        # no capacity left at either depth (6 and H): every L certifies alike
        r["observed"] = [np.array([u, u]) if a == "bad" else o
                         for a, o in zip(r["action"], r["observed"], strict=True)]
        r["capacity"] = [np.zeros(2)] * len(r)
        out = analyze(steps, r, AnalysisOptions(bootstrap=20)).to_json()
        want = [{"model": "m", "L": L, "better": "good", "worse": "bad"}
                for L in (6, H)] if certified else []
        assert out["certified_order"] == want, u
        bad = next(e for e in out["actions"] if e["action"] == "bad")["bounds"][1]
        eps1 = math.sqrt(math.log(4 / 0.05) * float((w ** 2).sum()) / 2)  # the action's own
        assert bad["hoeffding_lo"] == pytest.approx(u - eps1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(bootstrap=True), "bootstrap draws must be an integer >= 0; got True"),
    (dict(bootstrap=1.5), "bootstrap draws must be an integer >= 0; got 1.5"),
    (dict(bootstrap=-1), "bootstrap draws must be an integer >= 0; got -1"),
    (dict(alpha=0.0), "alpha must be within (0, 1); got 0.0"),
    (dict(alpha=1.0), "alpha must be within (0, 1); got 1.0"),
])
def test_analysis_options_are_checked(kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        AnalysisOptions(**kwargs)
    assert AnalysisOptions(bootstrap=1, alpha=0.999).bootstrap == 1


def test_action_features_wire_each_column():
    from kvdrift.analysis.features import DocFeatures, action_features
    from kvdrift.analysis.lags import lag_terms

    # H = 16, K = 2: replicate 0 diverges at 2 and X emits EOS at 6; replicate 1 at 3
    x0, y0 = row(".x..xxxxxxxxxxxx", eos_at=6)
    x1, y1 = row("..xxxxxxxxxxxxxx")
    delta = [[0.0, 0.99, 0.995] + [0.5] * 13, [0.0, 0.2, 0.99] + [0.7] * 13]
    steps, reps = records([unit("d1", "s", "a", [x0, x1], [y0, y1], delta=delta)])
    f = action_features(steps, reps, W16)
    d = np.array(delta)[None]
    tau = np.array([[2, 3]])
    x_eos = np.array([[t >= 5 for t in range(16)], [False] * 16])[None]
    no_eos = np.zeros_like(x_eos)
    plain, strict = lag_terms(d, tau, W16), lag_terms(d, tau, W16, (x_eos, no_eos))
    np.testing.assert_allclose(f.columns["lag_num"], plain[0])
    np.testing.assert_allclose(f.columns["lag_num_strict"], strict[0])
    np.testing.assert_allclose(f.columns["lag_den_strict"], strict[1])
    assert not np.allclose(plain[1], strict[1])  # EOS at 6 cuts replicate 0's lags 4..8
    assert f.columns["saturation"][0, 0] == pytest.approx(1 / 32)  # only 0.995 is > 0.99
    np.testing.assert_allclose(f.columns["timing"][0], [0] + [0.5] + [1] * 14)
    with pytest.raises(ValueError, match="^some documents are missing for this action$"):
        f.subset(np.array(["d1", "d2"]))
    assert isinstance(f.subset(np.array(["d1"])), DocFeatures)
    with pytest.raises(ValueError, match=whole(
            "step records are incomplete: every document needs K x H steps; short: m · d1 · a "
            "(31 of 32 rows); rerun the run or study to recompute them")):
        action_features(steps.iloc[:-1], reps, W16)


EDGE_PATTERNS = [
    "x..x............",  # tau = 1 (in the cohort): agreements 2, 3, relapse at 4
    ".......x..x.....",  # tau = 8 = max_entry (in the cohort): run of 2, relapse at 11
    ".x.............x",  # tau = 2, relapse at the last position H = 16
]


def test_agreement_flags_at_the_cohort_and_horizon_edges():
    xs, ys = zip(*(row(p) for p in EDGE_PATTERNS), strict=True)
    m = np.array(xs) != np.array(ys)
    tau = np.array([1, 8, 2])
    no_eos = np.zeros_like(m)
    cohort, run, relapse = agreement_flags(m, tau, no_eos, no_eos, W16)
    assert cohort.tolist() == [True, True, True]
    assert run.tolist() == [True, True, True] and relapse.tolist() == [True, True, True]
    # 0/1 numbers read as flags; a stack of documents [n, K, H] gives each row's flags
    for numbers in (m.astype(int), m.astype(float)):
        flags = agreement_flags(numbers, tau, no_eos, no_eos, W16)
        assert [f.tolist() for f in flags] == [cohort.tolist(), run.tolist(), relapse.tolist()]
    stacked = agreement_flags(np.stack([m, m[::-1]]), np.stack([tau, tau[::-1]]),
                              np.stack([no_eos] * 2), np.stack([no_eos] * 2), W16)
    assert stacked[2].tolist() == [[True] * 3] * 2
    late = np.array([row(".x.....x.......x")[0]]) != np.array([row(".x.....x.......x")[1]])
    _, _, only_late = agreement_flags(late[:, :8].repeat(2, 0), np.array([2, 2]),
                                      np.zeros((2, 8), bool), np.zeros((2, 8), bool),
                                      LagWindows.for_horizon(8))
    assert only_late.tolist() == [True, True]  # relapse at t = 8 = H
    support = cohort_support("m", "a", pd.DataFrame({"doc_id": ["d1", "d2", "d3"],
                                                     "tau": [1, 8, 9]}),
                             np.array(["d1", "d2", "d3"]), W16)
    assert (support.documents, support.trajectories) == (2, 2)


def test_run_rows_are_the_full_analysis_point_estimates_without_intervals():
    from kvdrift.report.terminal import run_rows

    steps, reps = field_records()
    swap = {"a": "b", "b": "a"}  # model n's a is m's b
    two = (pd.concat([steps.assign(model="n", action=steps["action"].map(swap)), steps]),
           pd.concat([reps.assign(model="n", action=reps["action"].map(swap)), reps]))
    point = analyze(*two, AnalysisOptions(bootstrap=0))
    rows = run_rows(point)
    assert [(r["model"], r["action"]) for r in rows] == [("n", "b"), ("n", "a"), ("m", "a"),
                                                        ("m", "b")]
    assert rows[0]["R"] == rows[2]["R"] and rows[1]["R"] == rows[3]["R"]
    assert rows[0]["R"] != rows[1]["R"]
    # no resample: every bootstrap interval's ends are NaN, never a made-up width
    assert point.meta.bootstrap == 0
    for a in point.actions:
        assert all(math.isnan(iv.lo) and math.isnan(iv.hi) for iv in a.scalars.values())
        assert all(math.isnan(v) for c in a.curves.values() for v in (*c.lo, *c.hi))
    assert all(math.isnan(iv.lo) for c in point.contrasts for iv in c.terms.values())
    full = analyze(steps, reps, AnalysisOptions(bootstrap=20))
    out = full.to_json()
    assert point.to_frame()[["model", "action", "R", "E", "C"]].iloc[2:].reset_index(
        drop=True).equals(full.to_frame()[["model", "action", "R", "E", "C"]])
    # a third model with a third action: each unit reads its own steps, not the others'
    third = [pd.concat([r.assign(model="o"), r[r.action == "a"].assign(model="o", action="c")])
             for r in (steps, reps)]
    rows3 = run_rows(analyze(*(pd.concat([t, r]) for t, r in zip(two, third, strict=True)),
                             AnalysisOptions(bootstrap=0)))
    assert [(r["model"], r["action"]) for r in rows3[4:]] == [("o", "a"), ("o", "b"),
                                                             ("o", "c")]
    assert [r["R"] for r in rows3[4:]] == [rows[2]["R"], rows[3]["R"], rows[2]["R"]]
    for d, entry, spec in zip(rows[2:], out["actions"], out["speculative"], strict=True):
        assert d.pop("model") == "m" and d.pop("action") == entry["action"]
        assert d.pop("documents") == 3
        assert d.pop("acceptance") == spec["acceptance"]["estimate"]
        # these records have no teacher-forced columns: no KL, no tokens per round
        assert math.isnan(d.pop("kl")) and math.isnan(d.pop("tokens_per_round"))
        # nor Q's cache size (only LM pairs tell it)
        assert math.isnan(d.pop("kv_bytes")) and math.isnan(d.pop("kv_fraction"))
        assert math.isnan(d.pop("kv_fraction_generation"))
        for key, value in d.items():
            want = entry["scalars"][key]["estimate"]
            assert value == want or math.isnan(value) and math.isnan(want), key


def test_cache_size_is_the_stratum_weighted_mean_of_document_values():
    from kvdrift.analysis.results import StudyAnalysis
    from kvdrift.json_values import to_json_safe
    from kvdrift.report.terminal import run_rows

    steps, reps = field_records()
    # by hand: Q's prompt cache per (document, action), in bytes, of a full cache of 4096
    size = {("d1", "a"): 1024.0, ("d2", "a"): 2048.0, ("d3", "a"): 3072.0,
            ("d1", "b"): 512.0, ("d2", "b"): 512.0, ("d3", "b"): 4096.0}
    reps["kv_bytes"] = [size[d, a] for d, a in zip(reps["doc_id"], reps["action"], strict=True)]
    reps["kv_fraction"] = reps["kv_bytes"] / 4096
    # strata s = {d1, d2} and t = {d3} weigh equally: (mean over s + value of d3) / 2
    want = {"a": ((1024 + 2048) / 2 + 3072) / 2, "b": ((512 + 512) / 2 + 4096) / 2}
    assert want == {"a": 2304.0, "b": 2304.0}  # same mean, different documents
    result = analyze(steps, reps, AnalysisOptions(bootstrap=20, seed=0))
    out = result.to_json()
    point = run_rows(analyze(steps, reps, AnalysisOptions(bootstrap=0)))
    for entry, row in zip(out["actions"], point, strict=True):
        action = entry["action"]
        assert entry["kv_bytes"] == pytest.approx(want[action])
        assert entry["kv_fraction"] == pytest.approx(want[action] / 4096)
        assert (row["action"], row["kv_bytes"]) == (action, pytest.approx(want[action]))
        assert row["kv_fraction"] == pytest.approx(want[action] / 4096)
    # a stratum of one document counts as much as a stratum of two: not the plain mean
    reps.loc[reps["doc_id"] == "d3", "kv_bytes"] = 0.0
    entry = analyze(steps, reps, AnalysisOptions(bootstrap=20)).to_json()["actions"][0]
    assert entry["kv_bytes"] == pytest.approx((1024 + 2048) / 4)  # plain mean: 1024
    # the frame and analysis.json read back carry them; other scalars are unchanged
    frame = result.to_frame()
    assert frame["kv_fraction"].tolist() == pytest.approx([want["a"] / 4096, want["b"] / 4096])
    back = StudyAnalysis.from_json(out)
    assert back.action("m", "b").kv_bytes == pytest.approx(want["b"])
    plain = analyze(*field_records(), AnalysisOptions(bootstrap=20, seed=0)).to_json()
    assert to_json_safe([a["scalars"] for a in out["actions"]]) == to_json_safe(
        [a["scalars"] for a in plain["actions"]])  # NaN -> None, so that NaN == NaN
    # a cache size that was not recorded (null in analysis.json) reads as NaN
    for a in out["actions"]:
        a["kv_bytes"] = a["kv_fraction"] = None
    old = StudyAnalysis.from_json(out).action("m", "a")
    assert math.isnan(old.kv_bytes) and math.isnan(old.kv_fraction)


def test_incomplete_replicate_records_are_named():
    from kvdrift.analysis.features import action_features

    steps, reps = records([pattern_unit(*u) for u in FIELD_UNITS[:2]])
    with pytest.raises(ValueError, match=whole(
            "replicate records are incomplete: every document needs K replicates; short: "
            "m · d2 · a (1 of 2 rows); rerun the run or study to recompute them")):
        action_features(steps, reps.iloc[:-1], None)
