"""Exact estimator laws: means equal the exact risk, SWRB never has more variance, and
the Monte Carlo estimators' sample variances and costs agree with the enumerated ones.

Statistical checks: |z| < 4.5 (about 7e-6 each; 6 checks, family below 5e-5); the z of a
sample variance uses the law's fourth central moment. Seeds are fixed.
"""

import numpy as np
import pytest

from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.finite import exact, paper_system, random_pair
from kvdrift.finite.variance import Law, estimator_laws


def test_law_moments_by_hand():
    law = Law.from_dict({0.0: 0.5, 1.0: 0.25, 2.0: 0.25})
    assert (law.mean, law.var) == pytest.approx((0.75, 0.6875))
    assert law.fourth_central == pytest.approx(0.5 * 0.75**4 + 0.25 * 0.25**4 + 0.25 * 1.25**4)


@pytest.mark.parametrize("pair", [paper_system(5, 24, 3, seed=0), paper_system(20, 24, 3, 1),
                                  random_pair(3, 3, seed=4, mix=0.5)], ids=["c5", "c20", "v3"])
def test_means_are_the_exact_risk_and_swrb_variance_is_lower(pair):
    laws = estimator_laws(pair)
    truth = exact(pair)
    assert laws.naive.probs.sum() == pytest.approx(1.0)
    assert laws.swrb.probs.sum() == pytest.approx(1.0)
    assert laws.naive.mean == pytest.approx(truth.R, abs=1e-12)
    assert laws.naive_delta.mean == pytest.approx(truth.R, abs=1e-12)
    assert laws.swrb.mean == pytest.approx(truth.R, abs=1e-12)
    assert 0 < laws.swrb.var < laws.naive.var
    assert laws.horizon <= laws.swrb_evaluations <= 2 * laws.horizon - 1


def test_monte_carlo_variances_and_cost_match_the_laws():
    pair = paper_system(12, 24, 3, seed=2)
    laws = estimator_laws(pair)
    K = 4000
    d_h = coupled_rollouts(pair, K, 3, seed=1).mismatch.double().mean(dim=1).numpy()
    branch = swrb(pair, K, 3, seed=2)
    z = branch.z_R.numpy()
    for sample, law in ((d_h, laws.naive), (z, laws.swrb)):
        assert abs(sample.mean() - law.mean) < 4.5 * np.sqrt(law.var / K)
        assert abs(sample.var(ddof=1) - law.var) < 4.5 * law.sample_var_se(K)
    cost = branch.evaluations.numpy().astype(float)
    assert abs(cost.mean() - laws.swrb_evaluations) < 4.5 * cost.std(ddof=1) / np.sqrt(K)
    ratio = laws.naive.var / laws.swrb.var
    assert ratio > 10  # the variance ratio this system contributes to the finite-state check


def test_eos_is_refused():
    with pytest.raises(ValueError, match="without EOS"):
        estimator_laws(random_pair(3, 3, seed=0, eos_token_id=2))
