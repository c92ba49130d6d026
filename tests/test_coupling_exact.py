"""Coupling helpers pinned by exact values: validation messages, dtypes, shapes and draws.

``sample_categorical`` and ``coupled_draw`` are checked against an inverse-CDF
reconstruction from the same generator: the module promises a fixed consumption of
random numbers (float64 uniforms) so that seeded runs stay in lockstep.
"""

import pytest
import torch

from kvdrift.coupling import (
    check_probs,
    coupled_draw,
    overlap_draw,
    residual_draw,
    sample_categorical,
    tempered_probs,
    tv_distance,
)


def test_check_probs_accepts_edge_cases_and_returns_float64():
    out = check_probs(torch.tensor([0.25, 0.75], dtype=torch.float32))
    assert out.dtype == torch.float64 and out.shape == (1, 2)
    assert check_probs([[1.0]]).shape == (1, 1)  # a one-token vocabulary is valid
    assert check_probs(torch.zeros(0, 3)).shape == (0, 3)  # an empty batch is valid
    zeros = check_probs([[0.0, 1.0], [0.5, 0.5]])  # zero mass is allowed; columns need not sum
    assert zeros.tolist() == [[0.0, 1.0], [0.5, 0.5]]
    assert check_probs([[0.5, 0.5 + 0.5e-6]]).shape == (1, 2)  # within the tolerance


@pytest.mark.parametrize("probs, message", [
    (torch.zeros(2, 2, 2), r"probabilities must have shape \[rows, vocab\]; got \(2, 2, 2\)"),
    (torch.zeros(2, 0), r"must have shape \[rows, vocab\]; got \(2, 0\)"),
    ([[0.5, 0.5], [float("nan"), 1.0]], r"must be finite; got a row starting \[nan, 1.0\]"),
    ([[0.1] * 10, [float("inf")] + [0.0] * 9],
     r"got a row starting \[inf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0\]$"),
    ([[0.5, 0.5], [-0.1, 1.1]], r"must be non-negative; got row \[-0.1, 1.1\]"),
    ([[0.5, 0.5], [0.6, 0.5]], r"must sum to 1 \(within 1e-06\); a row sums to 1.1$"),
    ([[0.5, 0.5 + 2e-6]], "must sum to 1"),
])
def test_check_probs_messages_name_the_bad_value(probs, message):
    with pytest.raises(ValueError, match=message):
        check_probs(probs)


def test_tempered_probs_values_and_dtype():
    logp = torch.log(torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]], dtype=torch.float32))
    greedy = tempered_probs(logp, 0)
    assert greedy.dtype == torch.float64
    assert greedy.tolist() == [[0, 0, 1], [1, 0, 0]]
    warm = tempered_probs(logp, 0.5)
    assert warm.dtype == torch.float64
    w = torch.tensor([[0.04, 0.09, 0.25], [0.36, 0.09, 0.01]], dtype=torch.float64)
    torch.testing.assert_close(warm, w / w.sum(dim=1, keepdim=True), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError,
                       match=r"^temperature must be a finite number >= 0 \(0 = greedy\); got nan$"):
        tempered_probs(logp, float("nan"))


def test_tv_distance_exact_values():
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.2, 0.8]])
    q = torch.tensor([[0.0, 1.0], [0.5, 0.5], [0.6, 0.4]], dtype=torch.float64)
    tv = tv_distance(p, q)
    assert tv.dtype == torch.float64
    torch.testing.assert_close(tv, torch.tensor([1.0, 0.0, 0.4], dtype=torch.float64))


