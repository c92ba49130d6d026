"""The lost-context attribution where its answer is known.

A tiny Llama is built by hand so that every query of every layer and head attends almost only
to one token, MARK: the queries are a constant bias, and only MARK's embedding reaches the
keys' direction (RoPE is made negligible there with a huge base). Evicting MARK's entry must
rank it first with nearly all of P's attention; keeping it must not list it; a full cache
loses nothing.
"""

from __future__ import annotations

import attribution_reference as reference
import pytest
import torch
from messages import whole

from kvdrift.lm.attribution import (
    REPLAY_ROWS,
    divergence_attention,
    loss_weights,
    lost_contexts,
)
from kvdrift.lm.engine import entry_positions
from kvdrift.lm.engine.entry_positions import exact_positions, held_positions
from kvdrift.lm.engine.pair import LMKernelPair

MARK, N, SPOT = 7, 48, 10  # the marked token id, prompt length, MARK's position


@pytest.fixture(scope="module")
def marked_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rope_theta=1e12, attention_bias=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    head_dim = 8
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 0.0  # hidden dimension 0 marks MARK alone
        emb[MARK] = 0.0
        emb[MARK, 0] = 1.0
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_proj.weight.zero_()
            attn.q_proj.bias.zero_()
            attn.k_proj.weight.zero_()
            attn.k_proj.bias.zero_()
            for head in range(4):  # the last pair of each head: the slowest rotation
                attn.q_proj.bias[head * head_dim + head_dim - 1] = 8.0
            for kv in range(2):
                attn.k_proj.weight[kv * head_dim + head_dim - 1, 0] = 8.0
            attn.o_proj.weight.mul_(0.01)  # the residual stream stays the embedding's
            layer.mlp.down_proj.weight.mul_(0.01)
    return model


def _prompt(spot: int = SPOT):
    # distinct tokens: the hand-made keys are zero but at MARK, so only the values (no RoPE)
    # tell entries apart
    gen = torch.Generator().manual_seed(1)
    ids = torch.randperm(54, generator=gen)[:N] + 10
    ids[spot] = MARK
    return ids


def test_an_evicted_token_with_all_the_attention_ranks_first(marked_llama):
    ids = _prompt()
    pair = LMKernelPair(marked_llama, ids, "recent-half")  # keeps 4 sinks and the last ones
    history = torch.tensor([11, 12])  # divergence at tau = 3
    attention, _ = divergence_attention(marked_llama, pair.prompt_cache("p"), ids, [history])
    assert float(attention[0, :, :, SPOT].min()) > 0.95  # by construction, in every layer and head
    w = loss_weights(pair.prompt_cache("p"), pair.prompt_cache("q"))
    assert float(w[:, :, SPOT].min()) == 1.0 and float(w[:, :, -1].max()) == 0.0
    assert int((w == 0).sum(-1).min()) == pair.prompt_cache("q").kept  # kept ones found exactly
    [lost] = lost_contexts(marked_llama, pair.prompt_cache("p"), pair.prompt_cache("q"), ids,
                           [history])
    assert lost.positions[0] == SPOT and lost.shares[0] > 0.95
    assert lost.lost_mass == pytest.approx(sum(lost.shares), abs=0.02) and lost.lost_mass <= 1


def test_a_kept_token_is_not_lost(marked_llama):
    ids = _prompt(N - 5)  # among the recent entries that recent-half keeps
    pair = LMKernelPair(marked_llama, ids, "recent-half")
    [lost] = lost_contexts(marked_llama, pair.prompt_cache("p"), pair.prompt_cache("q"), ids,
                           [torch.tensor([11, 12])])
    assert N - 5 not in lost.positions and lost.lost_mass < 0.05


def test_a_full_cache_loses_nothing(marked_llama):
    ids = _prompt()
    pair = LMKernelPair(marked_llama, ids, "full")
    [lost] = lost_contexts(marked_llama, pair.prompt_cache("p"), pair.prompt_cache("q"), ids,
                           [torch.tensor([11])])
    assert lost.positions == () and lost.lost_mass == 0.0
    w = loss_weights(pair.prompt_cache("p"), pair.prompt_cache("p"))
    assert float(w.abs().max()) == 0.0


def test_the_replay_is_ps_step_at_the_divergence(tiny_llama):
    """Histories of different lengths replayed in one padded batch: each row's weights and
    logits are P's own step after it (the engine's logprobs), the empty history the prefill's."""
    ids = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(2))
    pair = LMKernelPair(tiny_llama, ids, "snapkv-half")
    histories = [torch.tensor([5, 9, 17]), torch.empty(0, dtype=torch.long), torch.tensor([4])]
    weights, logits = divergence_attention(tiny_llama, pair.prompt_cache("p"), ids, histories)
    assert weights.shape == (3, 2, 4, 40)
    for history, row in zip(histories, logits, strict=True):
        state = pair.start("p", 1)
        for token in history:
            state = pair.advance(state, token.reshape(1))
        assert torch.allclose(torch.log_softmax(row.double(), -1), pair.logprobs(state)[0],
                              atol=1e-4)
        alone_w, alone = divergence_attention(tiny_llama, pair.prompt_cache("p"), ids, [history])
        assert torch.allclose(alone[0], row, atol=1e-5)  # the padding of others changes nothing
    assert float(weights.sum(-1).max()) <= 1 + 1e-6
    assert torch.allclose(weights[1].sum(-1), torch.ones(2, 4, dtype=torch.float64))


