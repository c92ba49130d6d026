"""One prompt to study: the unit that strata, bootstraps and stores are built on."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from kvdrift import checks
from kvdrift.data.metric_names import METRIC_NAMES
from kvdrift.text import has_visible_text


class DocumentError(ValueError):
    """A document (or a line of a documents file) that cannot be measured or scored."""


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_answer(value: Any) -> bool:
    return isinstance(value, str) and has_visible_text(value)


def answer_problem(answer: Any, meta: dict[str, Any]) -> str | None:
    """What is wrong with a document's expected answers and metric, or None.

    An empty answer would be found in every output (every output scored correct), so
    answers must be strings with visible text (not only whitespace or zero-width
    characters); ``meta["answers"]`` must be a non-empty list of them; a ``metric`` must
    name a known metric and needs answers to score against.
    """
    if answer is not None and not _is_answer(answer):
        return f"key 'answer' must be a non-empty string or null; got {answer!r:.80}"
    answers = meta.get("answers")
    if answers is not None and (not isinstance(answers, list | tuple) or not answers
                                or not all(_is_answer(a) for a in answers)):
        return f"key 'answers' must be a non-empty list of non-empty strings; got {answers!r:.80}"
    metric = meta.get("metric")
    if metric is not None:
        if not isinstance(metric, str) or metric not in METRIC_NAMES:
            return (f"key 'metric' must be one of {', '.join(METRIC_NAMES)}; "
                    f"got {metric!r:.80}")
        if answer is None and answers is None:
            return (f"metric {metric!r} needs expected answers to score against; give 'answer' "
                    "or 'answers', or leave out 'metric' for a free-form prompt")
    return None


@dataclass(frozen=True)
class Document:
    """A prompt with a stable id, the stratum it is averaged in, and an optional expected answer.

    A document with a ``question`` splits its text as kvpress's own pipeline does: ``prompt``
    is the *context*, which an action compresses, and ``question`` is asked after the
    compression, its tokens (and the chat template's tail) appended uncompressed for P and Q
    alike (docs/method.md, "Two protocols"). Without one the whole prompt is compressed.

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
    question
        The question asked after the compressed context (``""``: only the template's tail
        follows it, as kvpress's pipeline without a question); ``None``: the whole prompt is
        compressed.
    """

    id: str
    prompt: str
    stratum: str = "default"
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, hash=False)
    question: str | None = None

    def __post_init__(self) -> None:
        checks.text(self.id, "document id")
        checks.text(self.prompt, f"document {self.id!r}: prompt", visible=True)
        checks.text(self.stratum, f"document {self.id!r}: stratum")
        if self.question is not None and not isinstance(self.question, str):
            raise DocumentError(f"document {self.id!r}: question must be a string or None; got "
                                f"{self.question!r:.80}")
        for name in ("id", "prompt", "stratum", "answer", "question"):
            value = getattr(self, name)
            if isinstance(value, str) and not _is_unicode(value):
                raise DocumentError(f"document {self.id!r}: {name} holds half of a surrogate "
                                    "pair (not a character); text must be valid Unicode")
        if not isinstance(self.meta, dict):
            raise DocumentError(f"document {self.id!r}: meta must be a dict; got {self.meta!r}")
        problem = answer_problem(self.answer, self.meta)
        if problem is not None:
            raise DocumentError(f"document {self.id!r}: {problem}")

    @property
    def protocol(self) -> str:
        """What an action compresses: :data:`WHOLE_PROMPT` or :data:`CONTEXT_THEN_QUESTION`."""
        return WHOLE_PROMPT if self.question is None else CONTEXT_THEN_QUESTION


WHOLE_PROMPT = "whole prompt"
"""Protocol of a document without a question: the whole prompt (template included) is
compressed, as ``model.generate`` inside a press does."""
CONTEXT_THEN_QUESTION = "context, then question"
"""Protocol of a document with a question: the context alone is compressed, then the question
and the template's tail are appended uncompressed, as kvpress's pipeline does."""


def documents_sha256(docs: list[Document]) -> str:
    """A content hash of documents (ids, prompts, strata, answers, meta), in order: what a
    store compares on resume instead of the file they were read from."""
    digest = hashlib.sha256()
    for d in docs:
        record = {"id": d.id, "prompt": d.prompt, "stratum": d.stratum, "answer": d.answer,
                  "meta": d.meta} | ({} if d.question is None else {"question": d.question})
        digest.update(json.dumps(record, sort_keys=True, ensure_ascii=False, default=str)
                      .encode("utf-8", "surrogatepass") + b"\n")
    return digest.hexdigest()
