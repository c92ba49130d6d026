"""Built-in, offline RULER-style long-context documents, sized to a tokenizer's token budget.

``generate(RulerConfig(...), count_tokens)`` makes ``documents_per_stratum`` documents for every
(family, target length) stratum. Each document is seeded from (seed, family, target, index)
alone, so it does not depend on which other strata are generated or in what order.
See ``kvdrift.data.ruler_tasks`` for the task families, and ``kvdrift.data.chain_task`` for
``chain``, a long task whose answer comes after a chain of steps (not among the default
families: its generation must be long, ``horizon`` ~ 12 tokens per step).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvdrift import checks, limits
from kvdrift.data.chain_task import ChainTask
from kvdrift.data.document import Document
from kvdrift.data.metric_names import FINAL_ANSWER
from kvdrift.data.ruler_tasks import (
    NEEDLE_TYPES,
    NIAH_FAMILIES,
    TaskDraft,
    build_cwe,
    build_fwe,
    build_niah,
    build_vt,
)
from kvdrift.data.sizing import fit_to_length, length_band, token_counter

RULER_FAMILIES: tuple[str, ...] = NIAH_FAMILIES + ("vt", "cwe", "fwe")
"""RULER's task families: the default of a RULER source."""
CHAIN = "chain"
TASK_FAMILIES: tuple[str, ...] = RULER_FAMILIES + (CHAIN,)
"""Every family a RULER source may name: RULER's and the long ``chain``."""
MIN_TARGET_TOKENS = 512  # the longest fixed text (4 uuid needles + question) is ~310 tokens


def _as_tuple(value: Any, what: str) -> tuple:
    if isinstance(value, str | int):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise ValueError(f"{what} must be a sequence; got {value!r}") from None


@dataclass(frozen=True)
class RulerConfig:
    """Which RULER-style documents to generate.

    Parameters
    ----------
    families
        Task families, a subset of ``TASK_FAMILIES`` (default: ``RULER_FAMILIES``).
    needle_types
        Value types for the needle families (``"word"``, ``"number"``, ``"uuid"``); documents
        of a needle stratum cycle through them. Ignored by ``vt``, ``cwe`` and ``fwe``.
    target_lengths
        Token budgets; each prompt ends up within a few percent below its budget.
    documents_per_stratum
        Documents per (family, target length) stratum.
    seed
        Master seed; same config, same documents.
    question_after
        Split each prompt where the task's question starts: the haystack is the context an
        action compresses, the question is asked after it (kvpress's pipeline protocol);
        false (default): the whole prompt is compressed.
    """

    families: Sequence[str] = RULER_FAMILIES
    needle_types: Sequence[str] = NEEDLE_TYPES
    target_lengths: Sequence[int] = (4096,)
    documents_per_stratum: int = 8
    seed: int = 0
    question_after: bool = False

    def __post_init__(self) -> None:
        families = _as_tuple(self.families, "families")
        needle_types = _as_tuple(self.needle_types, "needle_types")
        lengths = _as_tuple(self.target_lengths, "target_lengths")
        object.__setattr__(self, "families", families)
        object.__setattr__(self, "needle_types", needle_types)
        object.__setattr__(self, "target_lengths", lengths)
        _check_choices(families, TASK_FAMILIES, "family", "families")
        _check_choices(needle_types, NEEDLE_TYPES, "needle type", "needle_types")
        checks.distinct_items(lengths, "target_lengths", "one or more distinct token counts")
        for length in lengths:
            _check_length(length)
        bands = [length_band(n) for n in lengths]
        if len(set(bands)) != len(bands):
            raise ValueError(
                f"target lengths {list(lengths)} give duplicate stratum labels {bands}"
            )
        limits.count(self.documents_per_stratum, "documents_per_stratum",
                     limits.MAX_PER_STRATUM)
        n = len(lengths) * len(families) * self.documents_per_stratum
        if n > limits.MAX_DOCUMENTS:
            raise ValueError(limits.too_many_documents("a RULER source", n, 0))
        checks.integer(self.seed, "seed")
        if not isinstance(self.question_after, bool):
            raise ValueError(f"question_after must be true or false; got "
                             f"{self.question_after!r}")


