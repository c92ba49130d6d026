"""RULER-style task families: each builds a prompt renderer for a growing haystack.

Families follow the task types of RULER (Hsieh et al., 2024, "RULER: What's the Real Context
Size of Your Long-Context Language Models?", https://arxiv.org/abs/2404.06654); templates,
filler and vocabularies here are our own. A builder draws everything about a document from its
``rng`` except the amount of filler, and returns a ``TaskDraft`` whose ``render(n)`` gives the
full prompt with ``n`` filler units; ``kvdrift.data.sizing`` then picks ``n``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvdrift import checks
from kvdrift.data.filler import FillerStream, weave
from kvdrift.data.words import KEY_ADJECTIVES, KEY_NOUNS, VALUE_WORDS, WordStream

NIAH_FAMILIES: tuple[str, ...] = (
    "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery"
)
NEEDLE_TYPES: tuple[str, ...] = ("word", "number", "uuid")

NIAH_DISTRACTORS = 3  # other-key needles in niah_multikey
NIAH_VALUES = 4  # values of the one key in niah_multivalue
NIAH_QUERIES = 4  # keys asked about in niah_multiquery
VT_HOPS = 4  # assignments after the first in each variable chain
VT_CHAINS = 2  # one asked-about chain plus distractor chains
CWE_TOP = 10  # common words asked for
FWE_TOP = 3  # frequent words asked for
FWE_ALPHA = 2.0  # Zipf exponent of the coded text
FWE_WORDS_PER_LINE = 12

_KIND = {"word": ("word", "words"), "number": ("number", "numbers"), "uuid": ("code", "codes")}


@dataclass(frozen=True)
class TaskDraft:
    """A document before sizing: its prompt as a function of filler units, and its answers."""

    render: Callable[[int], str]
    answers: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    question: str = ""  # the rendered prompt's last paragraph: the task's natural question


# ---------------------------------------------------------------- values drawn from the rng


def _uuid(rng: random.Random) -> str:
    """A uuid-formatted string from the seeded ``rng`` (not ``uuid.uuid4``)."""
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _values(rng: random.Random, needle_type: str, n: int) -> list[str]:
    """``n`` distinct needle values of one type."""
    if needle_type == "word":
        return rng.sample(VALUE_WORDS, n)
    out: list[str] = []
    while len(out) < n:
        value = str(rng.randint(1_000_000, 9_999_999)) if needle_type == "number" else _uuid(rng)
        if value not in out:
            out.append(value)
    return out


def _keys(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct needle keys such as ``"amber-falcon"`` (no word shared between keys)."""
    pairs = zip(rng.sample(KEY_ADJECTIVES, n), rng.sample(KEY_NOUNS, n), strict=True)
    return [f"{a}-{b}" for a, b in pairs]


def _depths(rng: random.Random, n: int) -> list[float]:
    """``n`` insertion depths in [0, 1], in increasing order."""
    return sorted(round(rng.random(), 4) for _ in range(n))


# ------------------------------------------------------------------- needle in a haystack

_NIAH_INTRO = (
    "A long text follows. Hidden inside it are a few special {kinds}, each tied to a name in "
    "quotes. Read carefully and remember them: a question about them comes after the text."
)
_NEEDLE = 'Remember this: the hidden {kind} that belongs to "{key}" is {value}.'
_NEEDLE_MULTI = 'Remember this: one hidden {kind} that belongs to "{key}" is {value}.'
_Q_ONE = (
    'Question: What is the hidden {kind} that belongs to "{key}"?\n'
    'Answer: The hidden {kind} that belongs to "{key}" is'
)
_Q_MULTIVALUE = (
    'Question: "{key}" has several hidden {kinds} in the text. What are all of them?\n'
    'Answer: The hidden {kinds} that belong to "{key}" are'
)
_Q_MULTIQUERY = (
    "Question: What are the hidden {kinds} that belong to {keys}?\n"
    "Answer: The hidden {kinds} that belong to them are"
)


def _haystack_prompt(
    filler: FillerStream, intro: str, inserts: list[tuple[float, str]], question: str
) -> Callable[[int], str]:
    def render(n: int) -> str:
        return f"{intro}\n\n{weave(filler.take(n), inserts)}\n\n{question}"

    return render


