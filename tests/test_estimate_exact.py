"""Estimators at temperatures other than 1 against exact enumeration, and SWRB's records.

At temperature T the estimators sample from ``softmax(log p / T)``; the exact truth is the
enumeration of the pair whose tables are those tempered rows. Each z-test rejects a correct
estimator with probability about 7e-6 (|z| > 4.5, normal approximation); this file runs 21
of them, so the family's false-alarm rate is below 1.5e-4. Seeds are fixed.
"""

import numpy as np
import pytest
import torch
from mutation_scope import per_test_under_mutmut

from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.estimate.common import concat_results, make_generator
from kvdrift.finite import FinitePair, exact, random_pair

Z = 4.5
K = 3000
H = 4


def tempered(pair: FinitePair, temperature: float) -> FinitePair:
    """The pair whose rows are ``pair``'s rows at ``temperature`` (0: arg-max point mass)."""

    def row(side):
        def fn(history):
            p = pair.probs(side, history)
            if temperature == 0:
                return np.eye(pair.vocab_size)[int(np.argmax(p))]
            w = np.where(p > 0, p, 0.0) ** (1.0 / temperature)
            return w / w.sum()
        return fn

    return FinitePair(row("p"), row("q"), pair.vocab_size, pair.horizon, pair.eos_token_id)


def assert_close_in_se(samples, truth, what):
    samples = np.asarray(samples, dtype=float)
    se = samples.std(ddof=1) / np.sqrt(samples.size)
    assert abs(samples.mean() - truth) < Z * se + 1e-12, f"{what}: {samples.mean()} vs {truth}"


@pytest.fixture(scope=per_test_under_mutmut)
def warm():
    pair = random_pair(3, H, seed=39, mix=0.6, eos_token_id=2)
    truth = exact(tempered(pair, 0.7))
    # At T = 1 the truth differs clearly, so matching it at 0.7 is not a coincidence.
    assert abs(exact(pair).R - truth.R) > 0.09  # about 12 standard errors
    naive = coupled_rollouts(pair, K, H, temperature=0.7, seed=4)
    branch = swrb(pair, K, H, depths=(1, 2), temperature=0.7, seed=5)
    return truth, naive, branch


def test_rollouts_at_temperature_07_match_exact(warm):
    truth, naive, _ = warm
    assert_close_in_se(naive.mismatch.double().mean(dim=1), truth.R, "R")
    assert_close_in_se(naive.f.mean(dim=1), truth.F, "F")
    for t in range(H):
        assert_close_in_se(naive.delta[:, t], truth.expected_delta[t], f"delta_{t + 1}")
    for s in range(1, H + 1):
        assert_close_in_se((naive.tau == s).double(), truth.p_tau[s - 1], f"p_{s}")


def test_swrb_at_temperature_07_matches_exact(warm):
    truth, _, branch = warm
    assert_close_in_se(branch.z_R, truth.R, "Z^R")
    assert_close_in_se(branch.z_O, truth.O, "Z^O")
    assert_close_in_se(branch.z_Pi, truth.Pi, "Z^Pi")
    for i, L in enumerate(branch.depths):
        assert_close_in_se(branch.z_L[:, i], truth.R_L(L), f"Z_{L}")
        assert_close_in_se(branch.w_L[:, i], truth.B_L(L), f"W_{L}")
        assert_close_in_se(branch.z_tail[:, i], truth.R - truth.R_L(L), f"tail_{L}")


