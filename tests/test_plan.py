"""Planning a study: variance components, the cheapest design, rollouts against SWRB."""

import math
import re
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from kvdrift.analysis.plan import (
    VarianceComponents,
    halfwidth,
    plan_study,
    recommend,
    swrb_evaluations,
    variance_components,
    with_saturation,
)

Z = NormalDist().inv_cdf(0.975)


def test_variance_components_hand_values():
    # One stratum, 3 documents, K = 2: document means 0.5, 1, 0; within variances 1/2, 0, 0.
    v = variance_components(np.array([[0, 1], [1, 1], [0, 0]]), np.array(["s"] * 3))
    assert v.within == pytest.approx(1 / 6)           # mean of (1/2, 0, 0)
    assert v.between == pytest.approx(0.25 - (1 / 6) / 2)  # var of means minus within / K
    assert (v.strata, v.documents, v.replicates) == (1, 3, 2)


def test_variance_components_average_over_strata_and_floor_at_zero():
    values = np.array([[0, 1], [1, 0], [0.2, 0.2], [0.4, 0.4]])
    v = variance_components(values, np.array(["a", "a", "b", "b"]))
    # Stratum a: within 1/2, means equal (spread 0); stratum b: within 0, spread 0.02.
    assert v.within == pytest.approx((0.5 + 0) / 2)
    assert v.between == 0.0  # (0 + 0.02) / 2 - 0.25 / 2 < 0


def test_recommendation_matches_a_hand_computation():
    # between = within = 1/6, one stratum, half-width 0.1, c_doc = 3 s, c_rep = 1 s:
    # K = 1: n = ceil(z^2 (1/3) / 0.01) = 129, cost 129 * 4 = 516
    # K = 2: n = ceil(z^2 (1/4) / 0.01) = 97,  cost  97 * 5 = 485   <- cheapest
    # K = 3: n = ceil(z^2 (2/9) / 0.01) = 86,  cost  86 * 6 = 516
    v = VarianceComponents(between=1 / 6, within=1 / 6, strata=1, documents=3, replicates=2)
    d = recommend(v, 0.1, setup_seconds=3.0, replicate_seconds=1.0, z=Z)
    assert (d.documents_per_stratum, d.replicates, d.seconds) == (97, 2, 485.0)
    assert d.halfwidth == pytest.approx(Z * math.sqrt(0.25 / 97)) and d.halfwidth <= 0.1
    # Strata share the documents: three strata need a third as many per stratum.
    v3 = VarianceComponents(1 / 6, 1 / 6, 3, 9, 2)
    assert recommend(v3, 0.1, 3.0, 1.0, Z).documents_per_stratum == 33
    assert halfwidth(v3, 33, 2, Z) <= 0.1 < halfwidth(v3, 32, 2, Z)


def test_swrb_evaluations_from_first_mismatches():
    # H = 4: the scan (4) plus E[H - tau | diverged] = mean(4 - 2, 4 - 4) = 1.
    assert swrb_evaluations(4, np.array([2, 0, 4])) == 5.0
    assert swrb_evaluations(4, np.array([0, 0])) == 4.0


def _replicates(values_a, values_b, strata, setup=(2.0, 1.0), per_rep=(0.5, 0.25), H=4,
                tau=2):
    rows = []
    for action, values, c0, c1 in (("a", values_a, setup[0], per_rep[0]),
                                   ("b", values_b, setup[1], per_rep[1])):
        for i, row in enumerate(values):
            for k, x in enumerate(row):
                rows.append(dict(model="m", doc_id=f"d{i}", stratum=strata[i], action=action,
                                 replicate=k, estimator="rollout", horizon=H, risk=x,
                                 fixed_risk=0.0, tau=tau, evaluations=H,
                                 setup_seconds=c0, replicate_seconds=c1))
    return pd.DataFrame(rows)