def _check_length(length: Any) -> None:
    checks.integer(length, "a target length", MIN_TARGET_TOKENS,
                   rule=f"an integer >= {MIN_TARGET_TOKENS} (tokens)")
    limits.count(length, "a target length (tokens)", limits.MAX_PROMPT_TOKENS)


def _check_choices(values: tuple, allowed: tuple[str, ...], what: str, field_name: str) -> None:
    checks.distinct_items(values, field_name, f"one or more distinct of {', '.join(allowed)}")
    for value in values:
        checks.choice(value, what, allowed)


def document_seed(seed: int, family: str, target_tokens: int, index: int) -> int:
    """Seed of one document, from its coordinates only (stable across Python processes)."""
    key = f"kvdrift-ruler/{seed}/{family}/{target_tokens}/{index}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def _draft(family: str, rng: random.Random, target_tokens: int, needle_type: str) -> TaskDraft:
    if family in NIAH_FAMILIES:
        return build_niah(family, rng, needle_type)
    if family == "vt":
        return build_vt(rng)
    if family == "cwe":
        return build_cwe(rng, target_tokens)
    if family == "fwe":
        return build_fwe(rng)
    # in make_document's words (its checks.choice refuses an unknown family first)
    raise checks.refuse("family", f"one of {', '.join(TASK_FAMILIES)}", family)


def make_document(
    family: str,
    target_tokens: int,
    count_tokens: Callable[[str], int] | Any,
    *,
    seed: int = 0,
    index: int = 0,
    needle_type: str = "number",
    question_after: bool = False,
) -> Document:
    """One RULER-style document of ``family`` with at most ``target_tokens`` prompt tokens.

    ``count_tokens`` is a ``str -> int`` counter or a Hugging Face tokenizer. ``needle_type``
    applies to the needle families only. ``question_after`` splits the prompt where its
    question starts (:class:`RulerConfig`); the text is the same either way.
    """
    checks.choice(family, "family", TASK_FAMILIES)
    _check_length(target_tokens)
    count = token_counter(count_tokens)
    doc_seed = document_seed(seed, family, target_tokens, index)
    if family == CHAIN:
        chain = ChainTask(random.Random(doc_seed))
        fit = fit_to_length(chain.render, count, target_tokens)
        draft = TaskDraft(chain.render, (str(chain.answer(fit.units)),),
                          chain.meta(fit.units) | {"metric": FINAL_ANSWER})
    else:
        draft = _draft(family, random.Random(doc_seed), target_tokens, needle_type)
        fit = fit_to_length(draft.render, count, target_tokens)
    band = length_band(target_tokens)
    is_niah = family in NIAH_FAMILIES
    meta = {
        "source": "ruler",
        "family": family,
        "needle_type": needle_type if is_niah else None,
        "target_tokens": target_tokens,
        "n_tokens": fit.tokens,
        "filler_units": fit.units,
        "seed": seed,
        "index": index,
        "answers": list(draft.answers),
        **draft.meta,
    }
    prompt, question = fit.text, None
    if question_after:
        separator = "\n\n" + draft.question
        if not draft.question or not prompt.endswith(separator):
            raise RuntimeError(f"{family}: the rendered prompt does not end with its question")
        prompt, question = prompt[:-len(separator)], separator
    return Document(
        id=f"ruler-{family}-{band}-s{seed}-{index:03d}",
        prompt=prompt,
        stratum=f"{family}-{band}",
        answer=", ".join(draft.answers),
        meta=meta,
        question=question,
    )


def document_count(config: RulerConfig) -> int:
    """How many documents :func:`generate` makes of ``config`` (no tokenizer needed)."""
    return len(config.target_lengths) * len(config.families) * config.documents_per_stratum


def generate(config: RulerConfig, count_tokens: Callable[[str], int] | Any) -> list[Document]:
    """All documents of ``config``: target lengths outermost, then families, then index.

    ``count_tokens`` is a ``str -> int`` counter or a Hugging Face tokenizer.
    """
    count = token_counter(count_tokens)
    docs = []
    for target in config.target_lengths:
        for family in config.families:
            for index in range(config.documents_per_stratum):
                needle_type = config.needle_types[index % len(config.needle_types)]
                docs.append(
                    make_document(
                        family, target, count, seed=config.seed, index=index,
                        needle_type=needle_type, question_after=config.question_after,
                    )
                )
    return docs
