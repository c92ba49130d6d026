"""The joint step: several path states (P, Q along Y, Q forced along X) in one model call.

``advance_many`` must give every row the logits separate ``advance`` calls give, to float32
noise (1e-4 on logits of size ~10), on GQA, multi-head, multi-query, Qwen2 and Mistral models,
for every family of action (head-adaptive masks, per-layer budgets, decode-time eviction),
with rows of different lengths and holes; P and Q rows with equal inputs must stay
bit-identical, so ``full`` gives TV exactly 0; and the estimators' records must match the
separate path.
"""

from __future__ import annotations

import pytest
import torch

from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.finite import random_pair
from kvdrift.lm.engine.pair import LMKernelPair
from tests.test_shared_attention import MODEL_KINDS, _model, _prompt, _tokens, walk

TOL = 1e-4


class SeparatePair(LMKernelPair):
    """The separate-forward path: ``advance_many`` as one ``advance`` per state."""

    def advance_many(self, states, tokens, **kwargs):
        return [LMKernelPair.advance_many(self, [s], [t], **kwargs)[0]
                for s, t in zip(states, tokens, strict=True)]


def _fresh_tokens(rows: int, steps: int, start: int) -> torch.Tensor:
    """Token ids ``start, start + 1, ...`` along each row, above every prompt token of
    :func:`_distinct_prompt`: no token occurs twice in a row's prompt + history."""
    return (start + torch.arange(steps)).repeat(rows, 1)


def _distinct_prompt(n: int) -> torch.Tensor:
    """``n`` distinct token ids in random order (ids 3 .. n + 2)."""
    return (3 + torch.randperm(n, generator=torch.Generator().manual_seed(0)))[None]


def three_paths(pair: LMKernelPair, distinct: bool = False) -> list:
    """A P state, a Q state and a 'forced' Q state whose rows have different lengths and
    holes (truncated, one row back at length 0)."""
    def tokens(rows: int, steps: int, seed: int) -> torch.Tensor:
        return _fresh_tokens(rows, steps, 100) if distinct else _tokens(rows, steps, seed)

    x = walk(pair, "p", tokens(4, 5, seed=1))
    y = walk(pair, "q", tokens(4, 5, seed=2))
    forced = pair.truncate(walk(pair, "q", tokens(3, 6, seed=3)), torch.tensor([6, 2, 0]))
    return [x, y, forced]


def assert_steps_agree(pair: LMKernelPair, steps: int = 4, distinct: bool = False) -> None:
    """``distinct``: every row's tokens differ from each other and from the prompt's (see
    the decode-time eviction test)."""
    separate, joint = three_paths(pair, distinct), three_paths(pair, distinct)
    for t in range(steps):
        tokens = [_fresh_tokens(s.n, 1, 106 + t)[:, 0] if distinct else
                  _tokens(s.n, 1, seed=10 * t + i)[:, 0] for i, s in enumerate(separate)]
        separate = [pair.advance(s, tok) for s, tok in zip(separate, tokens, strict=True)]
        joint = pair.advance_many(joint, tokens)
        for a, b in zip(separate, joint, strict=True):
            assert a.side == b.side and torch.equal(a.lengths, b.lengths)
            assert torch.equal(a.mask, b.mask) and torch.equal(a.slot_step, b.slot_step)
            err = (a.logits - b.logits).abs().max()
            assert err <= TOL, (t, a.side, float(err))
            if a.evictions is not None:  # decode-time eviction compressed at the same steps
                for ea, eb in zip(a.evictions.prompt, b.evictions.prompt, strict=True):
                    assert torch.equal(ea == ea.max(), eb == eb.max())


@pytest.mark.parametrize("kind,heads,kv_heads", MODEL_KINDS)
@pytest.mark.parametrize("action", ["full", "snapkv-half", "recent-half"])
def test_joint_step_equals_separate_steps(kind, heads, kv_heads, action):
    assert_steps_agree(LMKernelPair(_model(kind, heads, kv_heads), _prompt(90), action))


@pytest.mark.parametrize("action", [
    "adakv-snapkv:ratio=0.5",  # head-adaptive: per-head masks over the shared prompt
    "criticaladakv-snapkv:ratio=0.5",
    "perlayer-knorm:ratios=0.9/0.3",  # per-layer budgets
    "pyramidkv:ratio=0.5",
])
def test_joint_step_equals_separate_steps_for_every_family(tiny_llama, action):
    assert_steps_agree(LMKernelPair(tiny_llama, _prompt(90), action), steps=7)


@pytest.mark.parametrize("action", [
    "decoding-knorm:interval=3,target=50",  # decode-time eviction: per-row masks
    "decoding-knorm:interval=5,target=1",
    "snapkv:ratio=0.5+decoding-knorm:interval=2,target=30",
])
def test_joint_step_equals_separate_steps_with_decode_time_eviction(tiny_llama, action):
    """Decode-time eviction compresses at the same steps and keeps the same entries.

    Every token of a row is distinct: a token that occurs twice has two layer-0 keys of the
    same norm (RoPE keeps norms), a tie that Knorm's top-k breaks by the last bit of the
    norms, which the joint and the separate step may round differently (found with one
    thread: entries 44 and 75 of a random prompt, both token 24, swapped). Either choice is
    kvpress's press; a tie is not a disagreement between the paths.
    """
    assert_steps_agree(LMKernelPair(tiny_llama, _distinct_prompt(90), action), steps=7,
                       distinct=True)