def test_greedy_is_deterministic_and_exact():
    # Greedy decoding: both kernels are point masses, so every replicate is the truth.
    pair = random_pair(3, 5, seed=34, mix=0.5, eos_token_id=2)
    truth = exact(tempered(pair, 0))
    assert (truth.R, truth.E, truth.Pi) == pytest.approx((0.4, 0.6, 0.2))  # re-agrees after tau = 2
    naive = coupled_rollouts(pair, 5, 5, temperature=0, seed=1)
    d_h = naive.mismatch.double().mean(dim=1)
    assert torch.all(d_h == truth.R)
    np.testing.assert_allclose(naive.delta.numpy(), np.tile(truth.expected_delta, (5, 1)))
    np.testing.assert_allclose(naive.f.numpy(), np.tile(truth.expected_fixed, (5, 1)))
    branch = swrb(pair, 5, 5, depths=(1, 5), temperature=0, seed=2)
    tau = int(np.flatnonzero(truth.p_tau)[0]) + 1
    assert torch.all(branch.M == 1) and torch.all(branch.J == tau)
    np.testing.assert_allclose(branch.z_R.numpy(), truth.R)
    np.testing.assert_allclose(branch.z_O.numpy(), 1 / 5)
    np.testing.assert_allclose(branch.w_L[:, 0].numpy(), truth.B_L(1))
    # The scan stops at tau (survival 0): tau scanned positions, then H - tau continued,
    # and nothing is drawn after the scan stopped.
    assert torch.all(branch.shared[:, tau:] == -1) and torch.all(branch.shared[:, :tau] >= 0)
    assert torch.all(branch.evaluations == tau + (5 - tau))


def test_swrb_records_follow_their_definitions():
    # Every SWRB output recomputed from the row's scan and continuation (docs/method.md section 7).
    pair = random_pair(3, 5, seed=30, mix=0.5, eos_token_id=2)
    b = swrb(pair, 400, 5, depths=(1, 2, 5), seed=6)
    Hh = 5
    w = b.weights.numpy()
    e = b.overlap_tv.numpy()
    survival = np.concatenate([np.ones((400, 1)), np.cumprod(1 - e, axis=1)[:, :-1]], axis=1)
    np.testing.assert_allclose(w, survival * e, atol=1e-15)
    np.testing.assert_allclose(b.M.numpy(), w.sum(axis=1))
    s = np.arange(1, Hh + 1)
    for i, L in enumerate(b.depths):
        np.testing.assert_allclose(b.w_L[:, i].numpy(),
                                   (w * np.maximum(Hh - s - L + 1, 0)).sum(axis=1) / Hh)
    m = b.mismatch.numpy()
    J = b.J.numpy()
    M = b.M.numpy()
    for k in range(400):
        if J[k] == 0:
            assert M[k] == 0 and not m[k].any() and b.z_R[k] == 0
            continue
        assert w[k, J[k] - 1] > 0
        assert (b.x[k, : J[k] - 1] == -1).all() and (b.x[k, J[k] - 1:] >= 0).all()
        count = m[k, J[k] - 1:].sum()
        assert b.z_R[k].item() == pytest.approx(M[k] * count / Hh, rel=1e-15)
        assert b.z_O[k] == pytest.approx(M[k] / Hh)
        assert b.z_Pi[k] == pytest.approx(M[k] * (count - 1) / Hh)
        for i, L in enumerate(b.depths):
            seen = m[k, J[k] - 1: J[k] - 1 + L].sum()
            assert b.z_L[k, i] == pytest.approx(M[k] * seen / Hh)
        # The shared prefix before J was drawn from the overlaps: tokens are valid ids.
        assert (b.shared[k, : J[k] - 1] >= 0).all()
        # Evaluations: every position scanned while survival > 0, plus H - J continued.
        scanned = int((survival[k] > 0).sum())
        assert b.evaluations[k] == scanned + Hh - J[k]


def test_branch_positions_follow_the_weights():
    # J ~ w / M given the scan: sum over replicates of 1{J = s} - w_s / M has mean 0.
    pair = random_pair(2, 4, seed=31, mix=0.7)
    b = swrb(pair, 4000, 4, seed=7)
    w, M, J = b.weights.numpy(), b.M.numpy(), b.J.numpy()
    ok = M > 0
    for s in range(1, 5):
        resid = (J[ok] == s) - w[ok, s - 1] / M[ok]
        assert abs(resid.mean()) < Z * resid.std(ddof=1) / np.sqrt(ok.sum()) + 1e-12


