"""Finite pairs at their edges: whole refusal messages, defaults, ``info``, the path
operations, and the paper's system rebuilt from its recipe (docs/method.md section 11)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from messages import whole

from kvdrift.finite import FinitePair, exact, extremal_pair, paper_system, random_pair


def binary_pair(horizon: int = 3, eos: int | None = None) -> FinitePair:
    return FinitePair(lambda h: [0.25, 0.75], lambda h: [1.0, 0.0], 2, horizon, eos)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: random_pair(0, 3, 0), "vocab_size must be an integer >= 1; got 0"),
    (lambda: random_pair(2, 0, 0), "horizon must be an integer >= 1; got 0"),
    (lambda: random_pair(2, 3, -1), "seed must be an integer >= 0; got -1"),
    (lambda: paper_system(1, n_systems=0), "n_systems must be an integer >= 1; got 0"),
    (lambda: paper_system(1, H=0), "H must be an integer >= 1; got 0"),
    (lambda: paper_system(1, seed=-1), "seed must be an integer >= 0; got -1"),
    (lambda: binary_pair().start("p", -1), "n must be an integer >= 0; got -1"),
    (lambda: binary_pair().probs("p", "ab"), "a history must be a tuple of token ids; got 'ab'"),
    (lambda: binary_pair().probs("p", (2,)), "history (2,) has a token outside 0..1"),
    (lambda: binary_pair().probs("p", (-1,)), "history (-1,) has a token outside 0..1"),
    (lambda: FinitePair.from_tables({(): [1.0, 0.0]}, {(): [0.0, 1.0]}, 2, 2).probs("p", (1,)),
     "p_table has no row for history (1,)"),
    (lambda: FinitePair.from_tables({(): [1.0, 0.0], (0,): [1.0, 0.0]}, {(): [0.0, 1.0]}, 2, 2,
                                    eos_token_id=1).probs("q", (0,)),
     "q_table has no row for history (0,)"),
    (lambda: FinitePair(lambda h: [0.5, 0.5], lambda h: [1.5, -0.5], 2, 2).probs("q", (0,)),
     "q(0,) must be non-negative; got row [1.5, -0.5]"),
])
def test_refusals_name_the_value_and_what_is_allowed(make, message) -> None:
    with pytest.raises(ValueError, match=whole(message)):
        make()


def test_path_operations_refuse_bad_indices_whole() -> None:
    pair = binary_pair()
    state = pair.advance(pair.start("p", 2), torch.tensor([0, 1]))
    cases = [
        (lambda: pair.advance(state, torch.tensor([0.0, 1.0])),
         "tokens must be a 1-D integer tensor; got dtype torch.float32, shape (2,)"),
        (lambda: pair.advance(state, torch.tensor([0, 1, 1])),
         "tokens must have one entry per row (2); got 3"),
        (lambda: pair.truncate(state, torch.tensor([True, False])),
         "lengths must be a 1-D integer tensor; got dtype torch.bool, shape (2,)"),
        (lambda: pair.truncate(state, torch.tensor([1])),
         "lengths must have one entry per row (2); got 1"),
        (lambda: pair.select(state, torch.tensor([[0]])),
         "rows must be a 1-D integer tensor; got dtype torch.int64, shape (1, 1)"),
        (lambda: pair.select(state, torch.tensor([0, 2])), "rows must lie in 0..1; got [0, 2]"),
        (lambda: pair.join([]), "join needs at least one state"),
        (lambda: pair.join([state, pair.start("q", 1)]),
         "only states of one side can be joined; got ['p', 'q']"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=whole(message)):
            make()


def test_join_select_and_truncate_keep_rows_in_order() -> None:
    pair = binary_pair()
    a = pair.advance(pair.start("q", 2), torch.tensor([0, 1]))
    b = pair.advance(pair.advance(pair.start("q", 1), torch.tensor([1])), torch.tensor([0]))
    joined = pair.join([a, b, a])
    assert joined.side == "q" and joined.histories == ((0,), (1,), (1, 0), (0,), (1,))
    assert pair.join([b]) == b
    assert pair.select(joined, torch.tensor([2, 0, 2])).histories == ((1, 0), (0,), (1, 0))
    assert pair.truncate(joined, torch.tensor([0, 1, 1, 1, 0])).histories == (
        (), (1,), (1,), (0,), ())


def test_empty_state_and_zero_mass_log_probabilities() -> None:
    pair = FinitePair(lambda h: [1.0, 0.0], lambda h: [0.5, 0.5], 2, 2)
    empty = pair.logprobs(pair.start("p", 0))
    assert empty.shape == (0, 2) and empty.dtype == torch.float64
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # log(0) is -inf by design, not a warning
        rows = pair.logprobs(pair.start("p", 2))
    assert rows.tolist() == [[0.0, float("-inf")]] * 2
    assert repr(pair) == "FinitePair(vocab_size=2, horizon=2, eos_token_id=None, info={})"


def test_defaults_info_and_smallest_sizes() -> None:
    def rows(pair):
        hs = itertools.chain.from_iterable(
            itertools.product(range(pair.vocab_size), repeat=n) for n in range(pair.horizon))
        return [(pair.probs("p", h).tolist(), pair.probs("q", h).tolist()) for h in hs]

    assert rows(random_pair(3, 2, 5)) == rows(random_pair(3, 2, 5, concentration=1.0))
    assert dict(random_pair(3, 2, 5, mix=0.25).info) == {"kind": "random", "mix": 0.25,
                                                         "concentration": 1.0}
    assert rows(paper_system(3)) == rows(paper_system(3, seed=0))
    assert random_pair(1, 2, 0).probs("q", (0,)).tolist() == [1.0]  # one token: V = 1
    assert exact(random_pair(2, 1, 0)).horizon == 1  # H = 1
    assert exact(paper_system(1, n_systems=1, H=1)).horizon == 1
    assert dict(extremal_pair([0.5, 0.25], [[1.0, 0.5], [1.0, 0.0]], 2, 0.3).info) == {
        "kind": "extremal", "L": 2, "alpha": 0.3}


def test_paper_system_follows_its_recipe() -> None:
    """Rebuilt from docs/method.md section 11 and the docstring: u, v, then per prefix (shortest
    first, lexicographic) P's Gamma(1.5, 1) + 0.05 weights before A's."""
    c, n_systems, H, seed = 7, 24, 3, 11
    rng = np.random.default_rng([seed, c])
    u, v = rng.uniform(0.5, 1.0), rng.uniform(0.0, 1.0)
    lam = (0.05 + 0.45 * c / n_systems) * u * v
    pair = paper_system(c, n_systems, H, seed)
    assert dict(pair.info) == {"kind": "paper", "c": c, "n_systems": n_systems, "seed": seed,
                               "lambda": lam, "u": u, "v": v}
    for n in range(H):
        for h in itertools.product((0, 1), repeat=n):
            p_w = rng.gamma(1.5, 1.0, size=2) + 0.05
            a_w = rng.gamma(1.5, 1.0, size=2) + 0.05
            p, a = p_w / p_w.sum(), a_w / a_w.sum()
            np.testing.assert_allclose(pair.probs("p", h), p, rtol=1e-15, atol=0)
            np.testing.assert_allclose(pair.probs("q", h), (1 - lam) * p + lam * a,
                                       rtol=1e-15, atol=0)


@pytest.mark.parametrize(("p_tau", "rho", "message"), [
    ([0.5, 0.2], [[1, 0], [1, 0], [1, 0]], "rho must have shape [H, >= L] = [2, >= 2]; got (3, 2)"),
    ([0.5, 0.2], [1, 0], "rho must have shape [H, >= L] = [2, >= 2]; got (2,)"),
    # p_1 = 0 skips row 0's checks, not the rows after it
    ([0.0, 0.5], [[np.nan, np.nan], [0.9, 0.0]], "rho_{s,0} must be 1 (a mismatch at tau); "
                                                 "rho[1, 0] = 0.9"),
    ([0.5, 0.2], [[1.0, np.nan], [1.0, 0.0]], "rho[0, :2] is used (p_1 > 0) and must not be "
                                              "nan; got [1.0, nan]"),
])
def test_extremal_refusals_name_the_row(p_tau, rho, message) -> None:
    with pytest.raises(ValueError, match=whole(message)):
        extremal_pair(p_tau, rho, 2, 0.5)


def test_extremal_edges() -> None:
    # H = 1: R = p_1 (one position, a mismatch at tau = 1).
    assert exact(extremal_pair([0.5], [[1.0]], 1, 0.7)).R == pytest.approx(0.5, abs=1e-15)
    # rho may be wider than L (as ExactRisk.rho is [H, H]); only the first L columns count.
    wide = exact(extremal_pair([0.5, 0.25], [[1.0, 0.5, 0.9], [1.0, 0.0, 0.9]], 2, 0.3))
    assert wide.R == pytest.approx((0.5 * 1.5 + 0.25) / 2, abs=1e-15)
    # The last row's depth is 1: a nan beyond it is allowed.
    extremal_pair([0.5, 0.2, 0.1], [[1, 0], [1, 0], [1, np.nan]], 2, 0.5)
    # An unreachable row (p_1 = 0) answers "no mismatch" where its rho is nan ...
    pair = extremal_pair([0.0, 0.5], [[np.nan, np.nan], [1.0, np.nan]], 2, 0.3)
    assert pair.probs("q", (1,)).tolist() == [1.0, 0.0]
    # ... and eta_t = p_t / Sbar_t is kept within [0, 1] where rounding makes it 1 + 2^-52.
    p_tau = np.array([0.2, 0.4, 0.4])
    survive = 1.0 - np.cumsum(p_tau)[1]
    assert p_tau[2] / survive > 1.0  # the rounding this guards against
    last = extremal_pair(p_tau, [[1, 0, 0], [1, 0, 0], [1, 0, 0]], 1, 0.0).probs("q", (0, 0))
    assert last.tolist() == [0.0, 1.0]
    # Sbar_3 = 0 (all mass spent by t = 2): eta_3 is 0, not 0/0, on the unreachable history
    spent = extremal_pair([0.5, 0.5, 0.0], [[1, 0, 0], [1, 0, 0], [1, 0, 0]], 1, 0.3)
    assert spent.probs("q", (0, 0)).tolist() == [1.0, 0.0]
    # the sum of p may exceed 1 by the tolerance 1e-12, not more
    assert exact(extremal_pair([1 + 1e-12], [[1.0]], 1, 0.0)).R == pytest.approx(1.0)


def test_exact_names_what_it_was_given() -> None:
    with pytest.raises(TypeError, match=whole("exact() needs a FinitePair; got str")):
        exact("pair")  # type: ignore[arg-type]
