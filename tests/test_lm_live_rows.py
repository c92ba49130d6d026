"""Rows that hold only their live entries under a decoding-time press (``rewind=False``).

Such a row keeps what kvpress's cache keeps: greedy Y equals ``generate`` inside the press over
many compressions, every position's log-probabilities equal the rewindable (every slot kept and
masked) state's to float32 noise, forks and joins keep each row's compressions, and the
generated slots a state holds stay at ``target + interval`` whatever the horizon.
"""

from __future__ import annotations

import pytest
import torch

from kvdrift.estimate.rollout import coupled_rollouts
from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.live_rows import LiveRows
from kvdrift.lm.engine.pair import LMKernelPair
from tests.test_lm_presses import LOGPROB_TOL, greedy_generate, prompt

N_PROMPT = 60
SPECS = [
    "decoding-knorm:interval=4,target=40",  # the first compression cuts into the prompt
    "decoding-knorm:interval=5,target=1",  # every step, one entry kept
    "snapkv:ratio=0.5+decoding-knorm:interval=5,target=24",
    "decoding-snapkv:interval=6,target=30,window_size=2,buffer=8",  # pools over cache order
    "decoding-recent:interval=3,target=20",  # keeps the first entries of the cache order
    "decoding-tova:interval=6,target=30",
    "decoding-knorm:interval=2,target=200",  # never above target: nothing evicted
]


def greedy_live(pair: LMKernelPair, steps: int) -> tuple[list[int], torch.Tensor, list[int]]:
    """Greedy Y on a state holding only its live entries, EOS never chosen (as generate's
    ``min_new_tokens``); also its generated slots per step."""
    state = pair.start("q", 1, rewind=False)
    tokens, lps, slots = [], [], []
    for _ in range(steps):
        lp = pair.logprobs(state)[0]
        tokens.append(int(lp.index_fill(0, torch.tensor([pair.eos_token_id]), -torch.inf)
                          .argmax()))
        lps.append(lp)
        state = pair.advance(state, torch.tensor([tokens[-1]]))
        slots.append(state.cache.get_seq_length())
    return tokens, torch.stack(lps), slots


@pytest.mark.parametrize("spec", SPECS)
def test_live_rows_equal_generate(tiny_llama, spec):
    steps = 40
    action = parse_action(spec)
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), action)
    tokens, lps, slots = greedy_live(pair, steps)
    want, want_lps = greedy_generate(tiny_llama, prompt(N_PROMPT), action.make_press(N_PROMPT),
                                     steps, action.needs_attention_weights)
    assert tokens == want
    assert float((lps - want_lps).abs().max()) < LOGPROB_TOL
    rule = pair._rule
    # after the first compression the row holds at most target + interval - 1 slots
    first = rule.interval
    assert max(slots[first:]) <= max(rule.target, 1) + rule.interval - 1, slots


@pytest.mark.parametrize("spec", SPECS[:4])
def test_live_rows_equal_rewindable_rows_along_a_batch(tiny_llama, spec):
    # two rows along different histories: the compacted state and the masked one agree at
    # every position to float32 noise
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), spec)
    xs = torch.cat([prompt(30, seed=4), prompt(30, seed=5)])
    live, masked = pair.start("q", 2, rewind=False), pair.start("q", 2)
    assert isinstance(live.evictions, LiveRows)
    for t in range(30):
        assert torch.allclose(pair.logprobs(live), pair.logprobs(masked), atol=LOGPROB_TOL)
        live = pair.advance(live, xs[:, t])
        masked = pair.advance(masked, xs[:, t])
    assert torch.allclose(pair.logprobs(live), pair.logprobs(masked), atol=LOGPROB_TOL)
    # the masked state holds every slot ever written, the compacted one what the press keeps
    rule = pair._rule
    assert masked.cache.get_seq_length() == 30
    assert live.cache.get_seq_length() == max(rule.target, 1) + 30 % rule.interval