def test_concatenated_batches_keep_rows_and_sum_counts():
    pair = random_pair(2, 3, seed=3, mix=0.5)
    a, b = coupled_rollouts(pair, 3, 3, seed=1), coupled_rollouts(pair, 2, 3, seed=2)
    joined = concat_results([a, b])
    assert torch.equal(joined.x, torch.cat([a.x, b.x])) and joined.evaluations == 15
    assert torch.equal(joined.tau, torch.cat([a.tau, b.tau]))
    s1, s2 = swrb(pair, 3, 3, depths=(1,), seed=1), swrb(pair, 2, 3, depths=(2,), seed=1)
    with pytest.raises(ValueError, match="batches disagree on depths"):
        concat_results([s1, s2])
    with pytest.raises(ValueError, match="nothing to concatenate"):
        concat_results([])


class StrictPair(FinitePair):
    """A pair that refuses to advance a history to the horizon (the protocol allows that)."""

    def advance(self, state, tokens):
        if any(len(h) + 1 >= self.horizon for h in state.histories):
            raise AssertionError("estimator advanced a history to the horizon")
        return super().advance(state, tokens)


def leaky_eos_pair(horizon=5, seed=40):
    """Kernels that keep giving mass to every token after EOS (EOS = 2): absorption must
    come from the estimators, as the kernel-pair protocol says."""
    rng = np.random.default_rng(seed)
    rows = {}

    def row(side, history):
        key = (side, history)
        if key not in rows:
            rows[key] = rng.dirichlet(np.ones(3))
        return rows[key] if side == "p" else 0.4 * rows[key] + 0.6 * row("p", history)

    return StrictPair(lambda h: row("p", h), lambda h: row("q", h), 3, horizon,
                      eos_token_id=2)


def test_estimators_absorb_eos_themselves_and_stop_before_the_horizon():
    pair = leaky_eos_pair()
    assert pair.probs("p", (2,))[0] > 0  # the kernel itself does not absorb
    truth = exact(pair)  # exact() applies the EOS rule
    r = coupled_rollouts(pair, 3000, 5, seed=8)
    x_before = torch.cat([torch.zeros(3000, 1, dtype=torch.bool), r.x_eos[:, :-1]], dim=1)
    y_before = torch.cat([torch.zeros(3000, 1, dtype=torch.bool), r.y_eos[:, :-1]], dim=1)
    assert x_before.any() and y_before.any()
    assert torch.all(r.x[x_before] == 2) and torch.all(r.y[y_before] == 2)
    assert torch.all(r.f[x_before] == 0)  # both kernels on the absorbed X history
    assert torch.all(r.delta[x_before & y_before] == 0)
    assert_close_in_se(r.mismatch.double().mean(dim=1), truth.R, "R (EOS)")
    assert_close_in_se(r.f.mean(dim=1), truth.F, "F (EOS)")
    b = swrb(pair, 3000, 5, depths=(2,), seed=9)
    assert_close_in_se(b.z_R, truth.R, "Z^R (EOS)")
    assert_close_in_se(b.w_L[:, 0], truth.B_L(2), "W_2 (EOS)")
    for tokens in (b.x, b.y):
        seen = torch.cumsum(tokens == 2, dim=1) > 0
        after = torch.cat([torch.zeros(3000, 1, dtype=torch.bool), seen[:, :-1]], dim=1)
        assert after.any() and torch.all(tokens[after] == 2)
    # A shared prefix with EOS absorbs both kernels: no divergence is possible after it.
    u_eos = torch.cumsum(b.shared == 2, dim=1) > 0
    u_before = torch.cat([torch.zeros(3000, 1, dtype=torch.bool), u_eos[:, :-1]], dim=1)
    assert u_before.any() and torch.all(b.overlap_tv[u_before] == 0)
    assert b.shared.dtype == torch.long and torch.all(b.shared[u_before] == 2)


def test_default_seed_is_zero():
    pair = random_pair(3, 3, seed=1, mix=0.7)
    assert torch.equal(coupled_rollouts(pair, 20, 3).x, coupled_rollouts(pair, 20, 3, seed=0).x)
    assert torch.equal(swrb(pair, 20, 3).z_R, swrb(pair, 20, 3, seed=0).z_R)


