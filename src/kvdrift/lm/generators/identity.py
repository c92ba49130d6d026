"""What Q's model is, as a unit's fingerprint records it: known before any model loads.

A store must never mix records of two Q models under one action name. For ``<action>@<model>``
the spec's settings and the quantizer's version say what a derived Q is (its weights are a
function of P's, whose digest every unit records already); another checkpoint adds the digest
of its files; a model handed over in memory (``kvdrift.Model``) the digest of its weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from kvdrift.lm.grammar.model_spec import ModelSpec, parse_model, split_model

#: The files of a checkpoint whose bytes decide what it computes.
CHECKPOINT_FILES = ("*.safetensors", "*.bin", "config.json", "tokenizer.json",
                    "tokenizer_config.json", "generation_config.json")


def checkpoint_folder(name: str) -> Path | None:
    """A checkpoint's local folder: the path itself, or a hub id's snapshot in the local
    cache (None where neither is found: loading it names why)."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not cached, or not a hub id: the loader refuses it in one line
        return None


def checkpoint_digest(name: str) -> str | None:
    """SHA-256 over a checkpoint's weight, config and tokenizer files (names and bytes)."""
    from kvdrift.lm.loading.digest import file_sha256

    folder = checkpoint_folder(name)
    if folder is None:
        return None
    digest = hashlib.sha256()
    files = sorted({p for pattern in CHECKPOINT_FILES for p in folder.glob(pattern)})
    for path in files:
        digest.update(f"{path.name}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def spec_identity(spec: ModelSpec) -> dict[str, Any]:
    """The identity of a Q named by ``@<model>`` (module docstring)."""
    out: dict[str, Any] = {"model": spec.text, **spec.as_record()}
    if spec.weights is not None:
        out["quantizer"] = f"gguf {metadata.version('gguf')}"
    if spec.checkpoint is not None:
        out["files_sha256"] = checkpoint_digest(spec.checkpoint)
    return out


def given_identity(name: str, loaded: Any) -> dict[str, Any]:
    """The identity of a model handed over in memory as Q (``kvdrift.Model``)."""
    from kvdrift.lm.loading.digest import tokenizer_digest, weights_digest

    return {"model": name, "given": True, "weights_sha256": weights_digest(loaded.model),
            "tokenizer_sha256": tokenizer_digest(loaded.tokenizer), "dtype": str(loaded.dtype),
            "attention": loaded.model.config._attn_implementation}


def q_identities(actions: Iterable[str], given: Mapping[str, Any] | None = None
                 ) -> dict[str, dict[str, Any]]:
    """``{action: identity}`` for every action whose Q is another model: ``@<model>`` specs
    and the names of models handed over (``given``: action name -> loaded model)."""
    out = {}
    for name in actions:
        if given and name in given:
            out[name] = given_identity(name, given[name])
            continue
        _, model = split_model(name) if isinstance(name, str) else (name, None)
        if model is not None:
            out[name] = spec_identity(parse_model(model, name))
    return out
