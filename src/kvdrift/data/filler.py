"""Haystack filler: plain, essay-like sentences from a small built-in grammar.

The filler carries no digits and none of the needle vocabulary, so inserted needles are the
only place where a task's evidence appears. Sentences come from a seeded, prefix-stable stream:
growing a haystack appends sentences and never changes earlier ones.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvdrift import checks
from kvdrift.data.words import (
    FILLER_MOODS,
    FILLER_OBJECTS,
    FILLER_PLACES,
    FILLER_REFLECTIONS,
    FILLER_SCENES,
    FILLER_SUBJECTS,
    FILLER_TIMES,
    FILLER_VERBS,
)

SENTENCES_PER_PARAGRAPH = 6


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _sentence(rng: random.Random) -> str:
    """One filler sentence; the template and its slots are drawn from ``rng``."""
    subject, verb = rng.choice(FILLER_SUBJECTS), rng.choice(FILLER_VERBS)
    obj = rng.choice(FILLER_OBJECTS)
    place, time = rng.choice(FILLER_PLACES), rng.choice(FILLER_TIMES)
    scene, mood = rng.choice(FILLER_SCENES), rng.choice(FILLER_MOODS)
    template = rng.randrange(7)
    if template == 0:
        return _cap(f"{subject} {verb} {obj} {place}.")
    if template == 1:
        return _cap(f"{time}, {subject} {verb} {obj}.")
    if template == 2:
        return _cap(f"{scene} was {mood} {time}.")
    if template == 3:
        return _cap(f"{subject} {verb} {obj} {time}, and then walked home {place}.")
    if template == 4:
        return f"Everyone agreed that {subject} had {verb} {obj} with great care."
    if template == 5:
        return _cap(f"{subject} said that {scene} looked {mood} {time}.")
    return rng.choice(FILLER_REFLECTIONS)


class FillerStream:
    """Prefix-stable sequence of filler sentences for one seed."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._sentences: list[str] = []

    def take(self, n: int) -> list[str]:
        """The first ``n`` sentences of the stream."""
        while len(self._sentences) < n:
            self._sentences.append(_sentence(self._rng))
        return self._sentences[:n]


def weave(sentences: Sequence[str], inserts: Sequence[tuple[float, str]]) -> str:
    """Join filler sentences into paragraphs, placing each insert at its relative depth.

    ``inserts`` are ``(depth, text)`` pairs with depth in [0, 1]: 0 puts the text before the
    first sentence, 1 after the last. Inserts at the same position keep their given order.
    """
    n = len(sentences)
    at: dict[int, list[str]] = {}
    for depth, text in inserts:
        checks.number(depth, "insert depth", 0, 1)
        at.setdefault(round(depth * n), []).append(text)
    paragraphs: list[str] = []
    current: list[str] = []
    for i in range(n + 1):
        current.extend(at.get(i, ()))
        if i == n:
            break
        current.append(sentences[i])
        if (i + 1) % SENTENCES_PER_PARAGRAPH == 0:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)
