"""Task metrics: how a generated text is scored against a document's expected answers.

The two metrics are RULER's (Hsieh et al., 2024, https://arxiv.org/abs/2404.06654,
``scripts/eval/synthetic/constants.py``), per output rather than as a percentage over a set:

- ``string_match_all``: the fraction of expected answers that occur in the output
  (``ref.lower() in pred.lower()``, a plain case-insensitive substring test: no tokenization,
  no punctuation stripping). RULER uses it for the needle (``niah_*``), variable-tracking
  (``vt``), common-words (``cwe``) and frequent-words (``fwe``) families.
- ``string_match_part``: 1 if any expected answer occurs in the output, else 0. RULER uses it
  for question answering (``qa_*``).
- ``final_answer`` (kvdrift's, for a task whose answer comes after a chain of steps, such as
  the ``chain`` family): 1 if the first number after the output's *last* ``Final answer:``
  (case-insensitive) equals an expected answer as a number, else 0 (0 too when the output
  writes no ``Final answer:``). A number written anywhere else in the chain does not count,
  so a chain that happens to pass through the answer is not scored right.

Before matching, an output is cleaned as RULER's ``postprocess_pred`` does: control characters
become newlines and surrounding whitespace is dropped (neither changes a substring match of a
printable answer). A document's expected answers are ``meta["answers"]`` where present (the
RULER-style generator and Hugging Face list answers set it), else its ``answer``. Its metric is
``meta["metric"]`` where a document names one (e.g. a JSONL key ``"metric"``), else RULER's
choice for its ``meta["family"]`` (``qa`` families: ``string_match_part``), else
``string_match_all``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvdrift import checks
from kvdrift.data.metric_names import FINAL_ANSWER, STRING_MATCH_ALL, STRING_MATCH_PART

if TYPE_CHECKING:
    from kvdrift.data.document import Document

Metric = Callable[[str, Sequence[str]], float]

_CONTROL = re.compile(r"[\x00-\x1f]")
_FINAL = re.compile(r"final answer\s*:", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def postprocess(prediction: str) -> str:
    """RULER's ``postprocess_pred``: control characters to newlines, then strip."""
    return _CONTROL.sub("\n", prediction).strip()


def _found(prediction: str, references: Sequence[str]) -> list[float]:
    if not references:
        raise ValueError("a task metric needs at least one expected answer")
    pred = postprocess(prediction).lower()
    return [1.0 if ref.lower() in pred else 0.0 for ref in references]


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Fraction of ``references`` found in ``prediction`` (case-insensitive substrings)."""
    found = _found(prediction, references)
    return sum(found) / len(found)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 if any of ``references`` is found in ``prediction`` (case-insensitive), else 0.0."""
    return max(_found(prediction, references))


def final_answer(prediction: str, references: Sequence[str]) -> float:
    """1.0 if the first number after the last ``Final answer:`` of ``prediction`` equals one
    of ``references`` as a number, else 0.0 (no ``Final answer:``, or no number after it)."""
    if not references:
        raise ValueError("a task metric needs at least one expected answer")
    text = postprocess(prediction)
    marks = list(_FINAL.finditer(text))
    if not marks:
        return 0.0
    number = _NUMBER.search(text[marks[-1].end():])
    if number is None:
        return 0.0
    found = float(number.group())
    return 1.0 if any(_as_number(ref) == found for ref in references) else 0.0


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


METRICS: dict[str, Metric] = {
    STRING_MATCH_ALL: string_match_all,
    STRING_MATCH_PART: string_match_part,
    FINAL_ANSWER: final_answer,
}


def expected_answers(doc: Document) -> tuple[str, ...] | None:
    """The answers ``doc``'s output is scored against; None for a free-form document."""
    listed = doc.meta.get("answers")
    if isinstance(listed, list | tuple) and listed:
        return tuple(str(a) for a in listed)
    return None if doc.answer is None else (doc.answer,)


def metric_name(doc: Document) -> str:
    """The metric that scores ``doc`` (see the module docstring for the rule)."""
    named = doc.meta.get("metric")
    if named is not None:
        # as Document words it: a document whose meta was changed after it was checked
        return str(checks.choice(named, f"document {doc.id!r}: key 'metric'", METRICS))
    family = str(doc.meta.get("family") or "")
    return STRING_MATCH_PART if family.startswith("qa") else STRING_MATCH_ALL


def score_text(doc: Document, text: str) -> float:
    """``doc``'s metric on one generated text, in [0, 1]; NaN for a free-form document."""
    answers = expected_answers(doc)
    if answers is None:
        return float("nan")
    return METRICS[metric_name(doc)](text, answers)
