"""The digests that name weights, tokenizers and cached files: equal for equal content,
different for any change, refusing what is not a regular file."""

from __future__ import annotations

import os

import pytest
import torch

from kvdrift.lm.loading.digest import file_sha256, tokenizer_digest, weights_digest


def _module(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def test_weights_digest_follows_content_not_identity():
    a, b = _module(0), _module(0)
    assert weights_digest(a) == weights_digest(b)
    with torch.no_grad():
        b[1].bias[0] += 1e-6
    assert weights_digest(a) != weights_digest(b)


def test_weights_digest_sees_dtype_and_names():
    a = _module(0)
    half = _module(0).to(torch.bfloat16)
    assert weights_digest(a) != weights_digest(half)
    renamed = torch.nn.Sequential()
    renamed.add_module("first", a[0])
    renamed.add_module("second", a[1])
    assert weights_digest(a) != weights_digest(renamed)


def test_file_digest_and_non_regular_files(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    assert file_sha256(path) == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    with pytest.raises(OSError, match="not a regular file"):
        file_sha256(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        file_sha256(fifo)  # refused at once, never blocks waiting for a writer


class _Tok:
    def __init__(self, vocab, template=None):
        self._vocab, self.chat_template = vocab, template
        self.special_tokens_map = {"eos_token": "</s>"}

    def get_vocab(self):
        return dict(self._vocab)


def test_tokenizer_digest_sees_vocab_and_template():
    base = tokenizer_digest(_Tok({"a": 0, "b": 1}))
    assert base == tokenizer_digest(_Tok({"b": 1, "a": 0}))
    assert base != tokenizer_digest(_Tok({"a": 1, "b": 0}))
    assert base != tokenizer_digest(_Tok({"a": 0, "b": 1}, template="{{ x }}"))
