"""Q's cache over a generation (records/generation.py): entries per position, the positions a
decoding-time compression first shows in, and the bytes averaged over the generation; checked
by hand and against the engine (where Q first parts from P under a decoding-only press)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvdrift.coupling import tv_distance
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.records.generation import (
    Schedule,
    compression_positions,
    generation_memory,
    live_entries,
)
from kvdrift.run.runner import pair_generation

N_TINY = 60


def test_live_entries_by_hand():
    # prompt 10, target 8, interval 3: position t reads 10 + t - 1 until the compression at
    # length 3 (after position 4's forward); position 5 reads 8 + 1, ...
    counts, fresh = live_entries(10, 12, Schedule.every(8, 3, 100))
    assert counts.tolist() == [10, 11, 12, 13, 9, 10, 11, 9, 10, 11, 9, 10]
    assert np.flatnonzero(fresh).tolist() == [4, 7, 10]  # positions 5, 8, 11 (0-based + 1)
    assert compression_positions([10], 12, Schedule.every(8, 3, 100)) == (5, 8, 11)


def test_every_step_compression_is_seen_though_the_count_stays():
    # interval 1 at target 5 from a prompt of 5: each step writes one and evicts one, so the
    # count never drops, yet every position from 3 on reads a freshly compressed cache
    counts, _ = live_entries(5, 6, Schedule.every(5, 1, 100))
    assert counts.tolist() == [5, 6, 6, 6, 6, 6]
    assert compression_positions([5], 6, Schedule.every(5, 1, 100)) == (3, 4, 5, 6)


def test_no_compression_while_the_target_holds_everything():
    assert compression_positions([10], 20, Schedule.every(100, 4, 100)) == ()
    assert compression_positions([10], 20, None) == ()
    # per layer: a layer that kept fewer prompt entries compresses later
    assert compression_positions([10, 2], 12, Schedule.every(8, 3, 100)) == (5, 8, 11)
    # 2 + 3 and 2 + 6 entries fit the target 8 (kept, not more than it); 2 + 9 do not
    assert compression_positions([2], 12, Schedule.every(8, 3, 100)) == (11,)


def test_generation_memory_by_hand():
    # two layers of 4 bytes per entry, prompt of 10 kept whole, H = 4, no compression
    m = generation_memory([10, 10], [4.0, 4.0], prompt_bytes=80.0, n_prompt=10, horizon=4,
                          schedule=None)
    assert m.kv_bytes == pytest.approx(8 * (10 + 1.5))  # 8 bytes per position per entry
    assert m.kv_fraction == pytest.approx(1.0)
    assert m.compressions == ()
    # a prefill eviction to 5 entries (prompt bytes 40): (5 + 1.5) / (10 + 1.5)
    m = generation_memory([5, 5], [4.0, 4.0], 40.0, 10, 4, None)
    assert m.kv_fraction == pytest.approx(6.5 / 11.5)
    # decoding: target 8, interval 3, H = 6, prompt 10 whole: counts 10 11 12 13 9 10
    m = generation_memory([10], [2.0], 20.0, 10, 6, Schedule.every(8, 3, 100))
    assert m.kv_bytes == pytest.approx(2.0 * np.mean([10, 11, 12, 13, 9, 10]))
    assert m.kv_fraction == pytest.approx(np.mean([10, 11, 12, 13, 9, 10]) / 12.5)
    assert m.compressions == (5,)


def test_generation_memory_refuses_mismatched_layers():
    with pytest.raises(ValueError, match="same layers"):
        generation_memory([1, 2], [4.0], 8.0, 10, 4, None)


def tv_along(pair: LMKernelPair, history: list[int]) -> list[float]:
    p, q = pair.start("p", 1), pair.start("q", 1)
    out = []
    for token in history:
        out.append(float(tv_distance(pair.logprobs(p).exp(), pair.logprobs(q).exp())[0]))
        tok = torch.tensor([token])
        p, q = pair.advance(p, tok), pair.advance(q, tok)
    return out


@pytest.mark.parametrize("spec", ["decoding-knorm:interval=4,target=62",
                                  "decoding-knorm:interval=3,target=40",
                                  "decoding-knorm:interval=5,target=1"])
def test_derived_compressions_are_where_the_engine_parts_from_p(tiny_llama, spec):
    """Under a decoding-only press Q is P until its first compression: TV is exactly 0 before
    the first derived position and not after it (the engine, not the derivation, decides)."""
    ids = torch.randint(3, 128, (1, N_TINY), generator=torch.Generator().manual_seed(0))
    pair = LMKernelPair(tiny_llama, ids, spec)
    H = 16
    derived = pair_generation(pair, H)
    first = derived.compressions[0]
    history = torch.randint(3, 128, (H,), generator=torch.Generator().manual_seed(1)).tolist()
    tv = tv_along(pair, history)
    assert tv[:first - 1] == [0.0] * (first - 1)
    assert tv[first - 1] > 1e-4, (spec, derived.compressions, tv)
    assert derived.kv_fraction < 1.0


def test_pair_generation_without_a_decoding_press(tiny_llama):
    ids = torch.randint(3, 128, (1, N_TINY), generator=torch.Generator().manual_seed(0))
    full = pair_generation(LMKernelPair(tiny_llama, ids, "full"), 8)
    assert full.compressions == ()
    assert full.kv_fraction == pytest.approx(1.0)
    half = pair_generation(LMKernelPair(tiny_llama, ids, "knorm:ratio=0.5"), 8)
    assert half.compressions == ()
    assert half.kv_fraction == pytest.approx((30 + 3.5) / (60 + 3.5))


def test_a_rule_without_a_fixed_target_and_interval_derives_nothing():
    class RatioRule:  # e.g. a press compressing to a ratio of the growing cache
        interval = 64

        @property
        def target(self):
            raise AttributeError("no fixed target")

    class Pair:
        decoding_rule = RatioRule()

    out = pair_generation(Pair(), 256)
    assert np.isnan(out.kv_bytes) and np.isnan(out.kv_fraction) and out.compressions == ()