def test_sample_categorical_is_inverse_cdf_of_float64_uniforms():
    weights = torch.tensor([[0.0, 2.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 5.0]])
    got = sample_categorical(weights, torch.Generator().manual_seed(3))
    assert got.shape == (3,) and got.dtype == torch.long
    u = torch.rand(3, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    cdf = weights.double().cumsum(dim=1)
    want = [int((cdf[i] <= u[i, 0] * cdf[i, -1]).sum()) for i in range(3)]
    assert got.tolist() == want
    # float32 weights draw exactly the same indices
    again = sample_categorical(weights.float(), torch.Generator().manual_seed(3))
    assert again.tolist() == want
    # one row, weight on the last index of three; all-zero rows give a valid index
    one = sample_categorical(torch.tensor([[0.0, 0.0, 1.0]]), torch.Generator().manual_seed(0))
    assert one.tolist() == [2]
    empty = sample_categorical(torch.zeros(2, 3), torch.Generator().manual_seed(0))
    assert ((empty >= 0) & (empty < 3)).all()


def test_coupled_draw_consumes_uniform_then_overlap_then_residuals():
    p = torch.tensor([[0.7, 0.2, 0.1]] * 200, dtype=torch.float64)
    q = torch.tensor([[0.1, 0.2, 0.7]] * 200, dtype=torch.float64)
    draw = coupled_draw(p, q, torch.Generator().manual_seed(11))
    gen = torch.Generator().manual_seed(11)
    u = torch.rand(200, generator=gen, dtype=torch.float64)
    z = overlap_draw(p, q, gen)
    xr, yr = residual_draw(p, q, gen)
    split = u < 0.6
    assert torch.equal(draw.x, torch.where(split, xr, z))
    assert torch.equal(draw.y, torch.where(split, yr, z))
    torch.testing.assert_close(draw.tv, torch.full((200,), 0.6, dtype=torch.float64))
    assert 0 < split.sum() < 200  # both branches of the coupling occur here
    with pytest.raises(ValueError, match=r"same shape; got \(200, 3\) and \(1, 3\)"):
        coupled_draw(p, q[:1], gen)


def test_check_probs_negative_message_names_the_first_negative_row():
    # The first row holds a zero (valid), the second a negative: the message names the second.
    with pytest.raises(ValueError, match=r"non-negative; got row \[-0.25, 1.25\]$"):
        check_probs([[0.0, 1.0], [-0.25, 1.25]])


def test_tv_distance_is_clipped_to_one():
    # Rows may exceed 1 by check_probs' tolerance; disjoint supports then give 0.5 * 2(1 + d).
    d = 0.5e-6
    p = torch.tensor([[1.0 + d, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.0, 1.0 + d]], dtype=torch.float64)
    assert tv_distance(p, q).tolist() == [1.0]
    assert (0.5 * (p - q).abs().sum()).item() > 1.0  # the clip is what brings it to 1


def fixed_uniforms(monkeypatch, values):
    """Make torch.rand return ``values`` (float64) in the shape asked: boundary draws on demand."""
    def rand(*shape, generator=None, dtype=None, device=None):
        return torch.tensor(values, dtype=torch.float64).reshape(*shape)
    monkeypatch.setattr(torch, "rand", rand)


@pytest.mark.parametrize("u, weights, want", [
    (0.0, [0.0, 0.5, 0.5], 1),  # u = 0 lands on the zero-weight index's cdf: skipped
    (0.5, [0.5, 0.0, 0.5], 2),  # u * total equals cdf[0] = cdf[1]: the next positive weight
])
def test_sample_categorical_never_returns_zero_weight_at_boundaries(monkeypatch, u, weights,
                                                                     want):
    fixed_uniforms(monkeypatch, [u])
    assert sample_categorical(torch.tensor([weights]), torch.Generator()).tolist() == [want]


def test_sample_categorical_accumulates_float32_weights_in_float64(monkeypatch):
    # float32 weights [1, 3 * 2**-24]: their float64 total is 1 + 0.75 * 2**-22, a float32
    # cumsum rounds it to 1 + 2**-22. With u = 1 - 7 * 2**-25, u * total is below 1 (index
    # 0) only with the float64 total.
    w = torch.tensor([[1.0, 3 * 2.0**-24]], dtype=torch.float32)
    assert w.cumsum(dim=-1)[0, 1].item() == 1 + 2.0**-22  # what float32 accumulation gives
    fixed_uniforms(monkeypatch, [1 - 7 * 2.0**-25])
    assert sample_categorical(w, torch.Generator()).tolist() == [0]


def test_coupled_draw_with_zero_tv_never_splits(monkeypatch):
    # e = 0 and u = 0: the coupling must take the shared draw (u < e is false); the
    # residuals are all zero and return the last index, which has probability 0 here.
    fixed_uniforms(monkeypatch, [0.0])
    p = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    assert sample_categorical(torch.zeros(1, 2), torch.Generator()).tolist() == [1]
    draw = coupled_draw(p, p.clone(), torch.Generator())
    assert draw.x.tolist() == [0] and draw.y.tolist() == [0] and draw.tv.tolist() == [0.0]