def test_slots_stay_bounded_over_a_long_horizon(tiny_llama):
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), "decoding-knorm:interval=8,target=16")
    state = pair.start("q", 2, rewind=False)
    xs = prompt(200, seed=9)[0]
    held = []
    for t in range(200):
        state = pair.advance(state, torch.stack([xs[t], xs[199 - t]]))
        held.append(state.cache.get_seq_length())
        capacity = state.cache.layers[0].capacity
        assert capacity <= 16 + 8 + 32, capacity  # target + interval + MIN_SPARE
    # exactly target right after a compression, one more slot per step until the next
    assert held[7::8] == [16] * 25
    assert held[8:15] == list(range(17, 24))
    assert not state.evictions.prompt_read


def test_join_select_and_truncate_after_the_last_compression(tiny_llama):
    spec = "decoding-recent:interval=3,target=20"
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), spec)
    xs = prompt(14, seed=21)[0]
    long, short = pair.start("q", 1, rewind=False), pair.start("q", 1, rewind=False)
    ref_long, ref_short = pair.start("q", 1), pair.start("q", 1)
    for t in range(7):
        long, ref_long = pair.advance(long, xs[t:t + 1]), pair.advance(ref_long, xs[t:t + 1])
    short, ref_short = pair.advance(short, xs[:1]), pair.advance(ref_short, xs[:1])
    both = pair.join([long, short])  # one row past two compressions, one before any
    for t in range(7, 14):
        both = pair.advance(both, torch.stack([xs[t], xs[t - 6]]))
        ref_long = pair.advance(ref_long, xs[t:t + 1])
        ref_short = pair.advance(ref_short, xs[t - 6:t - 5])
    lps = pair.logprobs(both)
    assert torch.allclose(lps[0], pair.logprobs(ref_long)[0], atol=LOGPROB_TOL)
    assert torch.allclose(lps[1], pair.logprobs(ref_short)[0], atol=LOGPROB_TOL)
    # lengths 14 (last compression at 12) and 8 (at 6): row 1 may go back to 7 (after 6)
    fork = pair.select(both, torch.tensor([1]))
    cut = pair.truncate(fork, torch.tensor([7]))
    ref_cut = pair.truncate(pair.select(ref_short, torch.tensor([0])), torch.tensor([7]))
    assert torch.allclose(pair.logprobs(cut), pair.logprobs(ref_cut), atol=LOGPROB_TOL)
    again = pair.advance(cut, xs[9:10])
    ref_again = pair.advance(ref_cut, xs[9:10])
    assert torch.allclose(pair.logprobs(again), pair.logprobs(ref_again), atol=LOGPROB_TOL)
    with pytest.raises(ValueError, match="row 0 cannot go back to length 6: .* last "
                                         "compression was at length 6; .*rewind=True"):
        pair.truncate(pair.select(both, torch.tensor([1])), torch.tensor([6]))
    # a row not compressed yet may go back anywhere, to the empty history included
    fresh = pair.start("q", 2, rewind=False)
    for t in range(2):
        fresh = pair.advance(fresh, torch.stack([xs[t], xs[t + 1]]))
    back = pair.truncate(fresh, torch.tensor([0, 1]))
    want = pair.start("q", 2, rewind=False)
    assert torch.equal(pair.logprobs(back)[0], pair.logprobs(want)[0])
    want = pair.advance(want, torch.stack([xs[0], xs[1]]))
    assert torch.allclose(pair.logprobs(back)[1], pair.logprobs(want)[1], atol=LOGPROB_TOL)
    with pytest.raises(ValueError, match="cannot join states started with rewind"):
        pair.join([pair.select(both, torch.tensor([0])), ref_long])


def test_rollouts_hold_only_live_entries_and_match_rewindable_ones(tiny_llama, monkeypatch):
    # the rollout starts its states with rewind=False; forcing rewind=True (every slot kept)
    # gives the same paths and per-step TVs to float32 noise
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), "decoding-knorm:interval=4,target=30")
    live = coupled_rollouts(pair, replicates=6, horizon=24, seed=3)
    start = LMKernelPair.start
    monkeypatch.setattr(LMKernelPair, "start",
                        lambda self, side, n, rewind=True, slots=0: start(self, side, n,
                                                                         slots=slots))
    masked = coupled_rollouts(pair, replicates=6, horizon=24, seed=3)
    assert torch.equal(live.x, masked.x) and torch.equal(live.y, masked.y)
    assert torch.allclose(live.f, masked.f, atol=1e-5)
    assert torch.allclose(live.delta, masked.delta, atol=1e-5)


