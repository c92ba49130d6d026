"""Tests for kvdrift.finite: the finite kernel pair, exact enumeration, random systems and
the extremal construction of docs/method.md section 6."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from kvdrift.coupling import absorb_eos, coupled_draw
from kvdrift.finite import (
    ExactRisk,
    FinitePair,
    exact,
    exact_rho,
    extremal_pair,
    paper_system,
    random_pair,
)
from kvdrift.finite.variance import estimator_laws
from kvdrift.kernel import KernelPair
from tests.messages import whole

TOL = 1e-12


def hand_pair() -> FinitePair:
    """Binary, H = 2; every exact quantity below is worked out by hand in the tests."""
    p_table = {(): [0.5, 0.5], (0,): [1.0, 0.0], (1,): [0.5, 0.5]}
    q_table = {(): [0.8, 0.2], (0,): [0.2, 0.8], (1,): [1.0, 0.0]}
    return FinitePair.from_tables(p_table, q_table, vocab_size=2, horizon=2)


def all_histories(vocab_size: int, horizon: int):
    for length in range(horizon):
        yield from itertools.product(range(vocab_size), repeat=length)


# FinitePair: the KernelPair protocol --------------------------------------------------


def test_finite_pair_implements_protocol() -> None:
    pair = hand_pair()
    assert isinstance(pair, KernelPair)
    assert pair.vocab_size == 2 and pair.horizon == 2 and pair.eos_token_id is None
    assert pair.device == torch.device("cpu")

    xs = pair.start("p", 3)
    lp = pair.logprobs(xs)
    assert lp.shape == (3, 2) and lp.dtype == torch.float64 and lp.device.type == "cpu"
    np.testing.assert_allclose(lp.exp().numpy(), [[0.5, 0.5]] * 3)

    xs = pair.advance(xs, torch.tensor([0, 1, 0]))
    lp = pair.logprobs(xs)
    assert lp[0, 1].item() == -math.inf and lp[0, 0].item() == 0.0
    np.testing.assert_allclose(lp[1].exp().numpy(), [0.5, 0.5])

    sel = pair.select(xs, torch.tensor([1, 1, 0]))
    assert sel.histories == ((1,), (1,), (0,))
    cut = pair.truncate(xs, torch.tensor([0, 1, 0]))
    assert cut.histories == ((), (1,), ())
    ys = pair.advance(pair.start("q", 1), torch.tensor([0]))
    np.testing.assert_allclose(pair.logprobs(ys).exp().numpy(), [[0.2, 0.8]])
    assert pair.logprobs(pair.start("q", 0)).shape == (0, 2)


def test_each_history_evaluated_once() -> None:
    calls: list[tuple] = []

    def p(history):
        calls.append(history)
        return [0.25, 0.75]

    pair = FinitePair(p, lambda h: [0.5, 0.5], vocab_size=2, horizon=3)
    state = pair.start("p", 4)
    for _ in range(3):
        pair.logprobs(state)
    state = pair.advance(state, torch.tensor([0, 1, 0, 1]))
    pair.logprobs(state)
    exact(pair)
    assert sorted(calls) == sorted(set(calls))
    assert len(calls) == len(list(all_histories(2, 3)))


def test_probs_are_renormalised_and_read_only() -> None:
    pair = FinitePair(lambda h: [0.3 + 1e-7, 0.7], lambda h: [0.5, 0.5], 2, 1)
    row = pair.probs("p", ())
    assert abs(row.sum() - 1.0) < 1e-15
    with pytest.raises(ValueError):
        row[0] = 0.0


@pytest.mark.parametrize(
    ("row", "match"),
    [([0.5, 0.6], "sum to 1"), ([1.2, -0.2], "non-negative"), ([0.5, 0.25, 0.25], "entries"),
     ([float("nan"), 1.0], "finite")],
)
def test_bad_probability_rows(row, match) -> None:
    with pytest.raises(ValueError, match=match):
        FinitePair.from_tables({(): row}, {(): [0.5, 0.5]}, vocab_size=2, horizon=1)
    pair = FinitePair(lambda h: [0.5, 0.5], lambda h: row, vocab_size=2, horizon=1)
    with pytest.raises(ValueError, match=match):
        pair.logprobs(pair.start("q", 1))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"vocab_size": 2, "horizon": 0}, "horizon must be an integer >= 1; got 0"),
     ({"vocab_size": 2, "horizon": 1.5}, "horizon"),
     ({"vocab_size": 0, "horizon": 2}, "vocab_size must be an integer >= 1; got 0"),
     ({"vocab_size": 2, "horizon": 2, "eos_token_id": 2},
      r"eos_token_id must be an integer within 0\.\.1; got 2$")],
)
def test_bad_construction(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        FinitePair(lambda h: [0.5, 0.5], lambda h: [0.5, 0.5], **kwargs)


def test_bad_state_operations() -> None:
    pair = hand_pair()
    with pytest.raises(ValueError, match=whole(
            "kernel side (p: reference, q: intervention) must be one of p, q; got 'x'")):
        pair.start("x", 1)  # type: ignore[arg-type]
    state = pair.start("p", 2)
    with pytest.raises(ValueError, match=r"tokens must lie in 0\.\.1"):
        pair.advance(state, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="one entry per row"):
        pair.advance(state, torch.tensor([0]))
    with pytest.raises(ValueError, match="integer"):
        pair.advance(state, torch.tensor([0.0, 1.0]))
    full = pair.advance(pair.advance(state, torch.tensor([0, 1])), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="length 0..1"):
        pair.logprobs(full)
    with pytest.raises(ValueError, match="horizon"):
        pair.advance(full, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="truncate"):
        pair.truncate(state, torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="rows must lie"):
        pair.select(state, torch.tensor([2]))
    with pytest.raises(ValueError, match="no row for history"):
        FinitePair.from_tables({(): [1.0, 0.0]}, {(): [0.0, 1.0]}, 2, 2).probs("p", (1,))


# Exact enumeration: hand values ---------------------------------------------------------


def test_exact_horizon_one_is_tv() -> None:
    pair = FinitePair(lambda h: [0.1, 0.6, 0.3], lambda h: [0.4, 0.4, 0.2], 3, 1)
    ex = exact(pair)
    assert abs(ex.R - 0.3) < TOL and abs(ex.O - 0.3) < TOL and abs(ex.F - 0.3) < TOL
    assert ex.Pi == 0.0 and ex.E == 0.0 and ex.C == 0.0
    np.testing.assert_allclose(ex.p_tau, [0.3], atol=TOL)


def test_exact_hand_enumeration() -> None:
    # t=1: p=(.5,.5), q=(.8,.2), e=.3; joint (0,0)=.5, (1,1)=.2, (1,0)=.3.
    # t=2: delta on (0,0)=TV((1,0),(.2,.8))=.8, on (1,1)=TV((.5,.5),(1,0))=.5,
    #      on (x=1,y=0)=TV((.5,.5),(.2,.8))=.3  ->  E[delta_2] = .4 + .1 + .09 = .59.
    ex = exact(hand_pair())
    np.testing.assert_allclose(ex.expected_delta, [0.3, 0.59], atol=TOL)
    assert abs(ex.R - 0.445) < TOL
    np.testing.assert_allclose(ex.p_tau, [0.3, 0.5], atol=TOL)  # p_2 = .5*.8 + .2*.5
    assert abs(ex.O - 0.4) < TOL
    assert abs(ex.Pi - 0.045) < TOL  # P(tau=1, I_2=1) = .3*.3
    assert abs(ex.E - 0.15) < TOL and abs(ex.C - 0.3) < TOL
    # fixed history along X: X_1 = 0 -> TV((1,0),(.2,.8)) = .8; X_1 = 1 -> .5
    np.testing.assert_allclose(ex.expected_fixed, [0.3, 0.65], atol=TOL)
    assert abs(ex.F - 0.475) < TOL
    np.testing.assert_allclose(ex.tau_mismatch, [[0.3, 0.09], [0.5, 0.0]], atol=TOL)
    rho = ex.rho
    np.testing.assert_allclose(rho[0], [1.0, 0.3], atol=TOL)
    assert rho[1, 0] == 1.0 and math.isnan(rho[1, 1])
    assert abs(ex.R_L(1) - 0.4) < TOL and abs(ex.R_L(2) - 0.445) < TOL
    assert abs(ex.B_L(1) - 0.15) < TOL and ex.B_L(2) == 0.0
    np.testing.assert_allclose(exact_rho(hand_pair())[0], rho[0])


def test_exact_result_is_frozen() -> None:
    ex = exact(hand_pair())
    assert isinstance(ex, ExactRisk)
    with pytest.raises(AttributeError):
        ex.R = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        ex.p_tau[0] = 0.0


@pytest.mark.parametrize("L", [0, 3, -1, 1.0, True])
def test_bad_depth(L) -> None:
    ex = exact(hand_pair())
    with pytest.raises(ValueError, match=r"depth L must be an integer within 1\.\.H = 1\.\.2"):
        ex.R_L(L)
    with pytest.raises(ValueError, match="depth L must be an integer"):
        ex.B_L(L)


def test_exact_needs_finite_pair() -> None:
    with pytest.raises(TypeError, match="FinitePair"):
        exact(object())  # type: ignore[arg-type]


# Exact enumeration: identities on random systems ----------------------------------------


SYSTEMS = [
    pytest.param(lambda: random_pair(2, 6, 0), id="V2H6"),
    pytest.param(lambda: random_pair(3, 4, 1, mix=0.8, concentration=0.3), id="V3H4-sparse"),
    pytest.param(lambda: random_pair(3, 4, 2, eos_token_id=2), id="V3H4-eos"),
    pytest.param(lambda: random_pair(4, 3, 3, mix=1.0, eos_token_id=0), id="V4H3-eos"),
    pytest.param(lambda: paper_system(7), id="paper7"),
    pytest.param(lambda: paper_system(24, H=5, seed=3), id="paper24H5"),
]


@pytest.mark.parametrize("make", SYSTEMS)
def test_exact_identities(make) -> None:
    pair = make()
    ex = exact(pair)
    H = pair.horizon
    # R = O + Pi and R = mean E[delta_t] hold by construction in exact(); the check is
    # against an independent enumeration of the law of D_H (pairs without EOS).
    if pair.eos_token_id is None:
        assert abs(ex.R - estimator_laws(pair).naive.mean) < TOL
    assert abs(ex.R_L(1) - ex.O) < TOL
    assert abs(ex.R_L(H) - ex.R) < TOL
    assert ex.B_L(H) == 0.0
    assert abs(ex.B_L(1) - ex.E) < TOL  # (H - s)_+ when L = 1
    assert ex.p_tau.sum() <= 1 + TOL and (ex.p_tau >= 0).all()
    # the generation clock (docs/method.md section 8): E[delta_t] = p_t + sum_{s<t} P(tau=s, I_t=1)
    for t in range(1, H + 1):
        clock = sum(ex.tau_mismatch[s - 1, t - s] for s in range(1, t + 1))
        assert abs(ex.expected_delta[t - 1] - clock) < TOL
    # R_L grows with L, B_L shrinks, and R always lies in the sharp interval
    for L in range(1, H + 1):
        assert ex.R_L(L) - TOL <= ex.R <= ex.R_L(L) + ex.B_L(L) + TOL
    rho = ex.rho
    for s in range(1, H + 1):
        if ex.p_tau[s - 1] > 0:
            assert abs(rho[s - 1, 0] - 1) < 1e-9
            assert np.all((rho[s - 1, : H - s + 1] >= -TOL) & (rho[s - 1, : H - s + 1] <= 1 + TOL))
            assert np.isnan(rho[s - 1, H - s + 1:]).all()
    assert 0 <= ex.F <= 1 and 0 <= ex.C <= 1 + TOL


def test_identical_kernels_have_zero_risk() -> None:
    ex = exact(random_pair(3, 4, 5, mix=0.0))
    assert ex.R == 0.0 and ex.F == 0.0 and ex.p_tau.sum() == 0.0 and ex.C == 0.0


def test_enumeration_is_fast_enough() -> None:
    ex = exact(random_pair(2, 8, 11))
    assert 0 < ex.R < 1  # sanity only: this test is about the enumeration's speed


# EOS absorption -----------------------------------------------------------------------


def test_eos_both_absorbed_stops_mismatch() -> None:
    # t=1: both kernels (.5, 0, .5): shared draw; both absorb at EOS=2 with prob .5.
    # The raw rows after EOS disagree completely but must be ignored.
    p_table = {(): [0.5, 0.0, 0.5], (0,): [1.0, 0.0, 0.0], (2,): [1.0, 0.0, 0.0],
               (0, 0): [0.0, 0.0, 1.0]}
    q_table = {(): [0.5, 0.0, 0.5], (0,): [0.0, 1.0, 0.0], (2,): [0.0, 1.0, 0.0],
               (0, 0): [0.0, 0.0, 1.0], (0, 1): [0.0, 0.0, 1.0]}
    pair = FinitePair.from_tables(p_table, q_table, 3, 3, eos_token_id=2)
    ex = exact(pair)
    np.testing.assert_allclose(ex.expected_delta, [0.0, 0.5, 0.0], atol=TOL)
    np.testing.assert_allclose(ex.p_tau, [0.0, 0.5, 0.0], atol=TOL)
    np.testing.assert_allclose(ex.expected_fixed, [0.0, 0.5, 0.0], atol=TOL)
    assert abs(ex.R - 0.5 / 3) < TOL and ex.Pi == 0.0
    # an absorbed history left out of the tables is a point mass on EOS
    np.testing.assert_array_equal(pair.probs("p", (2, 2)), [0.0, 0.0, 1.0])


def test_eos_one_branch_absorbed() -> None:
    # t=1: P emits EOS, Q emits 0 (e = 1). t=2: X stuck at EOS, Q(.|0) = (.3,.3,.4):
    # delta_2 = .6; both at EOS w.p. .4, else Y = 0 or 1 (.3 each) while X stays EOS.
    # t=3: Q(.|0,0) = (.5,0,.5) -> .5, Q(.|0,1) = (0,1,0) -> 1, Y absorbed -> 0.
    p_table = {(): [0.0, 0.0, 1.0]}
    q_table = {(): [1.0, 0.0, 0.0], (0,): [0.3, 0.3, 0.4], (0, 0): [0.5, 0.0, 0.5],
               (0, 1): [0.0, 1.0, 0.0]}
    ex = exact(FinitePair.from_tables(p_table, q_table, 3, 3, eos_token_id=2))
    np.testing.assert_allclose(ex.expected_delta, [1.0, 0.6, 0.45], atol=TOL)
    np.testing.assert_allclose(ex.tau_mismatch[0], [1.0, 0.6, 0.45], atol=TOL)
    assert abs(ex.R - 2.05 / 3) < TOL and abs(ex.Pi - 1.05 / 3) < TOL
    np.testing.assert_allclose(ex.expected_fixed, [1.0, 0.0, 0.0], atol=TOL)  # X absorbed


def test_random_pair_with_eos_absorbs() -> None:
    pair = random_pair(3, 4, 0, eos_token_id=1)
    for history in all_histories(3, 4):
        if 1 in history:
            np.testing.assert_array_equal(pair.probs("q", history), [0.0, 1.0, 0.0])
    assert exact(pair).p_tau.sum() > 0


# Random systems ------------------------------------------------------------------------


def test_random_pair_determinism_and_validation() -> None:
    a, b = random_pair(3, 3, 4), random_pair(3, 3, np.random.default_rng(4))
    for h in all_histories(3, 3):
        np.testing.assert_array_equal(a.probs("p", h), b.probs("p", h))
        np.testing.assert_array_equal(a.probs("q", h), b.probs("q", h))
    with pytest.raises(ValueError, match="mix"):
        random_pair(2, 2, 0, mix=1.5)
    with pytest.raises(ValueError, match="concentration"):
        random_pair(2, 2, 0, concentration=0.0)


def test_paper_system_determinism() -> None:
    def tables(pair):
        return [(pair.probs("p", h), pair.probs("q", h)) for h in all_histories(2, pair.horizon)]

    one, two = tables(paper_system(5, seed=1)), tables(paper_system(5, seed=1))
    assert len(one) == 7  # binary prefixes of length 0, 1, 2
    for (p1, q1), (p2, q2) in zip(one, two, strict=True):
        np.testing.assert_array_equal(p1, p2)
        np.testing.assert_array_equal(q1, q2)
    assert not np.array_equal(one[0][0], tables(paper_system(6, seed=1))[0][0])
    assert not np.array_equal(one[0][0], tables(paper_system(5, seed=2))[0][0])
    assert paper_system(5, H=4).horizon == 4


@pytest.mark.parametrize("c", [1, 12, 24])
def test_paper_system_lambda(c) -> None:
    for seed in range(5):
        pair = paper_system(c, seed=seed)
        info = pair.info
        cap = 0.05 + 0.45 * c / 24
        assert 0.5 <= info["u"] <= 1 and 0 <= info["v"] <= 1
        assert abs(info["lambda"] - cap * info["u"] * info["v"]) < TOL
        assert 0 <= info["lambda"] <= cap
        lam = info["lambda"]
        for h in all_histories(2, 3):
            p, q = pair.probs("p", h), pair.probs("q", h)
            assert (p > 0).all()  # Gamma + 0.05 weights are positive
            assert np.abs(q - p).max() <= lam + TOL  # Q = (1 - lambda) P + lambda A
            a = p + (q - p) / lam
            assert (a > 0).all() and abs(a.sum() - 1) < 1e-9


@pytest.mark.parametrize("c", [0, 25, -1])
def test_paper_system_bad_c(c) -> None:
    with pytest.raises(ValueError, match=r"c must be an integer within 1\.\.24"):
        paper_system(c)


# Monte-Carlo cross-check of the enumeration against coupling.coupled_draw ----------------


def sample_mismatches(pair: FinitePair, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` coupled rollouts with coupled_draw; returns I ``[n, H]`` and delta ``[n, H]``."""
    gen = torch.Generator().manual_seed(seed)
    eos = pair.eos_token_id
    xs, ys = pair.start("p", n), pair.start("q", n)
    x_done = torch.zeros(n, dtype=torch.bool)
    y_done = torch.zeros(n, dtype=torch.bool)
    mism, delta = [], []
    for _ in range(pair.horizon):
        p = absorb_eos(pair.logprobs(xs).exp(), x_done, eos)
        q = absorb_eos(pair.logprobs(ys).exp(), y_done, eos)
        draw = coupled_draw(p, q, gen)
        mism.append((draw.x != draw.y).numpy())
        delta.append(draw.tv.numpy())
        xs, ys = pair.advance(xs, draw.x), pair.advance(ys, draw.y)
        if eos is not None:
            x_done |= draw.x == eos
            y_done |= draw.y == eos
    return np.stack(mism, axis=1).astype(float), np.stack(delta, axis=1)