def _quoted_list(keys: list[str]) -> str:
    quoted = [f'"{k}"' for k in keys]
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


def build_niah(family: str, rng: random.Random, needle_type: str) -> TaskDraft:
    """Needle-in-a-haystack variants: single, multikey, multivalue, multiquery."""
    checks.choice(family, "needle family", NIAH_FAMILIES)
    checks.choice(needle_type, "needle type", NEEDLE_TYPES)
    kind, kinds = _KIND[needle_type]
    filler = FillerStream(rng.getrandbits(64))
    intro = _NIAH_INTRO.format(kinds=kinds)
    if family in ("niah_single", "niah_multikey"):
        n_keys = 1 + (NIAH_DISTRACTORS if family == "niah_multikey" else 0)
        keys, values = _keys(rng, n_keys), _values(rng, needle_type, n_keys)
        question = _Q_ONE.format(kind=kind, key=keys[0])
        answers = values[:1]
        asked = keys[:1]
    elif family == "niah_multivalue":
        key, values = _keys(rng, 1)[0], _values(rng, needle_type, NIAH_VALUES)
        keys = [key] * NIAH_VALUES
        question = _Q_MULTIVALUE.format(kinds=kinds, key=key)
        answers, asked = values, [key]
    else:  # niah_multiquery, the last of NIAH_FAMILIES (checked above)
        keys, values = _keys(rng, NIAH_QUERIES), _values(rng, needle_type, NIAH_QUERIES)
        question = _Q_MULTIQUERY.format(kinds=kinds, keys=_quoted_list(keys))
        answers, asked = values, keys
    template = _NEEDLE_MULTI if family == "niah_multivalue" else _NEEDLE
    texts = [
        template.format(kind=kind, key=k, value=v) for k, v in zip(keys, values, strict=True)
    ]
    # Needles go in at random depths, so the asked-about needle is not always first; the
    # values of one key appear in answer order.
    if family == "niah_multivalue":
        depths = _depths(rng, len(texts))
    else:
        depths = [round(rng.random(), 4) for _ in texts]
    inserts = sorted(zip(depths, texts, strict=True), key=lambda pair: pair[0])
    needles = [
        {"key": k, "value": v, "depth": d} for k, v, d in zip(keys, values, depths, strict=True)
    ]
    return TaskDraft(
        render=_haystack_prompt(filler, intro, inserts, question),
        answers=tuple(answers),
        meta={"needles": needles, "asked_keys": asked},
        question=question,
    )


# --------------------------------------------------------------------- variable tracking

_VT_INTRO = (
    'A long text follows. Hidden inside it are variable assignments of the form "Let NAME = '
    'value." where the value is a number or another variable. Keep track of them: a question '
    "comes after the text."
)
_VT_QUESTION = (
    "Question: After all the assignments in the text, which variables hold the value {value}? "
    "List every one of them.\n"
    "Answer: The variables that hold the value {value} are"
)


def _var_names(rng: random.Random, n: int) -> list[str]:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice(letters) for _ in range(5))
        if name not in names:
            names.append(name)
    return names


def build_vt(rng: random.Random) -> TaskDraft:
    """Variable tracking: chains ``X1 = 12345, X2 = X1, ...``; ask for all names of a value."""
    filler = FillerStream(rng.getrandbits(64))
    length = VT_HOPS + 1
    names = _var_names(rng, VT_CHAINS * length)
    values: list[int] = []
    while len(values) < VT_CHAINS:
        value = rng.randint(10_000, 99_999)
        if value not in values:
            values.append(value)
    inserts: list[tuple[float, str]] = []
    chains = []
    for c in range(VT_CHAINS):
        chain = names[c * length : (c + 1) * length]
        statements = [f"Let {chain[0]} = {values[c]}."] + [
            f"Let {b} = {a}." for a, b in zip(chain, chain[1:], strict=False)
        ]
        # Sorted depths keep each chain in reading order; chains interleave.
        inserts.extend(zip(_depths(rng, length), statements, strict=True))
        chains.append({"value": values[c], "variables": chain})
    inserts.sort(key=lambda pair: pair[0])
    question = _VT_QUESTION.format(value=values[0])
    return TaskDraft(
        render=_haystack_prompt(filler, _VT_INTRO, inserts, question),
        answers=tuple(chains[0]["variables"]),
        meta={"chains": chains},
        question=question,
    )


