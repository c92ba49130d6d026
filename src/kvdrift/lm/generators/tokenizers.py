"""One tokenizer for both sides: what differs between two, said in one line.

kvdrift's coupling draws P's and Q's tokens from one vocabulary, and both sides read one
prompt: two models compare only if their tokenizers give the same ids for the same text, name
the same special tokens and wrap a prompt in the same chat template.
"""

from __future__ import annotations

from typing import Any


def _vocab(tokenizer: Any) -> dict[str, int]:
    return dict(tokenizer.get_vocab())


def _special(tokenizer: Any) -> dict[str, str]:
    return {key: str(value) for key, value in
            sorted(getattr(tokenizer, "special_tokens_map", {}).items())}


def tokenizer_difference(p: Any, q: Any) -> str | None:
    """What differs between P's tokenizer ``p`` and Q's ``q`` (vocabulary, special tokens,
    chat template, the rules that split text into ids), or None if they are one tokenizer."""
    from kvdrift.lm.loading.digest import tokenizer_digest

    if tokenizer_digest(p) == tokenizer_digest(q):
        return None
    vp, vq = _vocab(p), _vocab(q)
    if vp != vq:
        only_p = sorted(set(vp) - set(vq))
        only_q = sorted(set(vq) - set(vp))
        moved = sorted(t for t in set(vp) & set(vq) if vp[t] != vq[t])
        detail = "; ".join(part for part in (
            f"{len(only_p)} tokens only P's (e.g. {only_p[0]!r})" if only_p else "",
            f"{len(only_q)} tokens only Q's (e.g. {only_q[0]!r})" if only_q else "",
            f"{len(moved)} tokens with other ids (e.g. {moved[0]!r}: {vp[moved[0]]} vs "
            f"{vq[moved[0]]})" if moved else "") if part)
        return f"the vocabularies differ ({len(vp)} vs {len(vq)} tokens: {detail})"
    sp, sq = _special(p), _special(q)
    if sp != sq:
        key = next(k for k in sorted(set(sp) | set(sq)) if sp.get(k) != sq.get(k))
        return (f"the special tokens differ ({key}: {sp.get(key)!r} vs {sq.get(key)!r})")
    if getattr(p, "chat_template", None) != getattr(q, "chat_template", None):
        return "the chat templates differ"
    return "the tokenizers' rules differ (same vocabulary and special tokens, other merges or " \
           "normalisation)"


def check_one_tokenizer(p: Any, q: Any, q_name: str) -> None:
    """One-line ValueError if Q's tokenizer is not P's (:func:`tokenizer_difference`)."""
    found = tokenizer_difference(p, q)
    if found is not None:
        raise ValueError(f"Q's model {q_name!r} is not on P's tokenizer: {found}; kvdrift "
                         f"compares two generators over one vocabulary and one prompt")
