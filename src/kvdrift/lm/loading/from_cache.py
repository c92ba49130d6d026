"""The embedded model loaded from the bytes its converted cache was checked by, not by path.

:func:`kvdrift.lm.loading.converted_cache.opened` holds the converted folder open and hands out
each file's bytes only once they match their sealed digest. The weights are built from those
bytes in memory (tensors viewed in the checked buffer, never the folder opened again by
name); the small files (config, generation config, tokenizer) are written from their checked
bytes into a fresh private temporary folder that only this process knows, and transformers
reads them there. So a folder swapped in after the check, or a file changed while it loads,
is never what runs.
"""

from __future__ import annotations

import contextlib
import json
import math
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


#: safetensors' dtype names, for the dtypes a converted model holds.
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                      "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                      "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}


def tensors(data: bytearray, shown: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file's bytes, viewed in place (no copy): an 8-byte
    little-endian header length, a JSON header of dtype, shape and byte range per tensor, the
    data. A header that does not describe the bytes is refused naming ``shown``."""
    try:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + size])
        base, out = 8 + size, {}
        for key, info in header.items():
            if key == "__metadata__":
                continue
            dtype, shape = SAFETENSORS_DTYPES[info["dtype"]], [int(n) for n in info["shape"]]
            start, end = (int(n) for n in info["data_offsets"])
            count = math.prod(shape)
            if end - start != count * dtype.itemsize or not 0 <= start <= end <= len(data) - base:
                raise ValueError(key)
            flat = torch.frombuffer(data, dtype=dtype, count=count, offset=base + start) \
                if count else torch.empty(0, dtype=dtype)
            out[key] = flat.reshape(shape)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{shown}: not a safetensors file kvdrift can read ({exc!r})") from None
    return out


def state_dict(cache: Opened) -> dict[str, torch.Tensor]:
    """Every weight, viewed in the checked bytes of the weights' files."""
    found: dict[str, torch.Tensor] = {}
    for name in sorted(n for n in cache.files if n.endswith(WEIGHTS_SUFFIX)):
        found.update(tensors(cache.read(name), str(cache.folder / name)))
    return found


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


__all__ = ["config", "model_and_tokenizer", "staged", "state_dict", "tensors", "tokenizer"]
