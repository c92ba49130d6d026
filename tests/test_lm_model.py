"""Model loading: option validation, the atomic conversion cache, prompt encoding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvdrift.lm.loading import model as lm_model
from kvdrift.lm.loading.embedded import SMOLLM2_CACHE_NAME
from kvdrift.lm.loading.model import (
    cache_root,
    encode_prompt,
    is_complete_model_dir,
    load_model,
    resolve_device,
    resolve_dtype,
    write_atomically,
)
from tests.messages import whole


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    for bad in ["tpu", "gpu", "cuda:x"]:
        with pytest.raises(ValueError, match=whole(
                f"device must be one of auto, cpu, cuda, cuda:N; got {bad!r}")):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_resolve_dtype():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match=whole(
            "dtype must be one of float32, bfloat16, float16; got 'fp8'")):
        resolve_dtype("fp8")


def test_a_loaded_model_of_another_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match=whole(
            "dtype must be one of float32, bfloat16, float16; got torch.float64")):
        lm_model.LoadedModel(None, None, "m", torch.device("cpu"), torch.float64)


def test_load_model_validates_before_loading():
    with pytest.raises(ValueError, match=whole(
            "device must be one of auto, cpu, cuda, cuda:N; got 'tpu'")):
        load_model("smollm2", device="tpu")
    with pytest.raises(ValueError, match=whole(
            "dtype must be one of float32, bfloat16, float16; got 'int4'")):
        load_model("smollm2", dtype="int4")
    with pytest.raises(ValueError, match=whole(
            "attn_implementation must be one of sdpa, eager; got 'flash'")):
        load_model("smollm2", attn_implementation="flash")


def test_cache_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KVDRIFT_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("KVDRIFT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "kvdrift"


def _write_model_files(path: Path) -> None:
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"x")
    (path / "tokenizer_config.json").write_text("{}")


def test_write_atomically_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "cache" / "model"

    def broken(path: Path) -> None:
        (path / "config.json").write_text("{}")
        raise KeyboardInterrupt  # interrupted half-way

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, broken)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # the temp dir is cleaned up too

    write_atomically(target, _write_model_files)
    assert is_complete_model_dir(target)
    # a second writer that loses the race keeps the finished copy
    write_atomically(target, _write_model_files)
    assert is_complete_model_dir(target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["model"]


def test_smollm2_conversion_is_cached_once(monkeypatch, tmp_path):
    monkeypatch.setenv("KVDRIFT_CACHE", str(tmp_path))
    calls = []

    def fake_convert(path: Path) -> None:
        calls.append(path)
        _write_model_files(path)

    monkeypatch.setattr(lm_model, "_convert_smollm2", fake_convert)
    first = lm_model.smollm2_path()
    second = lm_model.smollm2_path()
    assert first == second == lm_model.smollm2_cache_dir()
    assert first.parent == tmp_path and first.name.startswith(SMOLLM2_CACHE_NAME)
    assert len(calls) == 1
    with pytest.raises(FileNotFoundError):
        monkeypatch.setenv("KVDRIFT_CACHE", str(tmp_path / "empty"))
        lm_model.smollm2_path(convert=False)


class _StubTokenizer:
    """Character-level tokenizer with an optional chat template."""

    def __init__(self, chat_template: str | None) -> None:
        self.chat_template = chat_template

    def __call__(self, text, return_tensors=None):
        return {"input_ids": torch.tensor([[1] + [ord(c) % 100 for c in text]])}

    def apply_chat_template(self, messages, add_generation_prompt, return_tensors, return_dict):
        assert add_generation_prompt and return_dict
        text = "<user>" + messages[0]["content"] + "<assistant>"
        return self(text, return_tensors=return_tensors)


def test_encode_prompt():
    plain = encode_prompt(_StubTokenizer(None), "abc")
    assert plain.dtype == torch.long and plain.shape == (1, 4)
    chat = encode_prompt(_StubTokenizer("{{ messages }}"), "abc")
    assert chat.shape == (1, 4 + len("<user><assistant>"))
    off = encode_prompt(_StubTokenizer("{{ messages }}"), "abc", chat_template=False)
    assert torch.equal(off, plain)
    with pytest.raises(ValueError, match="empty"):
        encode_prompt(_StubTokenizer(None), "  ")


@pytest.mark.slow
def test_load_smollm2():
    loaded = load_model()
    assert loaded.name == "smollm2"
    assert loaded.device == torch.device("cpu") and loaded.dtype is torch.float32
    config = loaded.model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (
        30, 9, 3)
    assert not loaded.model.training
    ids = encode_prompt(loaded.tokenizer, "Hello!")
    text = loaded.tokenizer.decode(ids[0])
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert loaded.tokenizer.eos_token == "<|im_end|>"
    assert is_complete_model_dir(lm_model.smollm2_cache_dir())
    assert (lm_model.smollm2_cache_dir() / "kvdrift-manifest.json").is_file()  # verified


@pytest.mark.slow
def test_smollm2_tokenizer_without_a_conversion_is_the_converted_one(tmp_path, monkeypatch):
    """``load_tokenizer("smollm2")`` with no converted cache reads the GGUF's tokenizer alone
    (no weights converted): it encodes and decodes as the converted cache's tokenizer, so
    documents sized or prompts encoded by either are the same."""
    import random

    from kvdrift.lm.loading.model import load_tokenizer

    converted = load_model().tokenizer
    monkeypatch.setenv("KVDRIFT_CACHE", str(tmp_path / "empty-cache"))
    alone = load_tokenizer("smollm2")
    assert not (tmp_path / "empty-cache").exists()  # nothing converted
    texts = ["Hello!", "The special magic number is 12345.\n\nWhat is it?",
             "naïve café 漢字 \u202e <script> &", "  spaces   and\ttabs\n"]
    for text in texts:
        for chat in (True, False):
            assert encode_prompt(alone, text, chat).tolist() == encode_prompt(
                converted, text, chat).tolist()
    ids = random.Random(0).sample(range(converted.vocab_size), 500)
    assert [alone.decode([i]) for i in ids] == [converted.decode([i]) for i in ids]
    assert alone.eos_token == converted.eos_token == "<|im_end|>"
