"""Kernel pairs for a stream of (document, action) units on one loaded model.

Actions of a document share one full-cache prefill: the factory keeps the last
document's prompt ids and reference cache, so a run that loops actions inside
documents prefills each prompt once for P plus once per evicting action.

An :class:`LMPairSource` names a model instead of holding one, so that a process that
computes units elsewhere (a Ray worker) can build its own factory from it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvdrift.data.document import Document
from kvdrift.lm.model import (
    LoadedModel,
    context_window,
    encode_prompt,
    load_model,
    load_tokenizer,
)
from kvdrift.lm.pair import LMKernelPair
from kvdrift.lm.prefill import PromptCache, prefill


class LMPairFactory:
    """Callable ``(document, action) -> LMKernelPair`` for the runner."""

    def __init__(self, loaded: LoadedModel, chat_template: bool = True):
        self.loaded = loaded
        self.chat_template = chat_template
        self._doc_id: str | None = None
        self._ids = None
        self._reference: PromptCache | None = None

    def prompt_ids(self, doc: Document):
        """Token ids ``[1, n]`` of a document's prompt (chat template applied if enabled)."""
        return encode_prompt(self.loaded.tokenizer, doc.prompt, self.chat_template)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of generated token ids (special tokens dropped): what task scores read."""
        return self.loaded.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def __call__(self, doc: Document, action: str) -> LMKernelPair:
        if doc.id != self._doc_id:
            self._doc_id, self._reference = None, None  # never reuse a stale prefill
            self._ids = self.prompt_ids(doc)
            self._reference = prefill(self.loaded.model, self._ids)
            self._doc_id = doc.id
        return LMKernelPair(self.loaded.model, self._ids, action, reference=self._reference)


@dataclass(frozen=True)
class LMPairSource:
    """A model to load and how: calling it loads the model and returns its pair factory."""

    model: str
    device: str = "auto"
    dtype: str = "float32"
    chat_template: bool = True
    allow_download: bool = False  # fetch a hub id that is not in the local cache

    def load(self) -> LoadedModel:
        return load_model(self.model, self.device, self.dtype,
                          allow_download=self.allow_download)

    def __call__(self) -> LMPairFactory:
        return LMPairFactory(self.load(), self.chat_template)


@dataclass(frozen=True)
class DriverSide:
    """What the driver holds for one model: its tokenizer, the builder of pair factories,
    and the model's context window when the driver loaded the model itself."""

    name: str
    tokenizer: Any
    build: Callable[[], LMPairFactory]
    context_window: int | None


def driver_side(
    source: LMPairSource, in_process: bool, load: Callable[[], LoadedModel] | None = None
) -> DriverSide:
    """What the driver needs for one model.

    An in-process executor shares the driver's model (``load()``, default ``source.load()``);
    any other gets ``source`` itself and loads the model in each worker, so the driver loads
    only the tokenizer and the config (for the context window that :func:`check_fits` checks
    before any unit runs).
    """
    if not in_process:
        return DriverSide(source.model, load_tokenizer(source.model, source.allow_download),
                          source, context_window(source.model, source.allow_download))
    loaded = load() if load else source.load()
    window = getattr(loaded.model.config, "max_position_embeddings", None)
    return DriverSide(source.model, loaded.tokenizer,
                      functools.partial(LMPairFactory, loaded, source.chat_template), window)


def check_fits(
    documents: Sequence[Document], horizon: int, side: DriverSide, chat_template: bool = True
) -> None:
    """Raise a clear error if a prompt plus ``horizon`` generated tokens exceeds the model's
    context window; meant to run before any unit so that no work is wasted."""
    window = side.context_window
    if window is None:
        return
    for doc in documents:
        n = int(encode_prompt(side.tokenizer, doc.prompt, chat_template).shape[-1])
        if n + horizon > window:
            raise ValueError(
                f"document {doc.id!r} has {n} prompt tokens; with H = {horizon} generated "
                f"positions that exceeds {side.name}'s context window of {window} tokens "
                f"(allowed: prompt tokens <= {window - horizon})")
