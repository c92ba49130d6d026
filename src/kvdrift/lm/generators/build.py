"""Q's model: built from P's (another dtype, attention or weight type) or loaded (another
checkpoint), or handed over in memory; and P's own model where its name carries an ``@`` part.

A derived Q is a copy of P's model, changed as its spec says; P's model is never touched.
Another checkpoint's tokenizer and config are checked against P's before any weights load,
and models that would not fit in memory are refused before they are loaded or copied (one
line each). What a store records of Q is :mod:`~kvdrift.lm.generators.identity`'s.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from kvdrift.lm.generators.tokenizers import check_one_tokenizer
from kvdrift.lm.generators.weights import (
    BLOCK,
    check_quantizable,
    parameter_bytes,
    quantize_weights,
)
from kvdrift.lm.grammar.model_spec import ModelSpec
from kvdrift.lm.loading.model import (
    DTYPES,
    LoadedModel,
    load_model,
    load_tokenizer,
    text_config,
)


@dataclass(frozen=True)
class Generator:
    """Q's model as its side runs it: the loaded model, what it is (``label``: the spec
    after ``@`` or the name of a model handed over) and the bytes of its weights (as the
    weight type stores them, for a quantized copy). What a store records of it is
    :mod:`~kvdrift.lm.generators.identity`'s."""

    loaded: LoadedModel
    label: str
    weights_bytes: int


def _available_bytes(device: torch.device) -> int | None:
    """Memory free for a new model on ``device`` (None where it cannot be read)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits_memory(needed: int, device: torch.device, what: str) -> None:
    """One-line ValueError if ``needed`` bytes do not fit in what ``device`` has free."""
    free = _available_bytes(device)
    if free is not None and needed > free:
        raise ValueError(f"Q's model {what} needs about {_size(needed)} for the weights, more "
                         f"than the {_size(free)} free on {device}; free memory or use a "
                         f"smaller model")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def checkpoint_bytes(name: str) -> int | None:
    """Bytes of a checkpoint's weight files, where they are on this machine (a folder, the
    embedded model's converted cache, a hub id in the local cache), else None."""
    from kvdrift.lm.generators.identity import checkpoint_folder
    from kvdrift.lm.loading.model import DEFAULT_MODEL, smollm2_cache_dir

    folder = smollm2_cache_dir() if name == DEFAULT_MODEL else checkpoint_folder(name)
    if folder is None or not folder.is_dir():
        return None
    return sum(p.stat().st_size for p in folder.glob("*.safetensors")) or \
        sum(p.stat().st_size for p in folder.glob("*.bin")) or None