def test_plan_of_a_paired_contrast_from_records():
    # R(a) - R(b) per replicate pair: [0, 1], [1, 1], [0, 0] as in the hand example above.
    b = np.array([[0.1, 0.2], [0.3, 0.1], [0.0, 0.2]])  # paired per document and replicate
    reps = _replicates(np.array([[0, 1], [1, 1], [0, 0]]) + b, b, ["s"] * 3,
                       setup=(2.0, 1.0), per_rep=(0.5, 0.5))
    out = plan_study(reps, "R(a) - R(b)", 0.1).to_json()
    [m] = out["models"]
    assert m["variance"]["within"] == pytest.approx(1 / 6)
    assert m["variance"]["between"] == pytest.approx(1 / 6)
    assert m["setup_seconds"] == 3.0 and m["replicate_seconds"] == 1.0  # both actions
    assert (m["recommended"]["documents_per_stratum"], m["recommended"]["replicates"]) == (97, 2)
    # SWRB's replicate: 4 + (4 - 2) = 6 evaluations against 4; with equal variance it costs
    # more, and it breaks even once its within-document variance is ~ 1.5x smaller or more.
    cmp = m["comparison"]
    assert cmp["cheaper"] == "rollout"
    assert cmp["evaluations_per_replicate"] == {"rollout": 4.0, "swrb": 6.0}
    assert 1.2 < cmp["break_even_variance_ratio"] < 3.0


def test_break_even_is_the_cost_ratio_when_documents_are_free():
    # No setup cost and no between-document variance: cost ~ within * c_rep / h^2, so SWRB
    # (1.5x the evaluations) breaks even when its within variance is 1.5x smaller.
    rng = np.random.default_rng(0)
    a = np.stack([rng.permutation(np.linspace(0, 1, 8)) for _ in range(40)])  # equal means
    reps = _replicates(a, a * 0, ["s"] * 40, setup=(0.0, 0.0), per_rep=(1.0, 0.0))
    reps["risk"] = np.where(reps["action"] == "a", reps["risk"], 0.0)
    out = plan_study(reps, "R(a)", 0.005).to_json()
    cmp = out["models"][0]["comparison"]
    assert out["models"][0]["variance"]["between"] == 0.0
    assert cmp["break_even_variance_ratio"] == pytest.approx(1.5, rel=0.05)


@pytest.mark.parametrize("target, message", [
    ("R(a) - R(z)", "action in target 'R(a) - R(z)' must be one of the actions of the "
                    "development run: a, b; got 'z'"),
    ("B(a)", "statistic (a document-level mean) must be one of p_diverge, R, R_tv, O, E, Pi, F, "
             "R_minus_F, S99; got 'B'"),
    ("R(a", "cannot read 'R(a'"),
])
def test_bad_targets_are_named(target, message):
    reps = _replicates(np.zeros((3, 2)), np.zeros((3, 2)), ["s"] * 3)
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_study(reps, target, 0.01)


def test_runs_without_timing_records_are_refused():
    reps = _replicates(np.zeros((3, 2)), np.zeros((3, 2)), ["s"] * 3).drop(
        columns=["setup_seconds", "replicate_seconds"])
    with pytest.raises(ValueError, match="no wall-time records"):
        plan_study(reps, "R(a)", 0.01)


# --- every field of a plan, by hand ------------------------------------------------------------

PAIRED_B = np.array([[0.1, 0.2], [0.3, 0.1], [0.0, 0.2]])
PAIRED_A = np.array([[0, 1], [1, 1], [0, 0]]) + PAIRED_B  # R(a) - R(b): the hand example


def _break_even_by_scan(v: VarianceComponents, swrb_rep: float, rollout_cost: float) -> float:
    """The smallest variance ratio (0.1% grid) at which SWRB's plan costs no more."""
    r = 1.0
    while recommend(VarianceComponents(v.between, v.within / r, v.strata, v.documents,
                                       v.replicates), 0.1, 3.0, swrb_rep, Z).seconds > rollout_cost:
        r *= 1.001
    return r