def test_concatenated_swrb_batches_keep_their_depths():
    pair = random_pair(2, 3, seed=3, mix=0.5)
    a, b = swrb(pair, 3, 3, depths=(1, 2), seed=1), swrb(pair, 4, 3, depths=(1, 2), seed=2)
    joined = concat_results([a, b])
    assert joined.depths == (1, 2) and joined.replicates == 7
    assert torch.equal(joined.z_L, torch.cat([a.z_L, b.z_L]))
    assert torch.equal(joined.evaluations, torch.cat([a.evaluations, b.evaluations]))
    with pytest.raises(ValueError, match="^nothing to concatenate$"):
        concat_results([])


def test_swrb_scan_stops_where_divergence_is_certain():
    # After U_1 = 0 the kernels disagree surely (TV 1): survival 0, the scan stops there.
    # After U_1 = 1 they agree at position 2 and differ by 0.5 at position 3.
    p_table = {(): [0.5, 0.5], (0,): [1.0, 0.0], (1,): [0.5, 0.5],
               (1, 0): [1.0, 0.0], (1, 1): [1.0, 0.0], (0, 0): [1.0, 0.0], (0, 1): [1.0, 0.0]}
    q_table = {(): [0.5, 0.5], (0,): [0.0, 1.0], (1,): [0.5, 0.5],
               (1, 0): [0.5, 0.5], (1, 1): [0.5, 0.5], (0, 0): [0.5, 0.5], (0, 1): [0.5, 0.5]}
    pair = FinitePair.from_tables(p_table, q_table, 2, 3)
    b = swrb(pair, 200, 3, seed=3)
    first = b.shared[:, 0]
    dead, alive = first == 0, first == 1
    assert dead.any() and alive.any()
    assert torch.all(b.M[dead] == 1) and torch.all(b.J[dead] == 2)
    assert torch.all(b.evaluations[dead] == 2 + (3 - 2))
    assert torch.all(b.M[alive] == 0.5) and torch.all(b.J[alive] == 3)
    assert torch.all(b.evaluations[alive] == 3 + 0)
    truth = exact(pair)
    assert b.z_R.mean().item() == pytest.approx(truth.R, abs=4.5 * b.z_R.std().item() / 200**0.5)


def test_swrb_defaults_are_temperature_one_seed_zero_depth_h():
    pair = random_pair(3, 3, seed=2, mix=0.7)
    a, b = swrb(pair, 30, 3), swrb(pair, 30, 3, depths=(3,), temperature=1.0, seed=0)
    assert a.depths == (3,) and torch.equal(a.z_R, b.z_R) and torch.equal(a.J, b.J)
    c = coupled_rollouts(pair, 30, 3, temperature=1.0, seed=0)
    assert torch.equal(coupled_rollouts(pair, 30, 3).y, c.y)


def test_smallest_valid_and_boolean_arguments():
    pair = random_pair(2, 3, seed=5, mix=0.5)
    one = coupled_rollouts(pair, 1, 1, seed=0)  # K = 1 and H = 1 are valid
    assert one.x.shape == (1, 1) and one.evaluations == 1
    assert swrb(pair, 1, 1, seed=0).z_R.shape == (1,)
    for bad in (True, 1.0):
        with pytest.raises(ValueError, match="horizon H must be an integer >= 1"):
            coupled_rollouts(pair, 2, bad)
        with pytest.raises(ValueError, match="replicates K must be an integer >= 1"):
            swrb(pair, bad, 2)


def tv_np(p, q):
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


@pytest.mark.parametrize("replicates, seeds", [(1, range(8)), (40, range(2))])
def test_rollout_records_are_the_tvs_along_their_own_histories(replicates, seeds):
    # f_t is TV(P, Q) on X's history and delta_t TV(P on X, Q on Y), recomputed here from
    # the tables row by row. With K = 1 each divergence is the only new one at its step.
    pair = random_pair(3, 5, seed=21, mix=0.6)
    f_differs = False
    for seed in seeds:
        r = coupled_rollouts(pair, replicates, 5, seed=seed)
        for k in range(replicates):
            x, y = r.x[k].tolist(), r.y[k].tolist()
            for t in range(5):
                hx, hy = tuple(x[:t]), tuple(y[:t])
                f = tv_np(pair.probs("p", hx), pair.probs("q", hx))
                d = tv_np(pair.probs("p", hx), pair.probs("q", hy))
                assert r.f[k, t].item() == pytest.approx(f, abs=1e-12), (seed, k, t)
                assert r.delta[k, t].item() == pytest.approx(d, abs=1e-12), (seed, k, t)
                assert r.mismatch[k, t].item() == (x[t] != y[t])
                f_differs |= abs(f - d) > 1e-3
    assert f_differs  # some rows diverged, so Q on X and Q on Y were both exercised


