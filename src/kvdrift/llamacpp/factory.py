"""Kernel pairs for (document, action) units run inside llama.cpp.

P's model is a GGUF file (``smollm2``: the embedded one) loaded once; each Q model (another
file, or P's file requantized) is loaded once on first use. Per document, P's context holds
the prompt once and serves every action (one prefill for P); each action's Q gets its own
context with its cache types, prefilled once (``full`` too: each side's cells lie as in
llama.cpp's own run). Prompts are tokenized by the model's tokenizer as the transformers engine
tokenizes them (chat template included), so both engines run on the same token ids.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kvdrift.data.document import Document
from kvdrift.llamacpp.binding import ENGINE, LLAMA_CPP_PYTHON, llama
from kvdrift.llamacpp.cache_types import (
    BLOCKED,
    GGML_TYPE_IDS,
    LlamaAction,
    parse_llama_action,
)
from kvdrift.llamacpp.files import (
    GgufInfo,
    check_same_vocabulary,
    digest,
    model_file,
    quantized_copy,
    quantized_path,
    read_info,
)
from kvdrift.llamacpp.pair import LlamaCppPair
from kvdrift.llamacpp.sequences import SequencePool
from kvdrift.lm.loading.model import encode_prompt, encode_split

SLOTS_PER_ROW = 4  # Q's rows: its own and P's path (forced), twice over (one decode per call)
MAX_SLOTS = 255  # llama.cpp holds at most 256 sequences per context (one is the prompt)


def q_file(action: LlamaAction, p_file: Path) -> Path:
    """The GGUF file Q runs (P's, a file named after ``@``, or where P's requantized copy
    lives, made or not)."""
    if action.model is None:
        return p_file
    if action.quantized_weights is not None:
        return quantized_path(p_file, action.quantized_weights)
    return model_file(action.model)


def check_llama_study(actions: Sequence[str], p_model: str, horizon: int) -> GgufInfo:
    """Refuse, in one line and before llama.cpp loads anything, a bad action, a GGUF file that
    is not a model or has another vocabulary than P's, or a cache type whose blocks of 32 do
    not divide the model's head size. Returns P's file's info."""
    p = read_info(model_file(p_model))
    for name in actions:
        action = parse_llama_action(name)
        if action.model is not None and action.quantized_weights is None:
            check_same_vocabulary(p, read_info(model_file(action.model)), name)
        blocked = {action.type_k, action.type_v} & BLOCKED
        if blocked and p.head_dim is not None and p.head_dim % 32:
            raise ValueError(f"action {name!r}: llama.cpp's {sorted(blocked)[0]} cache stores "
                             f"blocks of 32 along the head, and {p.architecture}'s heads have "
                             f"{p.head_dim} dimensions; use f16, bf16 or f32")
    return p


def q_identity(action: LlamaAction, p_file: Path) -> dict[str, str]:
    """What a unit's fingerprint records of Q's model where it is not P's file."""
    if action.quantized_weights is not None:
        return {"engine": ENGINE, "requantized": action.quantized_weights,
                "from_sha256": digest(p_file), "quantizer": f"llama.cpp "
                f"(llama-cpp-python {LLAMA_CPP_PYTHON})"}
    path = model_file(action.model or "")
    return {"engine": ENGINE, "file": str(path), "file_sha256": digest(path)}


def gguf_tokenizer(model: str) -> Any:
    """The tokenizer of a GGUF model as transformers reads it from the file (the embedded
    model's as the transformers engine loads it), so both engines run on the same ids."""
    from kvdrift.lm.loading.embedded import DEFAULT_MODEL
    from kvdrift.lm.loading.model import load_tokenizer

    if model == DEFAULT_MODEL:
        return load_tokenizer(model)
    from transformers import AutoTokenizer

    path = model_file(model)
    try:
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name,
                                             local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"transformers cannot read the tokenizer of {str(path)!r} "
                         f"({str(exc).splitlines()[0][:120] if str(exc) else exc!r})") from None


def llama_q_identities(actions: Sequence[str], p_model: str) -> dict[str, dict[str, str]]:
    """``{action: identity}`` for every action whose Q runs another file than P's."""
    p_file = model_file(p_model)
    out = {}
    for name in actions:
        action = parse_llama_action(name)
        if action.model is not None:
            out[name] = q_identity(action, p_file)
    return out