def z_score(samples: np.ndarray, truth: float) -> float:
    sd = samples.std(ddof=1)
    if sd < 1e-9:  # (numerically) constant, e.g. delta_1: compare directly
        return 0.0 if abs(samples.mean() - truth) < 1e-9 else math.inf
    return float((samples.mean() - truth) / (sd / math.sqrt(samples.size)))


@pytest.mark.parametrize(
    ("make", "seed"),
    [pytest.param(lambda: random_pair(3, 4, 21, mix=0.7, concentration=0.5, eos_token_id=2),
                  0, id="V3H4-eos"),
     pytest.param(lambda: random_pair(2, 5, 22, mix=0.6), 1, id="V2H5"),
     pytest.param(lambda: paper_system(24), 2, id="paper24")],
)
def test_monte_carlo_matches_exact(make, seed) -> None:
    # Each check is a two-sided z-test at |z| < 4.5 (false alarm 6.8e-6 per check); with
    # 3 + 2H checks per system and three systems the family false-alarm rate is < 3e-4.
    # The seeds are fixed, so the outcome is deterministic.
    pair = make()
    ex = exact(pair)
    H = pair.horizon
    mism, delta = sample_mismatches(pair, n=20_000, seed=seed)
    diverged = mism.any(axis=1)
    tau = np.where(diverged, mism.argmax(axis=1) + 1, H + 1)
    after = mism * (np.arange(1, H + 1)[None, :] > tau[:, None])
    assert abs(z_score(mism.mean(axis=1), ex.R)) < 4.5
    assert abs(z_score(diverged / H, ex.O)) < 4.5
    assert abs(z_score(after.sum(axis=1) / H, ex.Pi)) < 4.5
    for t in range(H):
        assert abs(z_score(delta[:, t], ex.expected_delta[t])) < 4.5
        assert abs(z_score((tau == t + 1).astype(float), ex.p_tau[t])) < 4.5


