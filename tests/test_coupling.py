"""The stepwise maximal coupling: marginals, mismatch probability, edge cases."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from kvdrift.coupling import (
    absorb_eos,
    check_probs,
    coupled_draw,
    residual_draw,
    tempered_probs,
    tv_distance,
)

# Each goodness-of-fit check below rejects a correct sampler with probability 1e-4
# (before fixing the seed); with fixed seeds the outcome is deterministic.
ALPHA = 1e-4
N = 40_000


def _gen(seed: int = 0) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _pq() -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.tensor([0.40, 0.25, 0.20, 0.10, 0.05, 0.0], dtype=torch.float64)
    q = torch.tensor([0.10, 0.30, 0.05, 0.25, 0.00, 0.30], dtype=torch.float64)
    return p, q


def test_marginals_match_p_and_q():
    p, q = _pq()
    draw = coupled_draw(p.expand(N, -1), q.expand(N, -1), _gen(1))
    for tokens, probs in ((draw.x, p), (draw.y, q)):
        counts = np.bincount(tokens.numpy(), minlength=6)
        support = probs.numpy() > 0
        assert counts[~support].sum() == 0, "a zero-probability token was drawn"
        pvalue = stats.chisquare(counts[support], N * probs.numpy()[support]).pvalue
        assert pvalue > ALPHA


def test_mismatch_probability_equals_tv():
    p, q = _pq()
    draw = coupled_draw(p.expand(N, -1), q.expand(N, -1), _gen(2))
    e = float(tv_distance(p[None], q[None]))
    assert e == pytest.approx(0.5 * float((p - q).abs().sum()))
    rate = float((draw.x != draw.y).double().mean())
    z = (rate - e) / math.sqrt(e * (1 - e) / N)
    assert abs(z) < stats.norm.isf(ALPHA / 2)
    assert torch.allclose(draw.tv, torch.full((N,), e, dtype=torch.float64))


def test_agreeing_pairs_follow_the_overlap():
    p, q = _pq()
    draw = coupled_draw(p.expand(N, -1), q.expand(N, -1), _gen(3))
    c = torch.minimum(p, q)
    agree = draw.x[draw.x == draw.y].numpy()
    counts = np.bincount(agree, minlength=6)
    support = c.numpy() > 0
    assert counts[~support].sum() == 0
    expected = len(agree) * (c / c.sum()).numpy()[support]
    assert stats.chisquare(counts[support], expected).pvalue > ALPHA


def test_identical_inputs_never_mismatch_and_disjoint_always_do():
    g = _gen(4)
    p = torch.softmax(torch.randn(500, 7, generator=g, dtype=torch.float64), -1)
    same = coupled_draw(p, p.clone(), g)
    assert torch.equal(same.x, same.y)
    assert torch.all(same.tv == 0)
    a = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64).expand(500, -1)
    b = torch.tensor([[0.0, 0.0, 0.3, 0.7]], dtype=torch.float64).expand(500, -1)
    apart = coupled_draw(a, b, g)
    assert torch.all(apart.x != apart.y)
    assert torch.all(apart.tv == 1)
    assert set(apart.x.tolist()) <= {0, 1} and set(apart.y.tolist()) <= {2, 3}


def test_residual_draws_always_differ_and_stay_in_residual_support():
    p, q = _pq()
    x, y = residual_draw(p.expand(N, -1), q.expand(N, -1), _gen(5))
    assert torch.all(x != y)
    assert set(x.tolist()) <= {0, 2, 4} and set(y.tolist()) <= {1, 3, 5}


def test_same_seed_same_draws():
    p, q = _pq()
    a = coupled_draw(p.expand(64, -1), q.expand(64, -1), _gen(7))
    b = coupled_draw(p.expand(64, -1), q.expand(64, -1), _gen(7))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_temperature():
    logp = torch.log(torch.tensor([[0.1, 0.6, 0.3]], dtype=torch.float64))
    assert torch.allclose(tempered_probs(logp, 1.0), logp.exp())
    assert tempered_probs(logp, 0.0).tolist() == [[0.0, 1.0, 0.0]]
    sharp = tempered_probs(logp, 0.5)
    assert torch.allclose(sharp, logp.exp() ** 2 / (logp.exp() ** 2).sum())
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        tempered_probs(logp, -1.0)


def test_absorb_eos_sets_point_mass_on_absorbed_rows_only():
    probs = torch.full((3, 4), 0.25, dtype=torch.float64)
    out = absorb_eos(probs, torch.tensor([False, True, False]), eos_token_id=2)
    assert out[1].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert torch.equal(out[[0, 2]], probs[[0, 2]])
    assert absorb_eos(probs, torch.tensor([True, True, True]), None) is probs


@pytest.mark.parametrize(
    "row, message",
    [([0.5, 0.6], "sum to 1"), ([1.2, -0.2], "non-negative"), ([float("nan"), 1.0], "finite")],
)
def test_check_probs_rejects_bad_rows(row, message):
    with pytest.raises(ValueError, match=message):
        check_probs(torch.tensor(row))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scan_step_is_tv_then_overlap_then_residual_draws(dtype):
    """SWRB's ``scan_step`` shares one ``p - q`` pass; it must give exactly what the three
    separate functions give, in that order, from the same random stream (rows with TV 0 and
    TV 1 included)."""
    from kvdrift.coupling import overlap_draw, residual_draw, scan_step, tv_distance

    g = torch.Generator().manual_seed(30)
    p = torch.softmax(torch.randn(6, 50, generator=g) * 3, dim=-1).to(dtype)
    q = torch.softmax(torch.randn(6, 50, generator=g) * 3, dim=-1).to(dtype)
    q[0] = p[0]  # TV 0
    p[1], q[1] = 0.0, 0.0
    p[1, 3], q[1, 7] = 1.0, 1.0  # TV 1
    step = scan_step(p, q, torch.Generator().manual_seed(31))
    gen = torch.Generator().manual_seed(31)
    tv, shared = tv_distance(p, q), overlap_draw(p, q, gen)
    x, y = residual_draw(p, q, gen)
    assert torch.equal(step.tv, tv) and step.tv.dtype == torch.float64
    assert torch.equal(step.shared, shared)
    assert torch.equal(step.x, x) and torch.equal(step.y, y)
    assert step.tv[0] == 0 and step.tv[1] == 1 and step.x[1] == 3 and step.y[1] == 7
    assert bool((step.x[2:] != step.y[2:]).all())  # residuals have disjoint supports