def test_a_quantized_cache_loses_each_entry_by_its_distortion(tiny_llama):
    """KIVI keeps every entry, quantized but a full-precision tail: each weight is the entry's
    relative distortion, 0 where both key and value are full precision (of 72 entries with
    residual 16: keys 0..63 and values 0..55 are quantized), larger at fewer bits."""
    ids = torch.randint(3, 128, (72,), generator=torch.Generator().manual_seed(3))
    p = LMKernelPair(tiny_llama, ids, "full").prompt_cache("p")
    weights = {}
    for bits in (2, 8):
        q = LMKernelPair(tiny_llama, ids, f"kivi:bits={bits},group=16,residual=16")
        cache = q.prompt_cache("q")
        w = loss_weights(p, cache)
        layer = 0
        entry = torch.cat([p.keys[layer][0], p.values[layer][0]], -1).double()
        held = torch.cat([cache.keys[layer][0], cache.values[layer][0]], -1).double()
        expected = ((held - entry).norm(dim=-1) / entry.norm(dim=-1)).clamp(0, 1)
        assert torch.allclose(w[layer], expected)  # no entry evicted: matched in place
        assert float(w[:, :, 64:].abs().max()) == 0.0 and float(w[:, :, :56].min()) > 0
        weights[bits] = w
    assert float(weights[2].mean()) > 4 * float(weights[8].mean())


# --- the algorithm of issue 45 against the one before it ---------------------------------------


def _close_to_reference(model, ids, action, histories, rows=REPLAY_ROWS):
    """The attribution of ``action`` equals the old algorithm's (tests/attribution_reference.py):
    loss weights exactly, positions identical, masses within 1e-6."""
    pair = LMKernelPair(model, ids, action)
    p, q = pair.prompt_cache("p"), pair.prompt_cache("q")
    assert torch.equal(loss_weights(p, q), reference.loss_weights(p, q))
    new = lost_contexts(model, p, q, ids, histories, rows=rows)
    old = reference.lost_contexts(model, p, q, ids, histories)
    assert [c.positions for c in new] == [c.positions for c in old]
    assert any(c.positions for c in new)  # something was lost and ranked
    for a, b in zip(new, old, strict=True):
        assert a.shares == pytest.approx(b.shares, abs=1e-6, rel=0)
        assert a.lost_mass == pytest.approx(b.lost_mass, abs=1e-6, rel=0)
    return pair


@pytest.mark.parametrize("action", ["snapkv-half", "adakv-snapkv:ratio=0.5",
                                    "kivi:bits=2,group=16,residual=16",
                                    "rerotate-snapkv:ratio=0.5", "pyramidkv:ratio=0.5"])
def test_the_attribution_equals_the_old_algorithm(tiny_llama, action):
    """Kept entries found by their bits (snapkv, pyramidkv's per-layer budgets, adakv's hidden
    entries) and by distance (KIVI's quantized entries, rerotated keys): the same loss weights,
    positions and masses as the [kept, n] distance matrix and the all-query eager replay."""
    ids = torch.randint(3, 128, (160,), generator=torch.Generator().manual_seed(4))
    histories = [torch.randint(3, 128, (k,), generator=torch.Generator().manual_seed(k))
                 for k in (3, 0, 7, 1, 12, 5, 9, 2, 30)]
    pair = _close_to_reference(tiny_llama, ids, action, histories, rows=4)
    p = pair.prompt_cache("p")
    weights, logits = divergence_attention(tiny_llama, p, ids, histories, rows=2)
    old_weights, old_logits = reference.divergence_attention(tiny_llama, p, ids, histories)
    assert weights.shape == old_weights.shape == (9, 2, 4, 160)
    assert torch.allclose(weights, old_weights, atol=1e-5, rtol=0)
    assert torch.allclose(logits, old_logits, atol=1e-4, rtol=0)


def test_a_one_token_prompt_replays_the_history_alone(tiny_llama):
    """No prompt entry precedes the replayed token (the fused kernel is not called on none)."""
    ids = torch.tensor([17])
    pair = LMKernelPair(tiny_llama, ids, "fp8:e4m3")  # quantizes the one entry: not P's cache
    p, q = pair.prompt_cache("p"), pair.prompt_cache("q")
    histories = [torch.tensor([5, 6]), torch.empty(0, dtype=torch.long)]
    new = lost_contexts(tiny_llama, p, q, ids, histories)
    old = reference.lost_contexts(tiny_llama, p, q, ids, histories)
    assert [c.positions for c in new] == [c.positions for c in old] == [(0,), (0,)]
    assert [c.lost_mass for c in new] == pytest.approx([c.lost_mass for c in old], abs=1e-6)