def test_plan_of_a_rollout_run_field_by_field():
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3, setup=(2.0, 1.0), per_rep=(0.5, 0.5))
    out = plan_study(reps, "R(a) - R(b)", 0.1).to_json()
    [m] = out.pop("models")
    assert out == {"target": "R(a) - R(b)", "halfwidth": 0.1, "alpha": 0.05, "endpoints": 1,
                   "level": 0.95, "z": Z}
    v = VarianceComponents(1 / 6, 1 / 6, 1, 3, 2)
    cmp = m.pop("comparison")
    assert m == {
        "model": "m", "estimator": "rollout",
        "variance": {"between": pytest.approx(1 / 6), "within": pytest.approx(1 / 6),
                     "strata": 1, "documents": 3, "replicates": 2},
        "setup_seconds": 3.0, "replicate_seconds": 1.0,
        "recommended": {"documents_per_stratum": 97, "replicates": 2,
                        "halfwidth": pytest.approx(Z * math.sqrt(0.25 / 97)), "seconds": 485.0},
        "current": {"documents_per_stratum": 3.0, "replicates": 2,
                    "halfwidth": pytest.approx(Z * math.sqrt((1 / 6 + 1 / 12) / 3))},
        "notes": [],
    }
    # SWRB: 6 evaluations a replicate against 4, so 1.5 s; equal variance:
    # K = 1: n = 129, 129 * 4.5 = 580.5 (K = 2: 97 * 6 = 582) -> dearer than 485
    break_even = cmp.pop("break_even_variance_ratio")
    assert cmp == {
        "cheaper": "rollout",
        "assumption": "the unmeasured estimator has the measured one's variance (for SWRB an "
                      "upper bound) and costs in proportion to its kernel-pair evaluations per "
                      "replicate",
        "evaluations_per_replicate": {"rollout": 4.0, "swrb": 6.0},
        "plans": {"rollout": {"documents_per_stratum": 97, "replicates": 2,
                              "halfwidth": pytest.approx(Z * math.sqrt(0.25 / 97)),
                              "seconds": 485.0},
                  "swrb": {"documents_per_stratum": 129, "replicates": 1,
                           "halfwidth": pytest.approx(Z * math.sqrt((1 / 3) / 129)),
                           "seconds": 580.5}},
    }
    truth = _break_even_by_scan(v, 1.5, 485.0)
    assert truth / 1.001 <= break_even <= truth * 1.011  # the bisection stops within 1%


def test_plan_of_a_swrb_run_compares_with_rollouts():
    # The same values measured by SWRB (6 evaluations a replicate): rollouts cost 4 / 6 as much.
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3, setup=(2.0, 1.0), per_rep=(0.75, 0.75))
    reps["estimator"], reps["evaluations"] = "swrb", 6
    [m] = plan_study(reps, "R(a) - R(b)", 0.1).to_json()["models"]
    cmp = m["comparison"]
    assert m["estimator"] == "swrb" and m["replicate_seconds"] == 1.5
    assert cmp["evaluations_per_replicate"] == {"swrb": 6.0, "rollout": 4.0}
    assert cmp["plans"]["rollout"] == {"documents_per_stratum": 97, "replicates": 2,
                                       "halfwidth": pytest.approx(Z * math.sqrt(0.25 / 97)),
                                       "seconds": 485.0}
    assert cmp["plans"]["swrb"]["seconds"] == 580.5 and cmp["cheaper"] == "rollout"
    # the rollouts' within variance is ratio x SWRB's: the same break-even as measured the other
    # way round (the rollout plan's within grows with the ratio; SWRB's stays measured)
    v = VarianceComponents(1 / 6, 1 / 6, 1, 3, 2)
    ratio = cmp["break_even_variance_ratio"]
    rollout = recommend(VarianceComponents(v.between, v.within * ratio, 1, 3, 2), 0.1, 3.0, 1.0,
                        Z).seconds
    assert 580.5 <= rollout  # at the break-even SWRB's plan is no dearer
    below = recommend(VarianceComponents(v.between, v.within * ratio / 1.011, 1, 3, 2), 0.1,
                      3.0, 1.0, Z).seconds
    assert below < 580.5 + 1e-9 or ratio == 1.0


def test_ties_go_to_swrb_and_a_break_even_of_one():
    # No replicate diverges: SWRB's replicate is the scan alone (H evaluations), its plan is the
    # rollouts' plan, and a tie counts for SWRB (its variance is never larger).
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3, tau=0)
    cmp = plan_study(reps, "R(a) - R(b)", 0.1).to_json()["models"][0]["comparison"]
    assert cmp["evaluations_per_replicate"] == {"rollout": 4.0, "swrb": 4.0}
    assert cmp["plans"]["rollout"] == cmp["plans"]["swrb"]
    assert cmp["cheaper"] == "swrb" and cmp["break_even_variance_ratio"] == 1.0


