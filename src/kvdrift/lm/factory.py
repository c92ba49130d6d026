"""Kernel pairs for a stream of (document, action) units on one loaded model.

Actions of a document share one full-cache prefill: the factory keeps the last
document's prompt ids and reference cache, so a run that loops actions inside
documents prefills each prompt once for P plus once per evicting action.

An :class:`LMPairSource` names a model instead of holding one, so that a process that
computes units elsewhere (a Ray worker) can build its own factory from it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvdrift.data.document import Document
from kvdrift.lm.model import LoadedModel, encode_prompt, load_model, load_tokenizer
from kvdrift.lm.pair import LMKernelPair, PromptCache, prefill


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

    def load(self) -> LoadedModel:
        return load_model(self.model, self.device, self.dtype)

    def __call__(self) -> LMPairFactory:
        return LMPairFactory(self.load(), self.chat_template)


def driver_side(
    source: LMPairSource, in_process: bool, load: Callable[[], LoadedModel] | None = None
) -> tuple[Any, Callable[[], LMPairFactory]]:
    """What the driver needs for one model: its tokenizer, and the builder of pair factories.

    An in-process executor shares the driver's model (``load()``, default ``source.load()``);
    any other gets ``source`` itself and loads the model in each worker, so the driver loads
    only the tokenizer.
    """
    if not in_process:
        return load_tokenizer(source.model), source
    loaded = load() if load else source.load()
    return loaded.tokenizer, functools.partial(LMPairFactory, loaded, source.chat_template)