def check_models_fit_memory(p_name: str, specs: list[ModelSpec], device: str,
                            p_dtype: str = "float32") -> None:
    """One-line ValueError, before any weights load, if P's weights and every Q's (a copy of
    P's at its dtype, or another checkpoint's files) would not fit in what ``device`` has
    free; sizes are read from the files on disk (nothing is refused where they are not)."""
    from kvdrift.lm.loading.model import base_model

    p_bytes = checkpoint_bytes(base_model(p_name))
    total, named = p_bytes or 0, []
    for spec in specs:
        size = checkpoint_bytes(spec.checkpoint) if spec.checkpoint else p_bytes
        if size is None:
            continue
        if spec.dtype is not None and spec.checkpoint is None:
            size = (size * torch.empty((), dtype=DTYPES[spec.dtype]).element_size()
                    // torch.empty((), dtype=DTYPES[p_dtype]).element_size())
        total += size
        named.append(spec.text)
    if named:
        from kvdrift.lm.loading.model import resolve_device

        check_fits_memory(total, resolve_device(device),
                          f"{' and '.join(named)} (with P's {p_name})")


def config_linear_inputs(config: Any) -> dict[str, int]:
    """The input sizes of a Llama-like decoder block's linear layers, from its config alone."""
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // heads if heads else None)
    sizes = {"attention projections": config.hidden_size,
             "MLP gate and up projections": config.hidden_size,
             "MLP down projection": getattr(config, "intermediate_size", None)}
    if heads and head_dim:
        sizes["attention output projection"] = heads * head_dim
    return {k: int(v) for k, v in sizes.items() if v}


def check_spec_fits(spec: ModelSpec, p_tokenizer: Any, p_config: Any,
                    allow_download: bool = False) -> None:
    """What can be checked of Q's model before any weights load (one-line ValueError): another
    checkpoint's tokenizer is P's; a weight type's blocks fit every linear layer's rows (from
    P's config)."""
    if spec.checkpoint is not None:
        text_config(spec.checkpoint, allow_download)  # a config needing its own code: refused
        check_one_tokenizer(p_tokenizer, load_tokenizer(spec.checkpoint, allow_download),
                            spec.checkpoint)
    if spec.weights is not None and spec.checkpoint is None and p_config is not None:
        for what, size in config_linear_inputs(p_config).items():
            if size % BLOCK:
                raise ValueError(f"weight type {spec.weights} quantizes rows in blocks of "
                                 f"{BLOCK}; the model's {what} have {size} inputs, not a "
                                 f"multiple of {BLOCK} (use a dtype instead, e.g. @bfloat16)")


def build_generator(p: LoadedModel, spec: ModelSpec, allow_download: bool = False) -> Generator:
    """Q's model for ``spec`` beside P's loaded model ``p`` (same device)."""
    dtype = DTYPES[spec.dtype] if spec.dtype else p.dtype
    if spec.checkpoint is not None:
        tokenizer = load_tokenizer(spec.checkpoint, allow_download)
        check_one_tokenizer(p.tokenizer, tokenizer, spec.checkpoint)
        size = checkpoint_bytes(spec.checkpoint)
        if size is not None:
            check_fits_memory(size, p.device, spec.checkpoint)
        loaded = load_model(spec.checkpoint, p.device, dtype,
                            attn_implementation=spec.attention or "sdpa",
                            allow_download=allow_download)
        model = loaded.model
    else:
        itemsize = torch.empty((), dtype=dtype).element_size()
        check_fits_memory(sum(q.numel() for q in p.model.parameters()) * itemsize, p.device,
                          spec.text)
        if spec.weights is not None:
            check_quantizable(p.model, spec.weights)
        model = copy.deepcopy(p.model).to(dtype=dtype).eval()
        if spec.attention is not None:
            model.set_attn_implementation(spec.attention)
        loaded = LoadedModel(model, p.tokenizer, f"{p.name}@{spec.text}", p.device, dtype)
    weights_bytes = parameter_bytes(model)
    if spec.weights is not None:
        weights_bytes = quantize_weights(model, spec.weights).total_bytes
    return Generator(loaded, spec.text, weights_bytes)


def given_generator(p: LoadedModel, given: LoadedModel, name: str) -> Generator:
    """A model the user handed over (``kvdrift.Model``) as Q: on P's tokenizer and device."""
    check_one_tokenizer(p.tokenizer, given.tokenizer, name)
    if given.device != p.device:
        raise ValueError(f"Q's model {name!r} is on {given.device} and P's on {p.device}; "
                         f"move them to one device")
    return Generator(given, name, parameter_bytes(given.model))




def load_side_model(name: str, device: str | torch.device = "cpu",
                    dtype: str | torch.dtype = "float32",
                    allow_download: bool = False) -> LoadedModel:
    """P's model by name: a checkpoint, or one with an ``@`` part (``smollm2@q8_0``, its
    weights as Q8_0; ``smollm2@eager``): the checkpoint loads, then the part applies to it in
    place (a dtype part overrides ``dtype``)."""
    from kvdrift.lm.grammar.model_spec import split_p_model

    base, spec = split_p_model(name)
    if spec is None:
        return load_model(name, device, dtype, allow_download=allow_download)
    loaded = load_model(base, device, spec.dtype or dtype,
                        attn_implementation=spec.attention or "sdpa",
                        allow_download=allow_download)
    if spec.weights is not None:
        quantize_weights(loaded.model, spec.weights)
    return LoadedModel(loaded.model, loaded.tokenizer, name, loaded.device, loaded.dtype)
