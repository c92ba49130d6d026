"""What a long rollout holds does not grow per position beyond its caches (issue 60).

Two mechanisms made a run's resident memory grow with the horizon under a decoding-time press
whose own cache is bounded (docs/long-generations.md): full-cache rows (P's, Q's under a
prefill press, the forced rows) regrew their buffers by copies as they filled, each time
leaving blocks the C allocator could not reuse, and the rollouts kept ~11 small tensors alive
per position for their records. A rollout now allocates its full-cache rows once for the
horizon and writes its records into ``[K, H]`` tensors.
"""

from __future__ import annotations

import gc

import pytest
import torch

from kvdrift.estimate.rollout import coupled_rollouts
from kvdrift.lm.engine.cache import SharedPromptLayer
from kvdrift.lm.engine.pair import LMKernelPair
from tests.test_lm_presses import prompt

N_PROMPT = 40


def buffers(state) -> list[int]:
    """The addresses of a state's generated key and value buffers, per layer."""
    return [t.data_ptr() for layer in state.cache.layers
            for t in (layer._key_buf, layer._value_buf)]


@pytest.mark.parametrize("side", ["p", "q"])
def test_reserved_rows_are_written_in_place_and_compute_the_same(tiny_llama, side):
    steps = 70  # beyond the first spare (32 slots) and two regrowths
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), "knorm:ratio=0.5")
    reserved = pair.start(side, 3, rewind=False, slots=steps)
    grown = pair.start(side, 3, rewind=False)
    first, first_grown, moved = buffers(reserved), buffers(grown), False
    tokens = torch.Generator().manual_seed(0)
    for _ in range(steps):
        tok = torch.randint(3, 128, (3,), generator=tokens)
        reserved, grown = pair.advance(reserved, tok), pair.advance(grown, tok)
        assert buffers(reserved) == first  # never reallocated
        moved |= buffers(grown) != first_grown
        # a reservation changes where entries lie, not what the rows compute
        assert torch.equal(pair.logprobs(reserved), pair.logprobs(grown))
    assert moved  # without a reservation the same rows do regrow (the test can fail)


@pytest.mark.parametrize("spec", ["knorm:ratio=0.5", "decoding-knorm:interval=4,target=30"])
def test_a_rollout_regrows_no_full_cache(tiny_llama, monkeypatch, spec):
    # P along X, Q along Y and the forced rows (joined at each new divergence) keep the
    # reservation: the only buffers made are the two starts' (one per layer each) and, under
    # a decoding press, the compressions' own (a row holding only what the press keeps)
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), spec)
    made: list[int] = []
    rebuffer = SharedPromptLayer._rebuffer

    def counted(self, keys, values, needed, reserve=0):
        made.append(needed)
        rebuffer(self, keys, values, needed, reserve)

    monkeypatch.setattr(SharedPromptLayer, "_rebuffer", counted)
    result = coupled_rollouts(pair, replicates=4, horizon=80, temperature=1.5, seed=1)
    assert bool((result.tau > 0).all())  # every row forked a forced row
    layers = len(pair.prompt_cache("p").keys)
    assert made == [0] * (2 * layers)


def test_rollout_records_hold_no_tensor_per_position(tiny_llama, monkeypatch):
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), "decoding-knorm:interval=4,target=30")
    horizon = 64
    counts: dict[int, int] = {}
    advance_many = pair.advance_many

    calls = iter(range(horizon))

    def counted(states, tokens, **kw):
        t = next(calls)
        if t in (horizon // 2, horizon - 2):  # the tensors alive before these steps
            gc.collect()
            counts[t] = sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects())
        return advance_many(states, tokens, **kw)

    monkeypatch.setattr(pair, "advance_many", counted)
    result = coupled_rollouts(pair, replicates=3, horizon=horizon, temperature=1.5, seed=2)
    assert int(result.tau.max()) < horizon // 2  # the forced rows exist from mid-run on
    # a list of [K] records per quantity would add 11 tensors per position (330 here)
    assert counts[horizon - 2] - counts[horizon // 2] <= 4, counts
