"""The lost-context attribution where its answer is known.

A tiny Llama is built by hand so that every query of every layer and head attends almost only
to one token, MARK: the queries are a constant bias, and only MARK's embedding reaches the
keys' direction (RoPE is made negligible there with a huge base). Evicting MARK's entry must
rank it first with nearly all of P's attention; keeping it must not list it; a full cache
loses nothing.
"""

from __future__ import annotations

import pytest
import torch

from kvdrift.lm.attribution import divergence_attention, loss_weights, lost_contexts
from kvdrift.lm.pair import LMKernelPair

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