class LlamaCppFactory:
    """Callable ``(document, action) -> LlamaCppPair`` for the runner (module docstring).

    ``horizon`` bounds every row (contexts are sized for it); ``rows`` is the most replicates
    a batch holds (each side's context holds :data:`SLOTS_PER_ROW` sequences per row)."""

    def __init__(self, model: str, tokenizer: Any, horizon: int, rows: int,
                 chat_template: bool = True, threads: int | None = None):
        self.lib = llama()
        self.model_name = model
        self.p_file = model_file(model)
        self.tokenizer = tokenizer
        self.horizon = int(horizon)
        self.slots = max(8, min(MAX_SLOTS, SLOTS_PER_ROW * int(rows)))
        self.chat_template = chat_template
        self.threads = int(threads or os.cpu_count() or 1)
        self._models: dict[Path, Any] = {}
        self._doc_id: str | None = None
        self._ids: torch.Tensor | None = None
        self._pools: dict[str, SequencePool] = {}  # this document's, by context settings
        self.prefills = 0

    @property
    def identity(self) -> dict[str, str]:
        from kvdrift.lm.loading.digest import tokenizer_digest

        return {"weights_sha256": digest(self.p_file),
                "tokenizer_sha256": tokenizer_digest(self.tokenizer)}

    def prompt_ids(self, doc: Document) -> torch.Tensor:
        """Token ids ``[1, n]`` of a document's prompt, as the transformers engine encodes it
        (a question follows its context: llama.cpp caches both alike)."""
        if doc.question is None:
            return encode_prompt(self.tokenizer, doc.prompt, self.chat_template)
        return torch.cat(encode_split(self.tokenizer, doc.prompt, doc.question,
                                      self.chat_template), dim=1)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def __call__(self, doc: Document, action: str) -> LlamaCppPair:
        parsed = parse_llama_action(action)
        if doc.id != self._doc_id:
            self.close_document()
            self._ids = self.prompt_ids(doc)
            self._doc_id = doc.id
        prompt = [int(t) for t in self._ids.reshape(-1).tolist()]
        full = LlamaAction(name="full")
        p = self._pool("p", self.p_file, full, prompt, max(8, self.slots // 2))
        q_path = self._q_path(parsed)
        q = self._pool(parsed.name, q_path, parsed, prompt, self.slots)
        info = read_info(self.p_file)
        bits_k, bits_v = parsed.cache_bits
        fraction = (bits_k + bits_v) / 32.0
        model = self._models[q_path]
        per_token = (info.layers * self.lib.llama_model_n_head_kv(model)
                     * (info.head_dim or 0) * (bits_k + bits_v) / 8)
        q_bytes = q_path.stat().st_size
        return LlamaCppPair(p, q, parsed, self.tokenizer.eos_token_id, self.horizon,
                            (per_token * len(prompt), fraction),
                            (q_bytes, q_bytes / self.p_file.stat().st_size))

    def _q_path(self, action: LlamaAction) -> Path:
        if action.quantized_weights is not None:
            return quantized_copy(self.p_file, action.quantized_weights, self.threads)
        return q_file(action, self.p_file)

    def _model(self, path: Path) -> Any:
        if path not in self._models:
            params = self.lib.llama_model_default_params()
            params.n_gpu_layers = 0
            model = self.lib.llama_model_load_from_file(str(path).encode(), params)
            if not model:
                raise ValueError(f"llama.cpp could not load {str(path)!r}")
            self._models[path] = model
        return self._models[path]

    def _pool(self, key: str, path: Path, action: LlamaAction, prompt: list[int], slots: int
              ) -> SequencePool:
        """The document's context ``key`` (P's, or an action's: Q never shares P's cells, so
        each side's sequences lie in its context as in llama.cpp's own run of one), with
        ``slots`` sequences of the horizon: P steps K rows, Q its own and P's path."""
        if key not in self._pools:
            cells = len(prompt) + slots * self.horizon + 1
            context = self._context(path, action, -(-cells // 256) * 256, slots + 1)
            lib, model = self.lib, self._model(path)
            vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
            self._pools[key] = SequencePool(context, vocab, prompt, slots)
            self.prefills += 1
        return self._pools[key]

    def _context(self, path: Path, action: LlamaAction, n_ctx: int, sequences: int) -> Any:
        """A llama.cpp context of ``path``'s model with the action's cache settings and a
        unified KV buffer of ``n_ctx`` cells for ``sequences`` sequences; one line naming the
        action where llama.cpp refuses the settings."""
        lib, model = self.lib, self._model(path)
        params = lib.llama_context_default_params()
        params.n_ctx = params.n_batch = n_ctx
        params.n_seq_max = sequences
        params.kv_unified = True
        params.type_k = GGML_TYPE_IDS[action.type_k]
        params.type_v = GGML_TYPE_IDS[action.type_v]
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if action.flash_attention
                                  else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        context = lib.llama_init_from_model(model, params)
        if not context:
            raise ValueError(f"action {action.name!r}: llama.cpp cannot make a context with "
                             f"k={action.type_k}, v={action.type_v}, fa="
                             f"{'on' if action.flash_attention else 'off'} for "
                             f"{str(path)!r} (this build or this model does not offer it)")
        return context

    def check_actions(self, actions: Sequence[str]) -> None:
        """Make (and free) a small context of P's file for each action's cache settings, so a
        combination this llama.cpp build or model does not offer (flash attention where the
        build lacks it, a cache type) is refused before anything is written."""
        seen = set()
        for name in actions:
            action = parse_llama_action(name)
            settings = (action.type_k, action.type_v, action.flash_attention)
            if settings not in seen:
                seen.add(settings)
                self.lib.llama_free(self._context(self.p_file, action, 256, 1))

    def close_document(self) -> None:
        """Free this document's contexts."""
        for pool in self._pools.values():
            pool.close()
        self._pools = {}

    def close(self) -> None:
        """Free every context and model."""
        self.close_document()
        for model in self._models.values():
            self.lib.llama_model_free(model)
        self._models = {}
