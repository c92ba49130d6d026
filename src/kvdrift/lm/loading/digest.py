"""Digests that say what a run ran on: the weights, the tokenizer, and the files of a cache.

A model's *name* does not say which weights were loaded (a converted-weights cache can be
replaced, a local folder edited, a hub id re-released). These digests are computed from what was
actually loaded or stored, so that a store can refuse to mix records made with other weights
(``weights_digest``, ``tokenizer_digest``) and a cache can check its files before they are
loaded (``file_sha256``). Each is a SHA-256 hex string; the same content gives the same digest
on every machine and device.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

#: Bytes read at a time when a file is hashed.
CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a regular file's bytes. Anything else (a device, a FIFO, a socket, a folder)
    is refused with ``OSError`` naming the path, without blocking on it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        digest = hashlib.sha256()
        while block := os.read(fd, CHUNK):
            digest.update(block)
        return digest.hexdigest()
    finally:
        os.close(fd)


def weights_digest(model: Any) -> str:
    """SHA-256 over a torch module's state (every tensor's name, dtype, shape and bytes, in
    name order). Independent of the device the tensors are on; a tensor shared under two names
    (tied embeddings) counts under each."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1).contiguous()
        header = json.dumps([name, str(flat.dtype), list(tensor.shape)]).encode()
        digest.update(len(header).to_bytes(8, "little") + header)
        if flat.numel():
            digest.update(flat.cpu().view(_byte_dtype()).numpy())
    return digest.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str:
    """SHA-256 over what decides a tokenizer's ids and text: its vocabulary and rules (the
    fast tokenizer's serialised form, else its vocabulary), its special tokens and its chat
    template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        core = backend.to_str()
    else:
        core = json.dumps(sorted(tokenizer.get_vocab().items()))
    extra = json.dumps({
        "special": {key: str(value) for key, value in
                    sorted(getattr(tokenizer, "special_tokens_map", {}).items())},
        "chat_template": getattr(tokenizer, "chat_template", None),
    }, sort_keys=True, default=str)
    digest = hashlib.sha256()
    for part in (core, extra):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def short(digest: str) -> str:
    """The first 12 hex digits, as messages print a digest."""
    return digest[:12]


def _byte_dtype() -> Any:
    import torch

    return torch.uint8
