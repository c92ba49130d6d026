"""Sliding-window models (Gemma 3) are refused before any unit runs, with the precise reason
and what would make them work; fully attending models are not."""

from __future__ import annotations

import pytest
import torch


def test_gemma3_is_refused_with_the_reason(tmp_path):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    import kvdrift
    from kvdrift.data.document import Document
    from kvdrift.data.loaders import write_jsonl
    from kvdrift.lm.loading.model import load_tokenizer

    config = Gemma3TextConfig(vocab_size=49152, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=8, sliding_window=16, max_position_embeddings=4096,
                              layer_types=["sliding_attention", "sliding_attention",
                                           "full_attention"])
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    docs = write_jsonl([Document("d0", "The cat sat on the mat. " * 10)], tmp_path / "d.jsonl")
    with pytest.raises(ValueError) as info:
        kvdrift.measure(kvdrift.Model(model, load_tokenizer("smollm2"), "gemma"),
                        ("snapkv-half",), docs, tmp_path / "run", replicates=1, horizon=2)
    message = str(info.value)
    assert "\n" not in message
    assert "gemma (gemma3_text) has 2 of 3 layers with sliding-window attention (window 16)" \
        in message
    assert "a window mask per sliding layer" in message
    assert not (tmp_path / "run" / "run.json").exists()  # refused before anything is written


def test_fully_attending_configs_pass():
    from transformers import LlamaConfig, Qwen2Config

    from kvdrift.lm.loading.model import sliding_window_refusal

    assert sliding_window_refusal(LlamaConfig()) is None
    assert sliding_window_refusal(Qwen2Config()) is None


def test_a_window_on_every_layer_bounds_the_prompt(tmp_path):
    """Mistral v0.1 applies one sliding window on every layer: kvdrift measures it exactly
    while prompt plus H fit in the window, and refuses a longer document, naming it."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    from kvdrift.data.document import Document
    from kvdrift.lm.factory import (
        ContextWindowExceeded,
        DriverSide,
        _uniform_window,
        check_fits,
    )
    from kvdrift.lm.loading.model import encode_prompt, load_tokenizer

    assert _uniform_window(MistralConfig()) == 4096
    assert _uniform_window(MistralConfig(sliding_window=None)) is None
    assert _uniform_window(Qwen2Config()) is None and _uniform_window(LlamaConfig()) is None
    tokenizer = load_tokenizer("smollm2")
    doc = Document("long", "The cat sat on the mat. " * 8)
    n = int(encode_prompt(tokenizer, doc.prompt).shape[-1])
    side = DriverSide("m", tokenizer, None, 8192, 2, attention_window=n + 4)
    check_fits([doc], 4, side)  # fits exactly
    with pytest.raises(ContextWindowExceeded) as info:
        check_fits([doc], 5, side)
    assert str(info.value) == (
        f"document 'long' has {n} prompt tokens; with H = 5 generated positions that exceeds "
        f"m's sliding attention window of {n + 4} tokens: its layers attend only to their last "
        f"{n + 4} positions, which kvdrift does not model (allowed: prompt tokens <= "
        f"{n - 1})")
