"""Kernel pairs for a stream of (document, action) units on one loaded model.

Actions of a document share one full-cache prefill: the factory keeps the last
document's prompt ids and reference cache, so a run that loops actions inside
documents prefills each prompt once for P plus once per evicting action.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvdrift.data.document import Document
from kvdrift.lm.model import LoadedModel, encode_prompt
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

    @property
    def context_window(self) -> int | None:
        """Most positions the model attends (``max_position_embeddings``), if it says."""
        return getattr(self.loaded.model.config, "max_position_embeddings", None)

    def check_fits(self, documents: Sequence[Document], horizon: int) -> None:
        """Raise a clear error if a prompt plus ``horizon`` generated tokens exceeds the
        model's context window; meant to run before any unit so no work is wasted."""
        window = self.context_window
        if window is None:
            return
        for doc in documents:
            n = int(self.prompt_ids(doc).shape[-1])
            if n + horizon > window:
                raise ValueError(
                    f"document {doc.id!r} has {n} prompt tokens; with H = {horizon} generated "
                    f"positions that exceeds {self.loaded.name}'s context window of {window} "
                    f"tokens (allowed: prompt tokens <= {window - horizon})")

    def __call__(self, doc: Document, action: str) -> LMKernelPair:
        if doc.id != self._doc_id:
            self._doc_id, self._reference = None, None  # never reuse a stale prefill
            self._ids = self.prompt_ids(doc)
            self._reference = prefill(self.loaded.model, self._ids)
            self._doc_id = doc.id
        return LMKernelPair(self.loaded.model, self._ids, action, reference=self._reference)