# Extremal construction (docs/method.md section 6) -------------------------------------------------


def random_inputs(rng: np.random.Generator, H: int):
    p_tau = rng.dirichlet(np.ones(H + 1))[:H]  # last part: never diverged
    rho = rng.uniform(size=(H, H))
    rho[:, 0] = 1.0
    return p_tau, rho


def sharp_bounds(p_tau: np.ndarray, rho: np.ndarray, L: int) -> tuple[float, float]:
    """R_L and B_L straight from docs/method.md's formulas on (p, rho)."""
    H = p_tau.size
    r_l = sum(p_tau[s - 1] * rho[s - 1, : min(L, H - s + 1)].sum() for s in range(1, H + 1))
    b_l = sum(p_tau[s - 1] * max(H - s - L + 1, 0) for s in range(1, H + 1))
    return r_l / H, b_l / H


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
@pytest.mark.parametrize(("H", "L", "seed"), [(3, 1, 0), (4, 2, 1), (5, 3, 2), (5, 5, 3),
                                              (6, 2, 4)])
def test_extremal_attains_interval(alpha, H, L, seed) -> None:
    p_tau, rho = random_inputs(np.random.default_rng(seed), H)
    pair = extremal_pair(p_tau, rho, L, alpha)
    ex = exact(pair)
    r_l, b_l = sharp_bounds(p_tau, rho, L)
    assert abs(ex.R - (r_l + alpha * b_l)) < TOL
    assert abs(ex.R_L(L) - r_l) < TOL and abs(ex.B_L(L) - b_l) < TOL
    np.testing.assert_allclose(ex.p_tau, p_tau, atol=TOL)
    got = ex.rho
    for s in range(1, H + 1):
        depth = min(L, H - s + 1)
        np.testing.assert_allclose(got[s - 1, :depth], rho[s - 1, :depth], atol=1e-10)
        np.testing.assert_allclose(got[s - 1, depth: H - s + 1], alpha, atol=1e-10)
    # X stays at 0, so the fixed-history TV is Q_t(1 | 0...0) = eta_t = p_t / Sbar_t
    survive = 1 - np.concatenate([[0.0], np.cumsum(p_tau)[:-1]])
    np.testing.assert_allclose(ex.expected_fixed, p_tau / survive, atol=1e-10)


