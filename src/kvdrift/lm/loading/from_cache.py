"""The embedded model loaded from the bytes its converted cache was checked by, not by path.

:func:`kvdrift.lm.loading.converted_cache.opened` holds the converted folder open and hands out
each file's bytes only once they match their sealed digest. The weights are built from those
bytes in memory (a state dict, never the folder opened again by name); the small files (config,
generation config, tokenizer) are written from their checked bytes into a fresh private
temporary folder that only this process knows, and transformers reads them there. So a folder
swapped in after the check, or a file changed while it loads, is never what runs.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from kvdrift.lm.loading.converted_cache import MANIFEST, Opened

#: The weights' files in a converted folder (read into memory, never staged on disk).
WEIGHTS_SUFFIX = ".safetensors"
_LOCAL = {"trust_remote_code": False, "local_files_only": True}


@contextlib.contextmanager
def staged(cache: Opened) -> Iterator[Path]:
    """A private temporary folder holding the checked bytes of every file but the weights."""
    with tempfile.TemporaryDirectory(prefix="kvdrift-checked-") as folder:  # 0o700, ours
        for name in sorted(cache.files):
            if not name.endswith(WEIGHTS_SUFFIX) and name != MANIFEST:
                (Path(folder) / name).write_bytes(cache.read(name))
        yield Path(folder)


def config(cache: Opened) -> Any:
    """The model's config from its checked bytes."""
    from transformers import AutoConfig

    with staged(cache) as folder:
        return AutoConfig.from_pretrained(folder, **_LOCAL)


def tokenizer(cache: Opened) -> Any:
    """The model's tokenizer from its checked bytes."""
    from transformers import AutoTokenizer

    with staged(cache) as folder:
        return AutoTokenizer.from_pretrained(folder, **_LOCAL)


def state_dict(cache: Opened) -> dict[str, torch.Tensor]:
    """Every weight, parsed from the checked bytes of the weights' files."""
    from safetensors.torch import load

    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(n for n in cache.files if n.endswith(WEIGHTS_SUFFIX)):
        tensors.update(load(cache.read(name)))
    return tensors


def model_and_tokenizer(cache: Opened, dtype: torch.dtype, attn_implementation: str
                        ) -> tuple[Any, Any]:
    """The causal LM (weights from the checked bytes, in ``dtype``) and its tokenizer."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    weights = state_dict(cache)
    with staged(cache) as folder:
        model_config = AutoConfig.from_pretrained(folder, **_LOCAL)
        tok = AutoTokenizer.from_pretrained(folder, **_LOCAL)
        generation = (GenerationConfig.from_pretrained(folder, **_LOCAL)
                      if (folder / "generation_config.json").is_file() else None)
    model = MODEL_FOR_CAUSAL_LM_MAPPING[type(model_config)].from_pretrained(
        None, config=model_config, state_dict=weights, dtype=dtype,
        attn_implementation=attn_implementation)
    if generation is not None:
        model.generation_config = generation
    return model, tok


__all__ = ["config", "model_and_tokenizer", "staged", "state_dict", "tokenizer"]