def test_the_replay_takes_a_positive_number_of_rows(tiny_llama):
    ids = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(2))
    pair = LMKernelPair(tiny_llama, ids, "snapkv-half")
    with pytest.raises(ValueError, match=whole("rows must be a positive number of histories "
                                               "per forward; got 0")):
        lost_contexts(tiny_llama, pair.prompt_cache("p"), pair.prompt_cache("q"), ids,
                      [torch.tensor([4])], rows=0)


def _largest_tensor(run) -> int:
    """Bytes of the largest tensor any operator returns while ``run()`` runs."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    largest = [0]

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    largest[0] = max(largest[0], t.numel() * t.element_size())
            return out

    with Largest():
        run()
    return largest[0]


def test_the_attributions_memory_grows_linearly_with_the_prompt(tiny_llama):
    """Doubling the prompt at most doubles the largest tensor the attribution builds (+10%);
    the old algorithm's [kept, n] distance matrix quadruples it (the check can fail)."""
    histories = [torch.randint(3, 128, (k,)) for k in (2, 9, 20)]
    largest = {}
    for n in (300, 600):
        ids = torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(n))
        pair = LMKernelPair(tiny_llama, ids, "snapkv-half")
        p, q = pair.prompt_cache("p"), pair.prompt_cache("q")
        for name, attribute in (("new", lost_contexts), ("old", reference.lost_contexts)):
            largest[name, n] = _largest_tensor(
                lambda f=attribute, p=p, q=q, ids=ids: f(tiny_llama, p, q, ids, histories))
    assert largest["new", 600] <= 2.2 * largest["new", 300]
    assert largest["old", 600] >= 3.5 * largest["old", 300]


# --- Q's entries among P's ---------------------------------------------------------------------


def _entries(n=50, width=8, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, n, width, generator=gen).to(dtype)  # [kv_heads, n, width]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_kept_entries_are_found_by_their_bits(dtype):
    entries = _entries(dtype=dtype)
    kept = torch.stack([torch.randperm(50, generator=torch.Generator().manual_seed(g))[:20]
                        for g in range(2)])  # [kv, 20], in no order, as a press stores them
    held = entries.gather(1, kept[..., None].expand(-1, -1, 8))
    positions, exact = exact_positions(entries, held)
    assert bool(exact.all()) and torch.equal(positions, kept)
    assert torch.equal(held_positions(entries, held), kept)


def test_an_entry_held_twice_is_the_first_and_others_the_nearest(monkeypatch):
    entries = _entries()
    entries[:, 30] = entries[:, 10]  # P holds one entry at two positions: argmin's first
    held = entries[:, [30, 5, 41]].clone()
    held[:, 1] += 1e-3  # no longer bit for bit one of P's: the nearest
    positions, exact = exact_positions(entries, held)
    assert exact[:, 0].all() and not exact[:, 1].any() and exact[:, 2].all()
    assert held_positions(entries, held).tolist() == [[10, 5, 41]] * 2
    # every hash equal (a collision everywhere): confirmed bit for bit, so matched by distance
    monkeypatch.setattr(entry_positions, "_multipliers",
                        lambda width, device: torch.zeros(width, dtype=torch.long))
    assert not exact_positions(entries, held)[1].any()
    assert held_positions(entries, held).tolist() == [[10, 5, 41]] * 2


def test_the_nearest_entries_are_matched_in_bounded_chunks(monkeypatch):
    entries, held = _entries(n=300), _entries(n=70, seed=1)
    whole_matrix = torch.cdist(held, entries).argmin(-1)  # [kv, 70]
    monkeypatch.setattr(entry_positions, "MATCH_DISTANCES", 1000)  # 3 held entries per chunk
    monkeypatch.setattr(entry_positions, "HASH_ENTRIES", 16)
    largest = _largest_tensor(lambda: held_positions(entries, held))
    assert torch.equal(held_positions(entries, held), whole_matrix)
    assert largest < 70 * 300 * 4  # never the whole [held, n] matrix
    with pytest.raises(ValueError, match="must have one dtype and width"):
        exact_positions(entries, held.double())


@pytest.mark.slow
@pytest.mark.parametrize("action", ["snapkv-half", "adakv-snapkv:ratio=0.5"])
def test_the_attribution_on_smollm2_equals_the_old_algorithm(embedded_smollm2, action):
    """On the embedded model: loss weights exactly, positions identical, masses within 1e-6."""
    from kvdrift.lm.loading.model import encode_prompt

    loaded = embedded_smollm2
    text = ("The archive kept one ledger per harbour. The ledger of Ostend recorded the code "
            "VERMILION-42 on the third page, between two cargo lists. ") * 8
    ids = encode_prompt(loaded.tokenizer, text + "What code did the ledger of Ostend record?")
    histories = [torch.tensor(loaded.tokenizer(answer, add_special_tokens=False).input_ids,
                              dtype=torch.long) for answer in
                 ("The code was", "It", "The ledger of Ostend recorded the code")]
    histories.append(torch.empty(0, dtype=torch.long))  # divergence at the first token
    _close_to_reference(loaded, ids[0], action, histories, rows=3)