def test_swrb_never_wins_when_replicates_agree():
    # Within-document variance 0: both plans need the same documents with K = 1, SWRB's replicate
    # costs more at any variance ratio.
    same = np.array([[0.1, 0.1], [0.5, 0.5], [0.9, 0.9]])
    reps = _replicates(same, same * 0, ["s"] * 3)
    [m] = plan_study(reps, "R(a)", 0.1).to_json()["models"]
    assert m["variance"]["within"] == 0.0
    assert m["comparison"]["break_even_variance_ratio"] is None
    assert m["comparison"]["cheaper"] == "rollout"


def test_fixed_history_targets():
    # R_minus_F is risk_tv - fixed_risk per replicate (rollout TV, as in the analysis); SWRB
    # runs cannot plan it, rollouts compare with a reason instead of an SWRB plan
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3)
    with pytest.raises(ValueError, match=r"^R_minus_F needs the replicates' rollout TV "
                       r"\(risk_tv\), which this development run predates; run it again with "
                       "this kvdrift$"):
        plan_study(reps, "R_minus_F(a)", 0.1)
    reps["risk_tv"] = reps["risk"]
    reps["fixed_risk"] = np.where(reps["action"] == "a", reps["risk"] - np.tile([0, 1], 6),
                                  0.0)  # R - F = replicate index: within 1/2, between 0
    [m] = plan_study(reps, "R_minus_F(a)", 0.1).to_json()["models"]
    assert m["variance"]["within"] == pytest.approx(0.5) and m["variance"]["between"] == 0.0
    assert m["comparison"] == {"cheaper": "rollout", "assumption": None,
                               "reason": "SWRB does not estimate fixed-history risk F, "
                                         "rollout TV or S99"}
    assert m["notes"] == ["the between-document variance estimate is 0 (floored): the plan keeps "
                          "the minimum of 2 documents per stratum and leans on replicates; more "
                          "development documents would firm it up"]
    [f] = plan_study(reps, "R_tv(a) - F(a)", 0.1).to_json()["models"]
    assert f["variance"] == m["variance"]
    reps["estimator"] = "swrb"
    for target in ("F(a)", "R(a) - F(b)", "R_tv(a)"):
        with pytest.raises(ValueError, match=r"^target '" + re.escape(target) + "' needs "
                           "complete rollouts \\(fixed-history risk F, rollout TV or S99\\), "
                           "which SWRB runs do not measure; plan it from a rollout "
                           "development run$"):
            plan_study(reps, target, 0.1).to_json()
    assert plan_study(reps, "R(a)", 0.1).to_json()["models"][0]["estimator"] == "swrb"


def test_models_in_record_order_with_their_own_strata_counts():
    # two strata of 3 documents: "current" is 3 documents per stratum
    strata = ["x", "x", "x", "y", "y", "y"]
    a = np.vstack([PAIRED_A, PAIRED_A + 0.5])
    b = np.vstack([PAIRED_B, PAIRED_B])
    zeta = _replicates(a, b, strata).assign(model="zeta")
    alpha = _replicates(a * 0.5, b, strata).assign(model="alpha")
    models = plan_study(pd.concat([zeta, alpha]), "R(a)", 0.1).to_json()["models"]
    assert [m["model"] for m in models] == ["zeta", "alpha"]
    v = models[0]["variance"]
    assert (v["strata"], v["documents"]) == (2, 6)
    assert models[0]["current"]["documents_per_stratum"] == 3.0
    vc = VarianceComponents(v["between"], v["within"], 2, 6, 2)
    assert models[0]["current"]["halfwidth"] == pytest.approx(halfwidth(vc, 3, 2, Z))


def test_the_search_limit_is_noted():
    # between 0, within 1/2, replicates free: n = ceil(c / K) with c = z^2 (1/2) / h^2 set to
    # 4096 * 100 - 1, so n falls to 100 only at K = 4096, the limit
    a = np.array([[0, 1], [1, 0], [0, 1]])
    reps = _replicates(a, a * 0, ["s"] * 3, setup=(1.0, 0.0), per_rep=(0.0, 0.0))
    h = math.sqrt(Z * Z * 0.5 / (4096 * 100 - 1))
    [m] = plan_study(reps, "R(a)", h).to_json()["models"]
    assert m["recommended"]["documents_per_stratum"] == 100
    assert m["recommended"]["replicates"] == 4096
    assert m["notes"][1:] == ["K reached the search limit 4096"]