class CountingPair(FinitePair):
    """Counts kernel evaluations (calls of ``logprobs``) and the rows they cover."""

    calls = 0

    def logprobs(self, state):
        self.calls += 1
        return super().logprobs(state)


def test_rollouts_without_divergence_build_no_forced_path():
    # Identical kernels never diverge: only the two branches are evaluated, H times each.
    base = random_pair(3, 4, seed=5, mix=0.5)
    row = lambda h: base.probs("p", h).copy()  # noqa: E731
    same = CountingPair(row, row, 3, 4)
    r = coupled_rollouts(same, 6, 4, seed=0)
    assert not r.mismatch.any() and same.calls == 2 * 4


def test_concatenating_one_batch_returns_it():
    pair = random_pair(2, 3, seed=3, mix=0.5)
    one = swrb(pair, 3, 3, depths=(1, 2), seed=1)
    joined = concat_results([one])
    assert joined.depths == (1, 2) and torch.equal(joined.z_R, one.z_R)
    naive = coupled_rollouts(pair, 2, 3, seed=1)
    assert concat_results([naive]).evaluations == 6


def test_swrb_outputs_are_float64_and_tokens_long():
    # Survival products and weights are accumulated in float64 (a float32 buffer would
    # round w_s = S_{s-1} e_s to ~1e-8 and carry that into M and every output).
    pair = random_pair(3, 4, seed=7, mix=0.6)
    b = swrb(pair, 5, 4, depths=(1, 2), seed=3)
    for name in ("z_R", "z_O", "z_Pi", "z_L", "z_tail", "w_L", "M", "overlap_tv", "weights"):
        assert getattr(b, name).dtype == torch.float64, name
    for name in ("J", "shared", "x", "y", "evaluations"):
        assert getattr(b, name).dtype == torch.long, name
    assert b.mismatch.dtype == torch.bool