def test_extremal_with_zero_and_full_mass() -> None:
    # p_1 = 0 (its rho row may be nan), sum p = 1 so Sbar reaches 0 at the end.
    p_tau = np.array([0.0, 0.5, 0.5])
    rho = np.array([[np.nan, np.nan, np.nan], [1.0, 0.25, np.nan], [1.0, np.nan, np.nan]])
    for alpha in (0.0, 1.0):
        ex = exact(extremal_pair(p_tau, rho, 2, alpha))
        np.testing.assert_allclose(ex.p_tau, p_tau, atol=TOL)
        assert abs(ex.R - ex.R_L(2) - alpha * ex.B_L(2)) < TOL
        assert abs(ex.R_L(2) - (0.5 * 1.25 + 0.5) / 3) < TOL


def test_extremal_round_trip_brackets_truth() -> None:
    # Any system's (p, rho) fed to the construction gives the same R_L, B_L; the truth
    # lies between the alpha = 0 and alpha = 1 extremes.
    for seed in range(3):
        truth = exact(random_pair(3, 4, seed, eos_token_id=2 if seed else None))
        for L in (1, 2, 4):
            lo = exact(extremal_pair(truth.p_tau, truth.rho, L, 0.0))
            hi = exact(extremal_pair(truth.p_tau, truth.rho, L, 1.0))
            assert abs(lo.R - truth.R_L(L)) < 1e-10
            assert abs(hi.R - truth.R_L(L) - truth.B_L(L)) < 1e-10
            assert lo.R - 1e-10 <= truth.R <= hi.R + 1e-10


