"""The prompt a replicate continues: the end of its document's prompt, as the model saw it.

The store records each document with its prompt's token ids (:mod:`kvdrift.run.documents`);
the last ones are decoded with the run's tokenizer. Nothing is read again from the study's
sources: a store copied elsewhere shows the same prompts. A store written before documents were
recorded shows none, and ``note`` says so in one line; so does a document recorded with another
prompt or tokenizer than the unit shown (their fingerprints differ).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvdrift.examples.decoding import TokenText
from kvdrift.run.documents import RecordedDocument

#: What a document's fingerprint must share with a unit's for its prompt to be the unit's.
SAME = ("prompt_sha256", "chat_template", "tokenizer_sha256")


@dataclass(frozen=True)
class Prompts:
    """A store's recorded documents by (model, document id); None for a store written before
    documents were recorded."""

    documents: Mapping[tuple[str, str], RecordedDocument] | None

    @property
    def note(self) -> str | None:
        if self.documents is None:
            return ("the prompts are not shown: this store was written before kvdrift recorded "
                    "its documents")
        return None

    def tail(self, model: str, doc_id: str, unit: Mapping[str, Any] | None, texts: TokenText,
             tokens: int) -> tuple[str | None, str | None]:
        """The last ``tokens`` tokens of the prompt of ``doc_id`` decoded together, or None
        with a one-line note on why not (``unit``: the fingerprint of the unit shown)."""
        found = (self.documents or {}).get((model, doc_id))
        if found is None or found.prompt_ids is None:
            return None, (None if self.documents is None else
                          f"the prompt of document {doc_id!r} is not shown: the store holds "
                          "no token ids for it")
        recorded = found.fingerprint or {}
        if unit is not None and any(k in unit and recorded.get(k) != unit[k] for k in SAME):
            return None, (f"the prompt of document {doc_id!r} is not shown: it was recorded "
                          "for another prompt or tokenizer than its units' records")
        return texts.text(found.prompt_ids[-tokens:]), None