# --------------------------------------------------------------- common-word extraction

_CWE_INTRO = (
    "Below is a numbered list of words. Some words appear many times in the list, others "
    "only a few times."
)
_CWE_QUESTION = (
    "Question: Which {top} words appear most often in the list above?\n"
    "Answer: The {top} words that appear most often are"
)


def cwe_frequencies(target_tokens: int) -> tuple[int, int]:
    """(repeats of each common word, repeats of each rare word) for a target length.

    Common words take about a third of the budget (assuming ~5 tokens per list item), capped
    at 30 repeats; rare words repeat about a tenth as often, and always less than common ones.
    """
    common = min(30, max(2, int(0.35 * target_tokens / (5 * CWE_TOP))))
    return common, max(1, common // 10)


def build_cwe(rng: random.Random, target_tokens: int) -> TaskDraft:
    """Common-word extraction: a list where ten words are frequent; ask for those ten.

    Filler units are rare words (each repeated a few times).
    """
    common_reps, rare_reps = cwe_frequencies(target_tokens)
    words = WordStream(rng.getrandbits(64))
    order_seed = rng.getrandbits(64)
    question = _CWE_QUESTION.format(top=CWE_TOP)

    def render(n: int) -> str:
        vocab = words.take(CWE_TOP + n)
        items = vocab[:CWE_TOP] * common_reps + vocab[CWE_TOP:] * rare_reps
        random.Random(f"{order_seed}/{n}").shuffle(items)
        listing = "\n".join(f"{i}. {w}" for i, w in enumerate(items, start=1))
        return f"{_CWE_INTRO}\n\n{listing}\n\n{question}"

    return TaskDraft(
        render=render,
        answers=tuple(words.take(CWE_TOP)),
        meta={"common_repeats": common_reps, "rare_repeats": rare_reps},
        question=question,
    )


# ------------------------------------------------------------ frequent-word extraction

_FWE_INTRO = (
    "Below is a coded text made of invented words. Some of the words are used far more often "
    "than others."
)
_FWE_QUESTION = (
    "Question: Which {top} words occur most often in the coded text above? Give them from the "
    "most to the least frequent.\n"
    "Answer: The {top} most frequent words are"
)


def zipf_counts(n_words: int, alpha: float = FWE_ALPHA) -> list[int]:
    """Occurrences per rank summing to ``n_words``, proportional to ``rank ** -alpha``.

    The first ``FWE_TOP + 1`` ranks are made strictly decreasing (adding occurrences where
    rounding ties them), so the top ranks are unambiguous.
    """
    n_ranks = max(FWE_TOP + 1, int((n_words) ** 0.5) + 1)
    weights = [r**-alpha for r in range(1, n_ranks + 1)]
    total = sum(weights)
    counts = [int(n_words * w / total) for w in weights]
    for r in range(n_words - sum(counts)):  # leftovers to the top ranks, keeps order
        counts[r % n_ranks] += 1
    counts = [max(c, 1) for c in counts]
    for r in range(FWE_TOP - 1, -1, -1):
        counts[r] = max(counts[r], counts[r + 1] + 1)
    return counts


def build_fwe(rng: random.Random) -> TaskDraft:
    """Frequent-word extraction: Zipf-distributed invented words; ask for the top three.

    Filler units are words of the coded text.
    """
    words = WordStream(rng.getrandbits(64), real_first=False)
    order_seed = rng.getrandbits(64)
    question = _FWE_QUESTION.format(top=FWE_TOP)

    def render(n: int) -> str:
        counts = zipf_counts(n) if n > 0 else [0] * (FWE_TOP + 1)
        vocab = words.take(len(counts))
        tokens = [w for w, c in zip(vocab, counts, strict=True) for _ in range(c)]
        random.Random(f"{order_seed}/{n}").shuffle(tokens)
        lines = [
            " ".join(tokens[i : i + FWE_WORDS_PER_LINE])
            for i in range(0, len(tokens), FWE_WORDS_PER_LINE)
        ]
        return f"{_FWE_INTRO}\n\n" + "\n".join(lines) + f"\n\n{question}"

    return TaskDraft(render=render, answers=tuple(words.take(FWE_TOP)), meta={},
                     question=question)

