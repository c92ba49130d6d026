"""Planning a study: variance components, the cheapest design, rollouts against SWRB."""

import math
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
    out = plan_study(reps, "R(a) - R(b)", 0.1)
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
    out = plan_study(reps, "R(a)", 0.005)
    cmp = out["models"][0]["comparison"]
    assert out["models"][0]["variance"]["between"] == 0.0
    assert cmp["break_even_variance_ratio"] == pytest.approx(1.5, rel=0.05)


@pytest.mark.parametrize("target, message", [
    ("R(a) - R(z)", "names action 'z', which the development run did not run"),
    ("B(a)", "'B' is not one"),
    ("R(a", "cannot read endpoint"),
])
def test_bad_targets_are_named(target, message):
    reps = _replicates(np.zeros((3, 2)), np.zeros((3, 2)), ["s"] * 3)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        plan_study(reps, target, 0.01)


def test_runs_without_timing_records_are_refused():
    reps = _replicates(np.zeros((3, 2)), np.zeros((3, 2)), ["s"] * 3).drop(
        columns=["setup_seconds", "replicate_seconds"])
    with pytest.raises(ValueError, match="no wall-time records"):
        plan_study(reps, "R(a)", 0.01)