def test_make_generator_defaults_to_a_cpu_generator():
    gen = make_generator(5)
    assert gen.device == torch.device("cpu")
    want = torch.rand(4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(torch.rand(4, generator=gen), want)
    assert make_generator(gen) is gen


def _uniforms(seed: int, n: int) -> np.ndarray:
    return torch.rand(n, dtype=torch.float64, generator=make_generator(seed)).numpy()


def test_a_cpu_generator_is_keyed_by_every_bit_of_its_seed():
    """torch's CPU twister keeps the low 32 bits of a seed: 2**32 + 5 alone draws what 5
    draws. Through make_generator seeds that differ only above bit 32 (hashed look and
    document seeds) draw different streams, normals and categorical draws included; the same
    seed draws the same stream; a seed below 2**32 keeps torch's own stream (checked above)."""
    def draws(seed):
        gen = make_generator(seed)
        return torch.cat([torch.rand(64, generator=gen), torch.randn(8, generator=gen),
                          torch.multinomial(torch.ones(50), 8, generator=gen).double()])

    plain = torch.rand(64, generator=torch.Generator().manual_seed(5))
    assert torch.equal(torch.rand(64, generator=torch.Generator().manual_seed(2**32 + 5)), plain)
    high = [draws(5 + k * 2**32) for k in range(1, 5)] + [draws(2**62 + 5), draws(2**63 - 1)]
    assert all(not torch.equal(h[:64], plain) for h in high)
    assert len({tuple(h.tolist()) for h in high}) == len(high)
    assert torch.equal(draws(2**40 + 7), draws(2**40 + 7))
    assert make_generator(2**40 + 7).initial_seed() == 2**40 + 7


@pytest.mark.parametrize("seed", [2**32, 2**32 + 5, 2**63 - 1, 0x5DEECE66D_0BB1])
def test_a_wide_seed_draws_numpys_mt19937_stream_word_for_word(seed):
    """The state written into torch's generator (its 624 words, ``left``, ``next``, the empty
    normal caches) is the one meant: torch's draws are numpy's ``MT19937(seed)`` words, read
    as torch reads them (a float64 from two words, 53 bits; a float32 from one word's low 24
    bits), across several twists. A wrong offset, word width or position breaks the first
    draws; a kept normal cache breaks the normals' agreement."""
    words = np.random.MT19937(seed).random_raw(2 * 1000 + 1000).astype(np.uint64)
    pairs = ((words[0:2000:2] << np.uint64(32)) | words[1:2000:2]) & np.uint64(2**53 - 1)
    gen = make_generator(seed)
    np.testing.assert_array_equal(torch.rand(1000, dtype=torch.float64, generator=gen).numpy(),
                                  pairs.astype(np.float64) / 2**53)
    singles = (words[2000:] & np.uint64(2**24 - 1)).astype(np.float32) / np.float32(2**24)
    np.testing.assert_array_equal(torch.rand(1000, generator=gen).numpy(), singles)
    a, b = make_generator(seed), make_generator(seed)
    assert torch.equal(torch.randn(3, dtype=torch.float64, generator=a),
                       torch.randn(3, dtype=torch.float64, generator=b))


def test_streams_of_derived_seeds_are_uncorrelated_and_never_overlap():
    """The streams kvdrift keys by hashed seeds (each document of a study, each document of
    each look of two searches, seeds apart only above bit 32): for streams of n = 4096
    uniforms, sqrt(n) times each pairwise correlation is about N(0, 1) under independence,
    at lag 0 and with one stream shifted by a draw, so each family's sum of squares is
    chi-square with one degree of freedom per pair (ordered pairs when shifted); it is refused
    below p = 1e-4 (six checks: a false alarm in fewer than 1 in 1,600 seed sets; the seeds
    are fixed). A stream
    that is a shifted copy of another would repeat 53-bit values: none repeats."""
    from scipy import stats

    from kvdrift.frontier_search.study import look_seed
    from kvdrift.run.runner import unit_seed

    n = 4096
    docs = [f"d{i}" for i in range(12)]
    families = {
        "documents": [unit_seed(s, d) for s in (5, 6) for d in docs],
        "looks": [unit_seed(look_seed(s, look), d) for s in (0, 1) for look in (1, 2, 3)
                  for d in docs[:4]],
        "high bits": [5 + k * 2**32 for k in range(1, 25)],
    }
    for name, seeds in families.items():
        assert all(seed >= 2**32 for seed in seeds)
        x = np.stack([_uniforms(seed, n) for seed in seeds])
        upper = np.triu_indices(len(seeds), 1)
        same = np.corrcoef(x)[upper] * np.sqrt(n)
        shifted = np.corrcoef(x[:, 1:], x[:, :-1])[:len(seeds), len(seeds):]
        shifted = shifted[~np.eye(len(seeds), dtype=bool)] * np.sqrt(n - 1)
        for z in (same, shifted):
            assert stats.chi2.sf(float((z ** 2).sum()), z.size) > 1e-4, name
        assert np.unique(x).size == x.size, name


@pytest.mark.parametrize("replicates", [1, 2])
def test_swrb_continuation_runs_from_j_to_the_horizon(replicates):
    # Each diverging row holds continuation tokens exactly at positions J..H (-1 before J),
    # also when it is the only row in the batch or the last one left; rows with M = 0
    # hold -1 throughout.
    pair = random_pair(3, 5, seed=21, mix=0.6)
    js = set()
    for seed in range(6):
        b = swrb(pair, replicates, 5, seed=seed)
        for k in range(replicates):
            J = int(b.J[k])
            started = torch.arange(1, 6) >= J if J > 0 else torch.zeros(5, dtype=torch.bool)
            for tokens in (b.x[k], b.y[k]):
                assert torch.all(tokens[started] >= 0) and torch.all(tokens[~started] == -1)
            assert torch.equal(b.mismatch[k], started & (b.x[k] != b.y[k]))
            js.add(J)
    assert len(js - {0, 5}) >= 2  # several continuations of more than one position