@pytest.mark.parametrize("forced_rows", [[3, 1], [4, 3, 2, 1, 0]])
def test_p_and_q_rows_with_equal_inputs_are_bit_identical_in_one_call(tiny_llama, forced_rows):
    """X and Y with equal inputs stay bit-identical while forced rows (Q along X) are stepped
    in the same call.

    A BLAS may round a row differently depending on the number of rows of the product (this
    test failed on an AMX Xeon, MKL, when X's 5 rows went through one forward and Y's 5 with
    the forced rows through another: 5 versus 7 rows in ``down_proj``). So the batches the
    model sees are checked too, which holds on every machine: X's tokens and Y's each make up a
    forward of their own, of equal shape.
    """
    pair = LMKernelPair(tiny_llama, _prompt(70), "full")
    history = _tokens(5, 6, seed=4)
    x, y = pair.start("p", 5), pair.start("q", 5)
    forced = pair.select(walk(pair, "q", history[:, :2]), torch.tensor(forced_rows))
    batches: list[torch.Tensor] = []
    seen = tiny_llama.model.embed_tokens.register_forward_pre_hook(
        lambda _, args: batches.append(args[0][:, 0].clone()))
    try:
        for t in range(2, 6):
            batches.clear()
            x, y, forced = pair.advance_many([x, y, forced], [history[:, t], history[:, t],
                                                              history[forced_rows, t]])
            assert sum(torch.equal(b, history[:, t]) for b in batches) == 2
            assert torch.equal(x.logits, y.logits)
    finally:
        seen.remove()


@pytest.mark.parametrize("replicates", [3, 5, 6])  # 6- and 10-row batches: BLAS tails differ
def test_same_path_control_stays_exactly_zero(tiny_llama, replicates):
    pair = LMKernelPair(tiny_llama, _prompt(48), "full")
    r = coupled_rollouts(pair, replicates, 8, seed=1)
    assert torch.all(r.delta == 0) and torch.all(r.f == 0) and not r.mismatch.any()
    assert torch.all(r.kl == 0) and torch.equal(r.logp_x, r.logq_x)
    s = swrb(pair, replicates, 8, seed=1)
    assert torch.all(s.M == 0)


@pytest.mark.parametrize("action", ["snapkv-half", "decoding-knorm:interval=2,target=30"])
def test_estimators_match_the_separate_path(tiny_llama, action):
    ids = _prompt(60)
    joint, separate = LMKernelPair(tiny_llama, ids, action), SeparatePair(tiny_llama, ids, action)
    a, b = coupled_rollouts(joint, 8, 7, seed=5), coupled_rollouts(separate, 8, 7, seed=5)
    assert a.mismatch.any()  # the forced path was exercised
    for name in ("x", "y", "mismatch", "tau"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in ("delta", "f", "logp_x", "logq_x", "kl"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=1e-5,
                                   equal_nan=True)
    s, t = swrb(joint, 8, 7, seed=6), swrb(separate, 8, 7, seed=6)
    assert torch.equal(s.J, t.J) and torch.equal(s.mismatch, t.mismatch)
    torch.testing.assert_close(s.weights, t.weights, rtol=0, atol=1e-5)


def test_seeded_records_repeat(tiny_llama):
    pair = LMKernelPair(tiny_llama, _prompt(60), "recent-half")
    a, b = coupled_rollouts(pair, 6, 6, seed=2), coupled_rollouts(pair, 6, 6, seed=2)
    for name in ("x", "y", "delta", "f", "logq_x", "kl"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_advance_many_refuses_bad_calls(tiny_llama):
    pair = LMKernelPair(tiny_llama, _prompt(30), "snapkv-half")
    x = pair.start("p", 2)
    with pytest.raises(ValueError, match="appears twice"):
        pair.advance_many([x, x], [torch.tensor([5, 6])] * 2)
    with pytest.raises(ValueError, match="one token tensor per state"):
        pair.advance_many([x], [])
    with pytest.raises(ValueError, match="one token per row"):
        pair.advance_many([x, pair.start("q", 3)], [torch.tensor([5, 6])] * 2)
    assert pair.advance_many([], []) == []


def test_finite_pair_advances_each_state():
    pair = random_pair(3, 4, seed=1, mix=0.5)
    a, b = pair.start("p", 2), pair.start("q", 1)
    got = pair.advance_many([a, b], [torch.tensor([0, 2]), torch.tensor([1])])
    assert got[0].histories == ((0,), (2,)) and got[1].histories == ((1,),)
    with pytest.raises(ValueError, match="one token tensor per state"):
        pair.advance_many([a], [])
