"""Under a decoding-time press a row's first-layer keys and values are the same bits in any
batch (lm/engine/row_invariant.py): a BLAS rounds a row of a matrix product differently in a
batch of one and in a batch of five, and the first layer's exact ties (equal tokens, equal key
norms) then fell another way in a rollout's joint step than in a recomputation."""

from __future__ import annotations

import pytest
import torch

from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.engine.row_invariant import row_invariant_keys
from tests.test_lm_presses import prompt

SPEC = "decoding-knorm:interval=64,target=48"  # no compression within these steps
STEPS = 6


def generated(pair: LMKernelPair, tokens: torch.Tensor, layer: int) -> tuple[torch.Tensor, ...]:
    """Keys and values of the Q rows stepped along ``tokens`` ``[n, STEPS]`` in one batch."""
    state = pair.start("q", tokens.shape[0])
    for t in range(STEPS):
        state = pair.advance(state, tokens[:, t])
    kept = state.cache.layers[layer]
    return kept.keys[:, :, :STEPS].clone(), kept.values[:, :, :STEPS].clone()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_holds_the_same_first_layer_keys_alone_and_in_a_batch(tiny_llama, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        pair = LMKernelPair(tiny_llama, prompt(40), SPEC)
        tokens = torch.randint(3, 128, (5, STEPS), generator=torch.Generator().manual_seed(1))
        keys, values = generated(pair, tokens, 0)
        for i in range(5):
            alone_keys, alone_values = generated(pair, tokens[i:i + 1], 0)
            assert torch.equal(keys[i], alone_keys[0]) and torch.equal(values[i],
                                                                       alone_values[0]), i
    finally:
        torch.set_num_threads(before)


def test_without_it_a_batch_rounds_a_row_otherwise(tiny_llama):
    """The reason for it: the first layer's key projection of one row, alone and in a batch of
    five, differs in the last bits (while row by row it is the same)."""
    attention = tiny_llama.model.layers[0].self_attn
    x = torch.randn(5, 1, tiny_llama.config.hidden_size,
                    generator=torch.Generator().manual_seed(0))
    alone = torch.cat([attention.k_proj(x[i:i + 1]) for i in range(5)])
    with torch.no_grad():
        assert not torch.equal(attention.k_proj(x), alone)
        with row_invariant_keys(attention):
            assert torch.equal(attention.k_proj(x), alone)