HALFWIDTH_RULE = ("the target half-width must be a finite number >= 1e-06 (kvdrift's limit; "
                  "0.01 = 1 percentage point)")


@pytest.mark.parametrize("kwargs, message", [
    (dict(alpha=0.0), "alpha must be within (0, 1); got 0.0"),
    (dict(alpha=1.0), "alpha must be within (0, 1); got 1.0"),
    (dict(halfwidth_target=0.0), f"{HALFWIDTH_RULE}; got 0.0"),
    (dict(halfwidth_target=1e-300), f"{HALFWIDTH_RULE}; got 1e-300"),  # its square is 0
])
def test_bad_plan_settings_are_named(kwargs, message):
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        plan_study(reps, **{"target": "R(a)", "halfwidth_target": 0.1, **kwargs})


def test_refusals_say_what_the_development_run_lacks():
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3)
    with pytest.raises(ValueError, match="^" + re.escape(
            "the development run has no wall-time records (it predates them); run it again "
            "with this kvdrift to measure the cost per replicate") + "$"):
        plan_study(reps.drop(columns=["replicate_seconds"]), "R(a)", 0.1).to_json()
    with pytest.raises(ValueError, match=re.escape(
            "the records mix horizon values ['4', '8']; analyse runs with one each")):
        plan_study(reps.assign(horizon=np.where(reps["action"] == "a", 4, 8)), "R(a)", 0.1)
    with pytest.raises(ValueError, match="^" + re.escape(
            "planning needs at least 2 replicates per document in the development run "
            "(within-document variance)") + "$"):
        variance_components(np.zeros((3, 1)), np.array(["s"] * 3))
    with pytest.raises(ValueError, match="^" + re.escape(
            "planning needs a stratum with at least 2 documents in the development run "
            "(between-document variance)") + "$"):
        variance_components(np.zeros((2, 2)), np.array(["s", "t"]))
    with pytest.raises(ValueError, match="^" + re.escape(
            "a plan target's statistic (a document-level mean) must be one of p_diverge, R, "
            "R_tv, O, E, Pi, F, R_minus_F, S99; got 'B'") + "$"):
        plan_study(reps, "R(a) - B(b)", 0.1).to_json()
    with pytest.raises(ValueError, match="^" + re.escape(
            "action in target 'R(z)' must be one of the actions of the development run: a, b; "
            "got 'z'") + "$"):
        plan_study(reps, "R(z)", 0.1).to_json()


def test_recommend_edges_by_hand():
    # z = 1, between 0, within 1, one stratum, half-width 1/2: n = ceil(4 / K)
    v = VarianceComponents(0.0, 1.0, 1, 4, 2)
    # free documents, 1 s a replicate: cost n K = 4 for K = 1, 2, 4 -> the tie goes to K = 1,
    # and n = 4 exactly (4.0 / 1 is not rounded up to 5)
    d = recommend(v, 0.5, setup_seconds=0.0, replicate_seconds=1.0, z=1.0)
    assert (d.documents_per_stratum, d.replicates, d.seconds) == (4, 1, 4.0)
    # costly documents: as many replicates as allowed, down to the 2 documents minimum
    d = recommend(v, 0.5, setup_seconds=100.0, replicate_seconds=1.0, z=1.0, max_replicates=3)
    assert (d.documents_per_stratum, d.replicates, d.seconds) == (2, 2, 204.0)
    d = recommend(VarianceComponents(0.0, 10.0, 1, 4, 2), 0.5, 100.0, 1.0, 1.0, max_replicates=3)
    assert (d.documents_per_stratum, d.replicates) == (14, 3)  # ceil(40 / 3) = 14
    with pytest.raises(ValueError, match="^" + re.escape(f"{HALFWIDTH_RULE}; got 0") + "$"):
        recommend(v, 0, 1.0, 1.0, 1.0)


def test_swrb_evaluations_count_a_mismatch_at_the_first_step():
    assert swrb_evaluations(4, np.array([1, 0])) == 7.0  # 4 + (4 - 1)


# --- S99 from step records; several endpoints -------------------------------------------------


