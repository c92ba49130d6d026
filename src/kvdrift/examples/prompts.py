"""The prompt a replicate continues: the end of its document's prompt, as the model saw it.

The store records each document with its prompt's token ids (:mod:`kvdrift.run.documents`);
the last ones are decoded with the run's tokenizer. Nothing is read again from the study's
sources: a store copied elsewhere shows the same prompts. A store written before documents were
recorded shows none, and ``note`` says so in one line. A document is recorded with the
fingerprint of its units (the store rewrites it when a unit is recomputed under other
settings), so its token ids are the ones its units ran on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvdrift.examples.decoding import TokenText
from kvdrift.run.documents import RecordedDocument


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

    def tail(self, model: str, doc_id: str, texts: TokenText, tokens: int
             ) -> tuple[str | None, str | None]:
        """The last ``tokens`` tokens of the prompt of ``doc_id`` decoded together, or None
        with a one-line note on why not."""
        found = (self.documents or {}).get((model, doc_id))
        if found is None or found.prompt_ids is None:
            return None, (None if self.documents is None else
                          f"the prompt of document {doc_id!r} is not shown: the store holds "
                          "no token ids for it")
        return texts.text(found.prompt_ids[-tokens:]), None