@pytest.mark.parametrize(
    ("p_tau", "rho", "L", "alpha", "match"),
    [([0.5, -0.1], [[1, 0], [1, 0]], 1, 0.5, "p_tau must be finite, non-negative"),
     ([0.7, 0.6], [[1, 0], [1, 0]], 1, 0.5, "sum to at most 1"),
     ([0.5, 0.2], [[1, 0], [1, 0]], 3, 0.5, r"depth L must be an integer within 1\.\.H = 1\.\.2"),
     ([0.5, 0.2], [[1, 0], [1, 0]], 0, 0.5, "depth L must be an integer"),
     ([0.5, 0.2], [[1, 0], [1, 0]], 1, 1.5,
      r"alpha \(post-window mismatch rate\) must be a number within \[0, 1\]; got 1.5$"),
     ([0.5, 0.2], [[1, 1.5], [1, 0]], 2, 0.5, r"rho entries must lie in \[0, 1\]"),
     ([0.5, 0.2], [[0.9, 0.5], [1, 0]], 2, 0.5, "must be 1"),
     ([0.5, 0.2], [[1, np.nan], [1, 0]], 2, 0.5, "must not be nan"),
     ([0.5, 0.2], [[1], [1]], 2, 0.5, "shape"),
     ([], [[1]], 1, 0.5, "non-empty")],
)
def test_extremal_bad_inputs(p_tau, rho, L, alpha, match) -> None:
    with pytest.raises(ValueError, match=match):
        extremal_pair(p_tau, rho, L, alpha)