def _steps(deltas: dict[str, np.ndarray]) -> pd.DataFrame:
    """Step records from ``{action: [n_docs, K, H] deltas}``."""
    rows = []
    for action, cube in deltas.items():
        for i, doc in enumerate(cube):
            for k, rep in enumerate(doc):
                for t, d in enumerate(rep):
                    rows.append(dict(model="m", action=action, doc_id=f"d{i}", replicate=k,
                                     t=t + 1, delta=d))
    return pd.DataFrame(rows)


def test_s99_is_planned_from_per_replicate_saturation_fractions():
    # H = 4: S99 per replicate is the fraction of positions with delta > 0.99 (0.99 itself
    # is not saturated); fractions [0, 1/4], [1/2, 1/2], [1, 0]: the hand example's shape.
    sat = np.array([[0, 0.25], [0.5, 0.5], [1.0, 0.0]])
    deltas = np.zeros((3, 2, 4))
    for i, j in np.ndindex(3, 2):
        deltas[i, j, :round(4 * sat[i, j])] = 1.0
        deltas[i, j, round(4 * sat[i, j]):] = 0.99
    reps = _replicates(np.zeros((3, 2)), np.zeros((3, 2)), ["s"] * 3)
    steps = _steps({"a": deltas, "b": np.zeros((3, 2, 4))})
    assert with_saturation(reps, steps).query("action == 'a'")["saturation"].tolist() == \
        sat.flatten().tolist()
    [m] = plan_study(reps, "S99(a)", 0.1, steps=steps).to_json()["models"]
    v = variance_components(sat, np.array(["s"] * 3))
    assert m["variance"]["within"] == pytest.approx(v.within)
    assert m["variance"]["between"] == pytest.approx(v.between)
    rec = recommend(v, 0.1, 2.0, 0.5, Z)
    assert (m["recommended"]["documents_per_stratum"], m["recommended"]["replicates"]) == (
        rec.documents_per_stratum, rec.replicates)
    assert m["comparison"]["reason"] == ("SWRB does not estimate fixed-history risk F, "
                                         "rollout TV or S99")
    # a paired contrast of saturations, and the refusals
    [d] = plan_study(reps, "S99(a) - S99(b)", 0.1, steps=steps).to_json()["models"]
    assert d["variance"] == m["variance"]
    with pytest.raises(ValueError, match=r"S99 is computed from the step records"):
        plan_study(reps, "S99(a)", 0.1)
    with pytest.raises(ValueError, match=r"needs complete rollouts"):
        plan_study(reps.assign(estimator="swrb"), "S99(a)", 0.1, steps=steps)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_endpoints_adjust_z_by_bonferroni(k):
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3, setup=(2.0, 1.0), per_rep=(0.5, 0.5))
    out = plan_study(reps, "R(a) - R(b)", 0.1, endpoints=k)
    z = NormalDist().inv_cdf(1 - 0.05 / (2 * k))
    assert out.z == pytest.approx(z) and out.level == pytest.approx(1 - 0.05 / k)
    assert out.to_json()["endpoints"] == k
    v = VarianceComponents(1 / 6, 1 / 6, 1, 3, 2)
    rec = recommend(v, 0.1, 3.0, 1.0, z)
    assert out.models[0].recommended.documents_per_stratum == rec.documents_per_stratum
    assert out.models[0].recommended.halfwidth == pytest.approx(rec.halfwidth)
    if k > 1:  # more endpoints, wider z: more documents for the same half-width
        one = plan_study(reps, "R(a) - R(b)", 0.1)
        assert out.models[0].recommended.seconds > one.models[0].recommended.seconds


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_endpoint_counts_are_named(k):
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3)
    with pytest.raises(ValueError, match=r"^endpoints must be an integer >= 1"):
        plan_study(reps, "R(a)", 0.1, endpoints=k)


def test_an_action_named_like_a_statistic_is_not_read_as_one():
    # R(a) - R(F) under SWRB: F is the action's name here, not fixed-history risk.
    reps = _replicates(PAIRED_A, PAIRED_B, ["s"] * 3).assign(estimator="swrb")
    reps["action"] = reps["action"].replace({"b": "F"})
    [m] = plan_study(reps, "R(a) - R(F)", 0.1).to_json()["models"]
    assert m["estimator"] == "swrb" and m["comparison"]["assumption"] is not None
