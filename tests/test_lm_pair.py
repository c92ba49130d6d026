"""LMKernelPair: the language-model world behind the KernelPair protocol.

Unit tests run on the tiny in-memory Llama (``tiny_llama`` fixture); tests marked ``slow``
use the embedded SmolLM2 (converted once, then cached).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from kvdrift.kernel import KernelPair
from kvdrift.lm.actions.presses import scorer_classes
from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.engine.prefill import prefill

TOL = 5e-5  # float32 forward passes in different batch layouts (logits are O(10))


def prompt(n: int, seed: int = 0, vocab: int = 128) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, n), generator=gen)  # [1, n]


def random_tokens(rows: int, steps: int, seed: int, vocab: int = 128) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (rows, steps), generator=gen)  # [rows, steps]


def run(pair: LMKernelPair, side: str, tokens: torch.Tensor):
    """A fresh state on ``side`` advanced along ``tokens`` ``[rows, steps]``."""
    state = pair.start(side, tokens.shape[0])
    for t in range(tokens.shape[1]):
        state = pair.advance(state, tokens[:, t])
    return state


def greedy(pair: LMKernelPair, side: str, steps: int) -> list[int]:
    """Greedy tokens with EOS suppressed, as ``generate(min_new_tokens=steps)`` does."""
    state = pair.start(side, 1)
    out = []
    for _ in range(steps):
        logprobs = pair.logprobs(state)
        logprobs[:, pair.eos_token_id] = float("-inf")
        token = logprobs.argmax(-1)
        out.append(int(token))
        state = pair.advance(state, token)
    return out


def generate_greedy(model, ids: torch.Tensor, steps: int, press=None) -> list[int]:
    """kvpress's documented usage: ``with press(model): model.generate(...)``."""
    ctx = press(model) if press is not None else contextlib.nullcontext()
    with ctx, torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=steps, min_new_tokens=steps)
    return out[0, ids.shape[1]:].tolist()


# --- protocol and properties ---------------------------------------------------------------


def test_implements_protocol(tiny_llama):
    pair = LMKernelPair(tiny_llama, prompt(30), "snapkv-half")
    assert isinstance(pair, KernelPair)
    assert pair.vocab_size == 128
    assert pair.eos_token_id == 2
    assert pair.device == torch.device("cpu")
    lp = pair.logprobs(pair.start("q", 3))
    assert lp.shape == (3, 128) and lp.dtype == torch.float64
    assert torch.allclose(lp.exp().sum(-1), torch.ones(3, dtype=torch.float64))


# --- retention counts ----------------------------------------------------------------------


