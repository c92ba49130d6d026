"""What each column of kvdrift's tables means, in one place: ``kvdrift run``'s and ``kvdrift
study``'s terminal tables and a notebook's table show the same header for a quantity (the
registry's, ``P(τ≤32)`` at H = 32) and the same legend line, which names the column of
``to_frame()`` that holds it (``p_diverge``). Here, not in :mod:`kvdrift.report`: a
notebook's table reads it, and importing the report sets matplotlib's backend."""

from __future__ import annotations

from kvdrift.analysis import registry

#: Quantity or reading (its ``to_frame()`` / ``--json`` name) -> what it is, in words.
MEANINGS = {
    "p_diverge": "share of replicates whose P and Q texts part within the horizon H",
    "R": "expected share of the H positions where P's and Q's tokens differ",
    "R_tv": "the same risk from each position's TV (same mean, never a larger variance)",
    "E": "exposure: the horizon left after the first mismatch",
    "C": "rate: how often positions differ once the texts have parted",
    "F": "fixed-history TV risk: Q's TV from P read along P's own text",
    "R_minus_F": "R_TV minus F: the risk the texts' parting adds to Q's per-token error",
    "B": "late-minus-early branch TV after the first mismatch (> 0: the texts keep drifting "
         "apart; needs --depths)",
    "kl": "mean KL(P || Q) per position along P's text (teacher-forced)",
    "acceptance": "speculative decoding's acceptance with Q drafting for P (1 − F)",
    "tokens_per_round": "tokens per verification round with Q drafting 4 tokens for P",
}

#: Readings along P's text: (header, name) as the run table shows them.
READINGS = (("KL", "kl"), ("accept", "acceptance"), ("tok/round(4)", "tokens_per_round"))


def header(name: str, horizon: int) -> str:
    """The header of a quantity (its registry text, H filled in) or of a reading."""
    reading = dict((n, h) for h, n in READINGS).get(name)
    if reading is not None:
        return reading
    return registry.quantity(name).text.format(H=horizon)


def lines(names: list[str], horizon: int) -> list[str]:
    """One legend line per column shown: ``P(τ≤32) (p_diverge): share of ...``."""
    out = []
    for name in names:
        if name not in MEANINGS:
            continue
        shown = header(name, horizon)
        alias = "" if shown == name else f" ({name})"
        out.append(f"{shown}{alias}: {MEANINGS[name]}")
    return out
