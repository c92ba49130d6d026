"""Shared fixtures: a tiny randomly initialised Llama built in memory (no files, no network)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Before torch starts OpenMP: with the default active spin-wait, each small matmul on a
# 2-vCPU VM can stall ~16 ms waiting for the second thread; passive waiting avoids it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama():
    """A 2-layer Llama (hidden 64, 4 heads, 2 KV heads, vocab 128) in float32 eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.2, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()
