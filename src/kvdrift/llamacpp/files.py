"""GGUF files for the llama.cpp engine: found, checked before llama.cpp reads them, digested,
and requantized by llama.cpp's own quantizer into kvdrift's cache.

A file is read with the ``gguf`` package's reader first (no llama.cpp, no weights loaded): one
that is not GGUF, is truncated, or holds no vocabulary is refused in one line, and Q's vocabulary
must be P's token for token. A requantized copy (``full@Q4_K_M``) is written once, atomically,
under ``<cache root>/llama.cpp/`` with its SHA-256 beside it; a copy whose bytes no longer match
that digest is made again.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvdrift.lm.loading.embedded import DEFAULT_MODEL, SMOLLM2_GGUF, cache_root, smollm2_gguf_dir

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GgufInfo:
    """What kvdrift reads of a GGUF file before llama.cpp loads it."""

    path: Path
    architecture: str
    context_length: int | None
    layers: int
    head_dim: int | None
    tokens: tuple[str, ...]

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)


def model_file(name: str) -> Path:
    """The GGUF file a model name means: ``smollm2`` is the embedded model's file, anything
    else a path to a ``.gguf`` file (one line if it is not one)."""
    if name == DEFAULT_MODEL:
        return smollm2_gguf_dir() / SMOLLM2_GGUF
    path = Path(name).expanduser()
    if path.suffix.lower() != ".gguf":
        raise ValueError(f"the llama.cpp engine runs GGUF files; model must be 'smollm2' (the "
                         f"embedded model) or a path to a .gguf file; got {name!r}")
    if not path.is_file():
        raise ValueError(f"GGUF file {str(path)!r} does not exist")
    return path.resolve()


@functools.lru_cache(maxsize=16)
def read_info(path: Path) -> GgufInfo:
    """The file's architecture, context length, layers, head size and vocabulary; one-line
    ValueError for a file that is not a complete GGUF model."""
    from gguf import GGUFReader

    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{str(path)!r} is not a GGUF file (it starts with {magic!r}, not "
                         f"{GGUF_MAGIC!r})")
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, OSError, TypeError, KeyError) as exc:
        raise ValueError(f"{str(path)!r} is not a readable GGUF file (truncated or damaged: "
                         f"{str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})"
                         ) from None
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > path.stat().st_size:
        raise ValueError(f"{str(path)!r} is truncated: its tensors end at byte {end:,}, the file "
                         f"has {path.stat().st_size:,}")

    def value(key: str):
        found = reader.get_field(key)
        return None if found is None else found.contents()

    arch = value("general.architecture")
    if not arch:
        raise ValueError(f"{str(path)!r} is a GGUF file without a model architecture")
    tokens = value("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{str(path)!r} holds no vocabulary (tokenizer.ggml.tokens)")
    layers = value(f"{arch}.block_count")
    if not layers:
        raise ValueError(f"{str(path)!r} is not a language model (no {arch}.block_count)")
    heads, embd = value(f"{arch}.attention.head_count"), value(f"{arch}.embedding_length")
    head_dim = value(f"{arch}.attention.key_length") or (
        int(embd) // int(heads) if heads and embd else None)
    context = value(f"{arch}.context_length")
    return GgufInfo(path, str(arch), int(context) if context else None, int(layers),
                    int(head_dim) if head_dim else None, tuple(str(t) for t in tokens))


def check_same_vocabulary(p: GgufInfo, q: GgufInfo, action: str) -> None:
    """One line if Q's file has another vocabulary than P's."""
    if p.tokens == q.tokens:
        return
    if p.vocab_size != q.vocab_size:
        what = f"{q.vocab_size:,} tokens, P's {p.vocab_size:,}"
    else:
        i = next(i for i, (a, b) in enumerate(zip(p.tokens, q.tokens, strict=True)) if a != b)
        what = f"token {i} is {q.tokens[i]!r} there, {p.tokens[i]!r} in P's"
    raise ValueError(f"action {action!r}: {str(q.path)!r} has another vocabulary than P's "
                     f"model ({what}); kvdrift couples two generators on one tokenizer")


@functools.lru_cache(maxsize=32)
def file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    """SHA-256 of a file's bytes (cached by path, size and modification time)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def digest(path: Path) -> str:
    """SHA-256 of a file (computed once per path, size and modification time)."""
    stat = path.stat()
    return file_sha256(path, stat.st_size, stat.st_mtime_ns)


def quantized_path(source: Path, quant: str) -> Path:
    """Where the copy of ``source`` requantized to ``quant`` lives in kvdrift's cache."""
    return cache_root() / "llama.cpp" / f"{digest(source)[:16]}-{quant}.gguf"


def quantized_copy(source: Path, quant: str, threads: int = 0) -> Path:
    """``source`` requantized to the llama.cpp weight type ``quant`` by llama.cpp's quantizer
    (made on first use, then reused while its bytes match the digest stored beside it)."""
    from kvdrift.llamacpp.binding import llama

    target = quantized_path(source, quant)
    stamp = target.with_suffix(".sha256")
    if target.is_file() and stamp.is_file() and stamp.read_text().strip() == digest(target):
        return target
    lib = llama()
    ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{quant}", None)
    if ftype is None:
        raise ValueError(f"llama.cpp has no weight type {quant!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    os.close(handle)
    try:
        params = lib.llama_model_quantize_default_params()
        params.ftype = ftype
        params.allow_requantize = True  # the embedded file is quantized already (Q4_1)
        params.nthread = threads or os.cpu_count() or 1
        code = lib.llama_model_quantize(str(source).encode(), tmp.encode(), params)
        if code != 0:
            raise ValueError(f"llama.cpp's quantizer failed ({code}) making {quant} of "
                             f"{str(source)!r}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    stamp.write_text(digest(target) + "\n")
    return target