EXPECTED_KEPT = {
    "snapkv-half": lambda n: max(1, n // 2),
    "snapkv-90": lambda n: max(1, 9 * n // 10),
    "snapkv-512": lambda n: min(512, n),
    "recent-half": lambda n: max(1, n // 2),
    "recent-90": lambda n: max(1, 9 * n // 10),
    "full": lambda n: n,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_KEPT))
@pytest.mark.parametrize("n", [1, 2, 5, 40, 64, 65, 130, 600])
def test_compressed_cache_keeps_exact_budget(tiny_llama, name, n):
    pair = LMKernelPair(tiny_llama, prompt(n, seed=n), name)
    kept = EXPECTED_KEPT[name](n)
    q = pair.prompt_cache("q")
    for keys, values in zip(q.keys, q.values, strict=True):
        assert keys.shape == (1, 2, kept, 16)  # [1, kv_heads, kept, head_dim] in every layer
        assert values.shape == (1, 2, kept, 16)
    assert pair.prompt_cache("p").kept == n
    if kept == n:  # a budget >= n never runs the press: bit-identical to full
        assert q is pair.prompt_cache("p")


@pytest.mark.parametrize("press", sorted(scorer_classes()))
@pytest.mark.parametrize("rule,n", [("budget=7", 10), ("ratio=0.3", 100), ("budget=1", 3)])
def test_every_registered_press_keeps_exact_budget(tiny_llama, press, rule, n):
    action = parse_action(f"{press}:{rule}")
    pair = LMKernelPair(tiny_llama, prompt(n, seed=1), action)
    assert {k.shape[2] for k in pair.prompt_cache("q").keys} == {action.kept(n)}


def test_recent_keeps_sinks_and_most_recent(tiny_llama):
    n = 100
    pair = LMKernelPair(tiny_llama, prompt(n), "recent-half")
    p, q = pair.prompt_cache("p"), pair.prompt_cache("q")
    expected = torch.cat([torch.arange(4), torch.arange(n - 46, n)])
    for pk, qk in zip(p.keys, q.keys, strict=True):
        # position of each kept key in the full cache, per KV head (kvpress may permute them)
        match = (qk[:, :, :, None, :] == pk[:, :, None, :, :]).all(-1)  # [1, heads, kept, n]
        assert bool((match.sum(-1) == 1).all())
        positions = match.float().argmax(-1).sort(-1).values  # [1, heads, kept]
        assert torch.equal(positions[0, 0], expected) and torch.equal(positions[0, 1], expected)


def test_observed_attention_switches_to_eager_only_for_prefill(tiny_llama):
    pair = LMKernelPair(tiny_llama, prompt(50), "observed_attention:ratio=0.5")
    assert pair.prompt_cache("q").kept == 25
    assert tiny_llama.config._attn_implementation == "sdpa"


# --- control and first step ----------------------------------------------------------------


def test_full_action_q_equals_p_exactly(tiny_llama):
    pair = LMKernelPair(tiny_llama, prompt(80), "full")
    assert pair.q_is_p
    tokens = random_tokens(4, 8, seed=3)
    p, q = pair.start("p", 4), pair.start("q", 4)
    for t in range(tokens.shape[1]):
        assert torch.equal(pair.logprobs(p), pair.logprobs(q))  # delta_t = 0 exactly
        p, q = pair.advance(p, tokens[:, t]), pair.advance(q, tokens[:, t])
    assert torch.equal(pair.logprobs(p), pair.logprobs(q))


def test_full_action_across_batch_shapes_is_equal_to_float_noise(tiny_llama):
    # P with K rows and Q with 2K rows run kernels of different batch shapes: exact equality
    # is then up to the BLAS/attention kernels; only float noise may separate them.
    pair = LMKernelPair(tiny_llama, prompt(80), "full")
    tokens = random_tokens(4, 6, seed=4)
    p = run(pair, "p", tokens)
    q = run(pair, "q", torch.cat([tokens, tokens]))
    lp, lq = pair.logprobs(p), pair.logprobs(q)
    assert (lp - lq[:4]).abs().max() < 1e-4 and (lp - lq[4:]).abs().max() < 1e-4


@pytest.mark.parametrize("name", ["snapkv-half", "snapkv-90", "recent-half", "recent-90",
                                  "knorm:ratio=0.3", "tova:budget=10"])
def test_first_step_identical_then_eviction_shows(tiny_llama, name):
    pair = LMKernelPair(tiny_llama, prompt(100), name)
    assert not pair.q_is_p
    assert torch.equal(pair.logprobs(pair.start("p", 2)), pair.logprobs(pair.start("q", 2)))
    tokens = random_tokens(2, 3, seed=5)
    lp, lq = pair.logprobs(run(pair, "p", tokens)), pair.logprobs(run(pair, "q", tokens))
    assert (lp - lq).abs().max() > 1e-3  # the evicted cache matters after the first step


def test_shared_reference_prefill(tiny_llama):
    ids = prompt(70)
    reference = prefill(tiny_llama, ids)
    shared = LMKernelPair(tiny_llama, ids, "snapkv-half", reference=reference)
    own = LMKernelPair(tiny_llama, ids, "snapkv-half")
    tokens = random_tokens(2, 4, seed=6)
    for side in ("p", "q"):
        assert torch.equal(pair_lp(shared, side, tokens), pair_lp(own, side, tokens))
    with pytest.raises(ValueError, match="full cache"):
        LMKernelPair(tiny_llama, prompt(71), "snapkv-half", reference=reference)


def pair_lp(pair: LMKernelPair, side: str, tokens: torch.Tensor) -> torch.Tensor:
    return pair.logprobs(run(pair, side, tokens))


# --- greedy equivalence with model.generate ------------------------------------------------


@pytest.mark.parametrize("name", ["snapkv-half", "recent-half", "knorm:ratio=0.3", "snapkv-90"])
def test_greedy_matches_generate(tiny_llama, name):
    ids = prompt(100, seed=2)
    pair = LMKernelPair(tiny_llama, ids, name)
    steps = 12
    assert greedy(pair, "p", steps) == generate_greedy(tiny_llama, ids, steps)
    press = pair.action.make_press(ids.shape[1])
    assert greedy(pair, "q", steps) == generate_greedy(tiny_llama, ids, steps, press)


# --- truncate, select, batching --------------------------------------------------------------


@pytest.mark.parametrize("side", ["p", "q"])
def test_truncate_matches_fresh_prefix_and_continues(tiny_llama, side):
    pair = LMKernelPair(tiny_llama, prompt(90), "snapkv-half")
    tokens = random_tokens(5, 10, seed=7)
    state = run(pair, side, tokens)
    lengths = torch.tensor([0, 3, 7, 10, 1])
    state = pair.truncate(state, lengths)
    lp = pair.logprobs(state)
    for i, length in enumerate(lengths.tolist()):
        fresh = pair.logprobs(run(pair, side, tokens[i:i + 1, :length]))
        assert torch.allclose(lp[i], fresh[0], atol=TOL, rtol=0), i
    more = random_tokens(5, 3, seed=8)
    for t in range(3):
        state = pair.advance(state, more[:, t])
    lp = pair.logprobs(state)
    for i, length in enumerate(lengths.tolist()):
        history = torch.cat([tokens[i, :length], more[i]])[None]
        fresh = pair.logprobs(run(pair, side, history))
        assert torch.allclose(lp[i], fresh[0], atol=TOL, rtol=0), i


def test_branching_from_a_shared_scanned_prefix(tiny_llama):
    # SWRB: scan one prefix, replicate it, branch row i at its own J_i, continue each branch.
    pair = LMKernelPair(tiny_llama, prompt(90), "snapkv-half")
    prefix = random_tokens(1, 8, seed=17)
    for side in ("p", "q"):
        scanned = run(pair, side, prefix)
        branches = pair.truncate(pair.select(scanned, torch.tensor([0, 0, 0, 0])),
                                 torch.tensor([2, 7, 0, 8]))
        residual = torch.tensor([5, 6, 7, 8])
        branches = pair.advance(branches, residual)
        lp = pair.logprobs(branches)
        for i, j in enumerate([2, 7, 0, 8]):
            history = torch.cat([prefix[0, :j], residual[i:i + 1]])[None]
            fresh = pair.logprobs(run(pair, side, history))
            assert torch.allclose(lp[i], fresh[0], atol=TOL, rtol=0), (side, i)


def test_truncate_twice_and_to_full_length(tiny_llama):
    pair = LMKernelPair(tiny_llama, prompt(60), "recent-half")
    tokens = random_tokens(3, 8, seed=9)
    state = pair.truncate(run(pair, "q", tokens), torch.tensor([5, 8, 2]))
    more = random_tokens(3, 2, seed=10)
    for t in range(2):
        state = pair.advance(state, more[:, t])
    state = pair.truncate(state, torch.tensor([6, 3, 4]))  # cuts into old and new tokens
    lp = pair.logprobs(state)
    histories = [torch.cat([tokens[i, :k], more[i]]) for i, k in enumerate([5, 8, 2])]
    for i, length in enumerate([6, 3, 4]):
        fresh = pair.logprobs(run(pair, "q", histories[i][None, :length]))
        assert torch.allclose(lp[i], fresh[0], atol=TOL, rtol=0), i


def test_truncate_rejects_bad_lengths(tiny_llama):
    pair = LMKernelPair(tiny_llama, prompt(20), "full")
    state = run(pair, "p", random_tokens(2, 3, seed=11))
    with pytest.raises(ValueError, match="current length"):
        pair.truncate(state, torch.tensor([4, 1]))
    with pytest.raises(ValueError, match="one entry per row"):
        pair.truncate(state, torch.tensor([1]))


def test_select_and_batched_rows_match_single_rows(tiny_llama):
    pair = LMKernelPair(tiny_llama, prompt(70), "snapkv-half")
    tokens = random_tokens(4, 5, seed=12)
    state = run(pair, "q", tokens)
    lp = pair.logprobs(state)
    for i in range(4):
        single = pair.logprobs(run(pair, "q", tokens[i:i + 1]))
        assert torch.allclose(lp[i], single[0], atol=TOL, rtol=0)
    picked = pair.select(state, torch.tensor([3, 0, 0]))
    assert torch.equal(pair.logprobs(picked), lp[[3, 0, 0]])
    nxt = torch.tensor([1, 2, 3])
    picked = pair.advance(picked, nxt)
    for row, (i, token) in enumerate(zip([3, 0, 0], nxt.tolist(), strict=True)):
        history = torch.cat([tokens[i], torch.tensor([token])])[None]
        assert torch.allclose(pair.logprobs(picked)[row],
                              pair.logprobs(run(pair, "q", history))[0], atol=TOL, rtol=0)


def test_q_batch_of_two_histories(tiny_llama):
    # The estimator advances one Q state with rows [Y; X]: each half matches its own run.
    pair = LMKernelPair(tiny_llama, prompt(80), "snapkv-half")
    x, y = random_tokens(3, 6, seed=13), random_tokens(3, 6, seed=14)
    both = pair.logprobs(run(pair, "q", torch.cat([y, x])))
    assert torch.allclose(both[:3], pair.logprobs(run(pair, "q", y)), atol=TOL, rtol=0)
    assert torch.allclose(both[3:], pair.logprobs(run(pair, "q", x)), atol=TOL, rtol=0)


def test_long_generation_grows_cache_buffers(tiny_llama):
    pair = LMKernelPair(tiny_llama, prompt(20), "snapkv-half")
    tokens = random_tokens(2, 80, seed=15)  # more than the initial spare capacity
    lp = pair.logprobs(run(pair, "q", tokens))
    single = pair.logprobs(run(pair, "q", tokens[1:]))
    assert torch.allclose(lp[1], single[0], atol=TOL, rtol=0)


# --- misuse ----------------------------------------------------------------------------------


def test_bad_inputs(tiny_llama):
    with pytest.raises(ValueError, match=r"^action must be one of full, snapkv-half, .*; "
                                         r"got 'snapkv-third'$"):
        LMKernelPair(tiny_llama, prompt(20), "snapkv-third")
    with pytest.raises(ValueError, match="empty"):
        LMKernelPair(tiny_llama, torch.zeros(1, 0, dtype=torch.long), "full")
    pair = LMKernelPair(tiny_llama, prompt(20), "snapkv-half")
    with pytest.raises(ValueError, match="side"):
        pair.start("r", 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rows"):
        pair.start("p", 0)
    state = pair.start("q", 2)
    with pytest.raises(ValueError, match="one token per row"):
        pair.advance(state, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="tokens must be in"):
        pair.advance(state, torch.tensor([1, 128]))
    with pytest.raises(ValueError, match="rows must be in"):
        pair.select(state, torch.tensor([2]))
    new = pair.advance(state, torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="consumed"):
        pair.advance(state, torch.tensor([1, 2]))  # the old state's storage was reused
    assert new.n == 2


# --- SmolLM2 integration (slow) --------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(embedded_smollm2):
    return embedded_smollm2


@pytest.fixture(scope="module")
def smollm2_prompt(smollm2):
    from kvdrift.lm.loading.model import encode_prompt

    text = ("The printing press spread across Europe within decades. Printers moved from city "
            "to city, carrying type, presses and skills; books became cheaper and more "
            "plentiful, and readers multiplied. ") * 5
    text += "Summarise the text above in two sentences."
    ids = encode_prompt(smollm2.tokenizer, text)
    assert 150 <= ids.shape[1] <= 260
    return ids


@pytest.mark.slow
def test_smollm2_greedy_matches_generate(smollm2, smollm2_prompt):
    pair = LMKernelPair(smollm2, smollm2_prompt, "snapkv-half")
    n = smollm2_prompt.shape[1]
    assert {k.shape for k in pair.prompt_cache("q").keys} == {(1, 3, n // 2, 64)}
    steps = 104  # past the generated buffers' regrowth (32 spare slots, then 64) on both sides
    p_tokens = greedy(pair, "p", steps)
    q_tokens = greedy(pair, "q", steps)
    assert p_tokens == generate_greedy(smollm2.model, smollm2_prompt, steps)
    press = pair.action.make_press(n)
    assert q_tokens == generate_greedy(smollm2.model, smollm2_prompt, steps, press)
    assert pair.eos_token_id == smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.slow
def test_smollm2_control_and_truncate(smollm2, smollm2_prompt):
    full = LMKernelPair(smollm2, smollm2_prompt, "snapkv-512")  # n < 512: a no-op
    assert full.prompt_cache("q") is full.prompt_cache("p")
    tokens = random_tokens(4, 4, seed=16, vocab=full.vocab_size)
    assert torch.equal(pair_lp(full, "p", tokens), pair_lp(full, "q", tokens))
    pair = LMKernelPair(smollm2, smollm2_prompt, "recent-half", reference=full.prompt_cache("p"))
    assert torch.equal(pair.logprobs(pair.start("p", 1)), pair.logprobs(pair.start("q", 1)))
    state = pair.truncate(run(pair, "q", tokens), torch.tensor([0, 1, 2, 4]))
    lp = pair.logprobs(state)
    for i, length in enumerate([0, 1, 2, 4]):
        fresh = pair.logprobs(run(pair, "q", tokens[i:i + 1, :length]))
        assert torch.allclose(lp[i], fresh[0], atol=1e-4, rtol=0), i
