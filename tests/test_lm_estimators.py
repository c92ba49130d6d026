"""The estimators on the language-model kernel pair (tiny random Llama, in memory)."""

import math

import pytest
import torch

from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.lm.engine.pair import LMKernelPair


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(3, 128, (1, 48), generator=torch.Generator().manual_seed(0))


def test_full_control_is_exactly_zero(tiny_llama, prompt):
    pair = LMKernelPair(tiny_llama, prompt, "full")
    r = coupled_rollouts(pair, 6, 8, seed=1)
    assert torch.all(r.delta == 0) and torch.all(r.f == 0) and not r.mismatch.any()
    s = swrb(pair, 6, 8, seed=1)
    assert torch.all(s.M == 0) and torch.all(s.z_R == 0)


def test_first_position_precedes_eviction_and_runs_repeat(tiny_llama, prompt):
    pair = LMKernelPair(tiny_llama, prompt, "snapkv-half")
    a = coupled_rollouts(pair, 5, 6, seed=3)
    assert torch.all(a.delta[:, 0] == 0) and not a.mismatch[:, 0].any()
    assert a.delta[:, 1:].max() > 0
    b = coupled_rollouts(pair, 5, 6, seed=3)
    for name in ("x", "y", "mismatch", "delta", "f", "tau"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    c = coupled_rollouts(pair, 5, 6, seed=4)
    assert not torch.equal(a.x, c.x)
    s1, s2 = swrb(pair, 5, 6, seed=3), swrb(pair, 5, 6, seed=3)
    assert torch.equal(s1.z_R, s2.z_R) and torch.equal(s1.J, s2.J)
    assert torch.all(s1.J != 1)  # w_1 = 0: the first position cannot diverge


def test_swrb_and_rollouts_agree_on_a_language_model(tiny_llama, prompt):
    # Both estimators are unbiased for the same R; SWRB's branches go through the LM pair's
    # truncate/select path. A two-sample z-test at |z| < 4.5 (false alarm ~7e-6, fixed seeds).
    pair = LMKernelPair(tiny_llama, prompt, "recent-half")
    H, K = 5, 600
    naive = coupled_rollouts(pair, K, H, seed=11).mismatch.double().mean(dim=1)
    branch = swrb(pair, K, H, depths=(1, H), seed=12)
    torch.testing.assert_close(branch.z_R, branch.z_O + branch.z_Pi, rtol=0, atol=1e-15)
    diff = float(naive.mean() - branch.z_R.mean())
    se = math.sqrt(float(naive.var()) / K + float(branch.z_R.var()) / K)
    assert abs(diff) < 4.5 * se
    assert branch.z_R.var() < naive.var()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forced_path_equals_q_recomputed_along_every_reference_branch(tiny_llama, prompt,
                                                                      temperature):
    """The rollout computes Q along X only for diverged replicates (before divergence it is Q
    along Y); recomputing Q along every recorded X from scratch must give the same f_t."""
    from kvdrift.coupling import absorb_eos, tempered_probs, tv_distance

    pair = LMKernelPair(tiny_llama, prompt, "snapkv:budget=46")  # 2 of 48 entries evicted
    K, H = 12, 10
    r = coupled_rollouts(pair, K, H, temperature=temperature, seed=5)
    assert 0 < int((r.tau > 0).sum()) < K  # some replicates diverge, some do not
    p_state, q_state = pair.start("p", K), pair.start("q", K)
    done = torch.zeros(K, dtype=torch.bool)
    eos = pair.eos_token_id
    for t in range(H):
        p = absorb_eos(tempered_probs(pair.logprobs(p_state), temperature), done, eos)
        q = absorb_eos(tempered_probs(pair.logprobs(q_state), temperature), done, eos)
        assert torch.allclose(r.f[:, t], tv_distance(p, q), atol=1e-5, rtol=0), t
        done = r.x_eos[:, t]
        if t + 1 < H:
            p_state = pair.advance(p_state, r.x[:, t])
            q_state = pair.advance(q_state, r.x[:, t])
    before = torch.arange(1, H + 1)[None, :] <= torch.where(r.tau > 0, r.tau, H)[:, None]
    assert torch.equal(r.f[before], r.delta[before])  # not diverged yet: f_t is delta_t exactly
