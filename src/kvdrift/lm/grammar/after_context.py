"""Which actions a document with a question can take, known without importing kvpress or torch.

A document with a question (kvpress's pipeline protocol, docs/documents.md) has its context
compressed, then the question appended. kvdrift measures compressions at prefill that way, and
a ``DecodingPress`` given as a press object (:mod:`kvdrift.lm.engine.question_decoding`); a
decoding-time spec (``decoding-*``, ``cam-*``) or a quantization is measured on whole-prompt
documents only. :func:`spec_refusal` tells from an action spec's names alone (the static copy
in :mod:`kvdrift.lm.grammar.names`) what :func:`kvdrift.lm.actions.spec.parse_action` would
find in its ``decoding`` and ``quantization``, so that ``kvdrift run`` and ``kvdrift study``
refuse such a study before torch loads, with nothing written (a test holds the two against
each other); :func:`refusal` is the one line every such refusal gives.
"""

from __future__ import annotations

from collections.abc import Collection

from kvdrift.lm.grammar.model_spec import split_model
from kvdrift.lm.grammar.names import NAMED_ACTIONS, QUANTIZATIONS, press_chain, split_prefix

#: The families that compress during decoding (:attr:`~kvdrift.lm.actions.presses.Family.
#: is_decoding`), as spec prefixes.
DECODING_FAMILIES = ("decoding", "decoding-adakv", "cam")

#: What a whole-prompt document is, as a refusal tells the user to give one.
WHOLE_PROMPT_HINT = "give 'prompt', not 'context' and 'question'"


def refusal(name: str, *, decoding: bool, quantization: bool, document: str | None = None,
            hint: str = WHOLE_PROMPT_HINT, what: str = "action") -> str | None:
    """The one line refusing action ``name`` (``what``: or a frontier's family) on a document
    with a question (``document``: the one that has it, named where known; ``hint``: how to
    give whole-prompt documents instead), or None where it may take one."""
    where = "" if document is None else f", and {document} asks a question after its context"
    if decoding:
        return (f"{what} {name!r} compresses during decoding; over a question kvdrift "
                f"measures only kvpress's DecodingPress with a target_size (alone or in a "
                f"PrefillDecodingPress) given as a press object{where} ({hint})")
    if quantization:
        return (f"{what} {name!r} quantizes the cache; kvdrift measures quantization on "
                f"whole-prompt documents only{where} ({hint})")
    return None


def _is_quantization(part: str) -> bool:
    return part.strip().lower().partition(":")[0] in QUANTIZATIONS


def spec_kinds(spec: str, defined: Collection[str] = ()) -> tuple[bool, bool]:
    """``(decodes, quantizes)`` of an action spec, from its names alone (as
    ``parse_action(spec).decoding is not None`` and ``.quantization is not None`` for a spec
    the parser accepts); ``defined``: names of press objects (a press object alone is
    neither here: :func:`kvdrift.lm.engine.question.press_refusal` asks the object)."""
    head, _ = split_model(spec.strip())
    text = head.strip()
    if not text or text in NAMED_ACTIONS or text in defined:
        return False, False
    if press_chain(text, defined) is not None:  # <press object>+<quantization>
        return False, True
    parts = [part.strip() for part in text.split("+")]
    quantizes = _is_quantization(parts[-1])
    if quantizes:
        parts.pop()
    last = parts[-1].partition(":")[0] if parts else ""
    return split_prefix(last)[0] in DECODING_FAMILIES, quantizes


def spec_refusal(spec: str, defined: Collection[str] = (), document: str | None = None,
                 hint: str = WHOLE_PROMPT_HINT, what: str = "action") -> str | None:
    """:func:`refusal` of the action spec ``spec`` (or a frontier's family, ``what``) on a
    document with a question (None: it may take one), before kvpress is imported."""
    decoding, quantization = spec_kinds(spec, defined)
    return refusal(spec, decoding=decoding, quantization=quantization, document=document,
                   hint=hint, what=what)
