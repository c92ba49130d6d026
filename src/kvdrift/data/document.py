"""One prompt to study: the unit that strata, bootstraps and stores are built on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    """A prompt with a stable id, the stratum it is averaged in, and an optional expected answer.

    Parameters
    ----------
    id
        Unique within a study; used to pair results across actions and to resume work.
    prompt
        The raw text fed to the model (before any chat template).
    stratum
        Label that strata-weighted statistics group by, e.g. ``"niah_single-4k"``.
    answer
        The expected answer where the task has one (several answers are joined with ``", "``
        and listed in ``meta["answers"]``); ``None`` for free-form prompts.
    meta
        JSON-serialisable facts about the document (task family, target length, ...).
    """

    id: str
    prompt: str
    stratum: str = "default"
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"document id must be a non-empty string; got {self.id!r}")
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ValueError(f"document {self.id!r} has an empty prompt")
        if not isinstance(self.stratum, str) or not self.stratum:
            raise ValueError(
                f"document {self.id!r}: stratum must be a non-empty string; got {self.stratum!r}"
            )
        if self.answer is not None and not isinstance(self.answer, str):
            raise ValueError(
                f"document {self.id!r}: answer must be a string or None; got {self.answer!r}"
            )
        if not isinstance(self.meta, dict):
            raise ValueError(f"document {self.id!r}: meta must be a dict; got {self.meta!r}")
