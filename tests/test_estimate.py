"""Both estimators against exact enumeration on random finite systems.

Each z-test below rejects a correct estimator with probability about 7e-6
(|z| > 4.5 under the normal approximation); seeds are fixed, so outcomes are deterministic.
"""

import numpy as np
import pytest
import torch

from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.finite import exact, random_pair
from kvdrift.records.terms import trajectory_terms, window_terms

Z = 4.5
K = 3000

SYSTEMS = [
    dict(vocab_size=2, horizon=4, seed=11, mix=0.3),
    dict(vocab_size=3, horizon=4, seed=12, mix=0.6, concentration=0.5),
    dict(vocab_size=3, horizon=5, seed=13, mix=0.4, eos_token_id=2),
]


def assert_unbiased(samples, truth, what):
    samples = np.asarray(samples, dtype=float)
    se = samples.std(ddof=1) / np.sqrt(samples.size)
    # 1e-12 absorbs float rounding where a quantity is (nearly) constant across replicates.
    assert abs(samples.mean() - truth) < Z * se + 1e-12, f"{what}: {samples.mean()} vs {truth}"


@pytest.fixture(scope="module", params=range(len(SYSTEMS)), ids=lambda i: f"system{i}")
def system(request):
    spec = SYSTEMS[request.param]
    options = {k: v for k, v in spec.items() if k not in ("vocab_size", "horizon", "seed")}
    pair = random_pair(spec["vocab_size"], spec["horizon"], spec["seed"], **options)
    H = spec["horizon"]
    naive = coupled_rollouts(pair, K, H, seed=1)
    branch = swrb(pair, K, H, depths=range(1, H + 1), seed=2)
    return pair, exact(pair), naive, branch


def test_rollouts_are_unbiased(system):
    pair, truth, naive, _ = system
    terms = trajectory_terms(naive.mismatch.numpy())
    assert_unbiased(terms.mismatch_fraction, truth.R, "R")
    assert_unbiased(terms.occurrence, truth.O, "O")
    assert_unbiased(terms.exposure, truth.E, "E")
    assert_unbiased(terms.occupation, truth.Pi, "Pi")
    assert_unbiased(naive.f.mean(dim=1).numpy(), truth.F, "F")
    for t in range(naive.horizon):
        assert_unbiased(naive.delta[:, t].numpy(), truth.expected_delta[t], f"delta_{t + 1}")
        assert_unbiased(naive.mismatch[:, t].double().numpy(), truth.expected_delta[t],
                        f"I_{t + 1}")
    for s in range(1, naive.horizon + 1):
        assert_unbiased((naive.tau == s).double().numpy(), truth.p_tau[s - 1], f"p_{s}")
    for L in (1, 2, naive.horizon):
        w = window_terms(naive.mismatch.numpy(), L)
        assert_unbiased(w.observed, truth.R_L(L), f"R_{L}")
        assert_unbiased(w.capacity, truth.B_L(L), f"B_{L}")


def test_swrb_is_unbiased_and_consistent(system):
    pair, truth, _, branch = system
    assert_unbiased(branch.z_R.numpy(), truth.R, "Z^R")
    assert_unbiased(branch.z_O.numpy(), truth.O, "Z^O")
    assert_unbiased(branch.z_Pi.numpy(), truth.Pi, "Z^Pi")
    torch.testing.assert_close(branch.z_R, branch.z_O + branch.z_Pi, rtol=0, atol=1e-15)
    for i, L in enumerate(branch.depths):
        assert_unbiased(branch.z_L[:, i].numpy(), truth.R_L(L), f"Z_{L}")
        assert_unbiased(branch.w_L[:, i].numpy(), truth.B_L(L), f"W_{L}")
        assert_unbiased(branch.z_tail[:, i].numpy(), truth.R - truth.R_L(L), f"tail_{L}")
    H = branch.horizon
    torch.testing.assert_close(branch.z_L[:, -1], branch.z_R, rtol=0, atol=1e-15)  # L = H
    torch.testing.assert_close(branch.z_L[:, 0], branch.z_O, rtol=0, atol=1e-15)  # L = 1
    assert torch.all(branch.w_L[:, -1] == 0)
    diverged = branch.J > 0
    rows = torch.nonzero(diverged).squeeze(-1)
    # The residual pair at J always differs, and nothing is recorded before J.
    assert torch.all(branch.mismatch[rows, branch.J[rows] - 1])
    before = torch.arange(H)[None, :] < (branch.J[:, None] - 1)
    assert not branch.mismatch[before].any()
    assert torch.all((branch.M >= 0) & (branch.M <= 1 + 1e-12))


def test_swrb_variance_never_above_naive(system):
    _, _, naive, branch = system
    var_naive = naive.mismatch.double().mean(dim=1).var()
    var_swrb = branch.z_R.var()
    assert var_swrb < var_naive


def test_identical_kernels_give_zero_everywhere():
    pair = random_pair(3, 4, seed=5, mix=0.0)
    naive = coupled_rollouts(pair, 200, 4, seed=0)
    assert not naive.mismatch.any() and torch.all(naive.delta == 0) and torch.all(naive.f == 0)
    assert torch.all(naive.tau == 0)
    branch = swrb(pair, 200, 4, depths=(1, 4), seed=0)
    assert torch.all(branch.M == 0) and torch.all(branch.z_R == 0) and torch.all(branch.J == 0)
    assert torch.all(branch.evaluations == 4)


def test_same_seed_same_records():
    pair = random_pair(3, 4, seed=6, mix=0.5)
    a, b = coupled_rollouts(pair, 50, 4, seed=9), coupled_rollouts(pair, 50, 4, seed=9)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.delta, b.delta)
    c, d = swrb(pair, 50, 4, seed=9), swrb(pair, 50, 4, seed=9)
    assert torch.equal(c.z_R, d.z_R) and torch.equal(c.J, d.J)


def test_eos_is_absorbing_in_rollouts():
    pair = random_pair(3, 6, seed=14, mix=0.5, eos_token_id=0)
    r = coupled_rollouts(pair, 400, 6, seed=3)
    for flags, tokens in ((r.x_eos, r.x), (r.y_eos, r.y)):
        assert torch.all(flags[:, 1:] >= flags[:, :-1])  # once absorbed, always absorbed
        assert torch.all(tokens[flags] == 0)
        assert flags.any()
    both_before = r.x_eos[:, :-1] & r.y_eos[:, :-1]  # both absorbed before position t
    assert both_before.any()
    assert not r.mismatch[:, 1:][both_before].any()
    assert torch.all(r.delta[:, 1:][both_before] == 0) and torch.all(r.f[:, 1:][both_before] == 0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: coupled_rollouts(p, 0, 3), "replicates K must be an integer >= 1"),
        (lambda p: coupled_rollouts(p, 4, 0), "horizon H must be an integer >= 1"),
        (lambda p: swrb(p, -1, 3), "replicates K must be an integer >= 1"),
        (lambda p: swrb(p, 4, 3, depths=(0,)), "depth L must be an integer within 1..H"),
        (lambda p: swrb(p, 4, 3, depths=(4,)), "depth L must be an integer within 1..H"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call(random_pair(2, 3, seed=0))