def test_live_rows_equal_generate_over_256_positions(tiny_llama):
    # eight compressions, each cutting 32 generated entries; the row never holds more than
    # target + interval - 1 = 79 slots while generate's cache is what kvpress keeps
    spec = "decoding-knorm:interval=32,target=48"
    action = parse_action(spec)
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), action)
    tokens, lps, slots = greedy_live(pair, 256)
    want, want_lps = greedy_generate(tiny_llama, prompt(N_PROMPT), action.make_press(N_PROMPT),
                                     256, False)
    assert tokens == want
    assert float((lps - want_lps).abs().max()) < LOGPROB_TOL
    assert max(slots[32:]) == 79 and slots[31::32] == [48] * 8


def test_unreached_target_gives_tv_exactly_zero(tiny_llama):
    # fewer live entries than the target: a compression evicts nothing, the row goes on
    # reading the shared prompt as P's rows do, so delta_t is exactly 0 at every position
    pair = LMKernelPair(tiny_llama, prompt(N_PROMPT), "decoding-knorm:interval=2,target=500")
    p, q = pair.start("p", 1, rewind=False), pair.start("q", 1, rewind=False)
    for tok in prompt(12, seed=5)[0].tolist():
        assert torch.equal(pair.logprobs(p), pair.logprobs(q))
        p, q = pair.advance(p, torch.tensor([tok])), pair.advance(q, torch.tensor([tok]))
    assert torch.equal(pair.logprobs(p), pair.logprobs(q))
    assert q.evictions.prompt_read and q.cache.get_seq_length() == 12


def test_a_users_decoding_press_object_holds_only_live_entries(tiny_llama):
    # the general path (a press object): a PrefillDecodingPress with a user's DecodingPress
    # subclass, Q's rows started with rewind=False, equals generate inside the same press
    import kvpress

    from tests.test_lm_press_path import EOS, EveryFewTokensPress, general_pair, generate_in

    def make():
        return kvpress.PrefillDecodingPress(
            prefilling_press=kvpress.KnormPress(compression_ratio=0.5),
            decoding_press=EveryFewTokensPress(base_press=kvpress.KnormPress(),
                                               compression_interval=4, target_size=20))
    ids = prompt(60)
    pair = general_pair(tiny_llama, ids, make())
    state, tokens = pair.start("q", 1, rewind=False), []
    for _ in range(24):
        lp = pair.logprobs(state)[0].clone()
        lp[EOS] = -torch.inf
        tokens.append(int(lp.argmax()))
        state = pair.advance(state, torch.tensor([tokens[-1]]))
    assert isinstance(state.evictions, LiveRows)
    assert state.cache.get_seq_length() == 20  # 24 steps: compressed at 24 to the target
    assert tokens == generate_in(tiny_llama, ids, make(), 24)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["decoding-knorm:interval=16,target=96",
                                  "snapkv:ratio=0.6+decoding-snapkv:interval=16,target=64,"
                                  "window_size=4,buffer=32"])
def test_smollm2_live_rows_equal_generate(embedded_smollm2, spec):
    # the embedded model, 64 greedy steps, four compressions that cut into the prompt's and
    # the generated entries
    from kvdrift.lm.loading.model import encode_prompt, load_tokenizer

    model = embedded_smollm2.model
    text = ("Rivers carve valleys over millennia; glaciers widen them, and the sea floods "
            "their mouths when the ice melts. ") * 6 + "Explain how a fjord forms."
    ids = encode_prompt(load_tokenizer("smollm2"), text)
    action = parse_action(spec)
    pair = LMKernelPair(model, ids, action)
    tokens, lps, slots = greedy_live(pair, 64)
    want, want_lps = greedy_generate(model, ids, action.make_press(ids.shape[1]), 64, False)
    assert tokens == want
    assert float((lps - want_lps).abs().max()) < LOGPROB_TOL
    assert slots[15::16] == [pair._rule.target] * 4
