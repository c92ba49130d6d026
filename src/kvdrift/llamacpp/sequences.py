"""One llama.cpp context's sequences sharing a prompt: where a side's histories live.

A side's context holds the document's prompt once, as sequence 0, and up to ``slots`` generated
histories as sequences ``1..slots`` of one unified KV buffer, so that a sequence copy shares the
prompt's cells instead of copying them. kvdrift's states are token histories; the pool keeps,
for each sequence, the generated tokens its cells hold and the logits after the last one.
:meth:`SequencePool.ensure` makes the logits of every history asked for available with one
``llama_decode`` call: a history its sequence holds already costs nothing, one that extends it
decodes only the new tokens, and one that branches off another history (the forced path,
SWRB's branches, a row selected twice) first copies their common cells into a free sequence.
A sequence's content is only ever a cache: which tokens it holds is checked before it is
used, so a sequence taken over by another history is never read as the old one.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvdrift.llamacpp.binding import llama

PROMPT_SEQ = 0


@dataclass
class _Held:
    """What one sequence holds beyond the prompt."""

    tokens: tuple[int, ...] = ()
    logits: np.ndarray | None = None  # [vocab] float32, after the last of ``tokens``
    used: int = 0  # when it was last asked for (the least recently used is taken over)


@dataclass
class _Plan:
    """One request's work: sequences cleared and copied in order, truncated, then decoded."""

    clears: list[int] = field(default_factory=list)
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # (src, dst, generated)
    truncations: list[tuple[int, int]] = field(default_factory=list)  # (seq, generated kept)
    decode: list[tuple[int, tuple[int, ...], int]] = field(default_factory=list)  # (seq, h, from)


class LlamaCppError(RuntimeError):
    """llama.cpp returned an error code (one line naming the call and the code)."""


class SequencePool:
    """A side's llama.cpp context: the prompt in sequence 0, histories in ``1..slots``.

    ``context`` is a ``llama_context`` made with ``n_seq_max = slots + 1`` and a unified KV
    buffer large enough for the prompt and ``slots`` histories of the horizon; the pool owns
    it and frees it in :meth:`close`."""

    def __init__(self, context: object, vocab_size: int, prompt: Sequence[int], slots: int):
        self._llama = llama()
        self.context = context
        self.memory = self._llama.llama_get_memory(context)
        self.vocab_size = int(vocab_size)
        self.n_prompt = len(prompt)
        self.slots = int(slots)
        self._held = {s: _Held() for s in range(1, self.slots + 1)}
        self._clock = 0
        self.decode_calls = 0  # llama_decode calls so far (benchmarks and tests read it)
        (self.prompt_logits,) = self._decode([(PROMPT_SEQ, i, t, i == len(prompt) - 1)
                                              for i, t in enumerate(prompt)])

    def close(self) -> None:
        """Free the context (the pool is unusable afterwards)."""
        if self.context is not None:
            self._llama.llama_free(self.context)
            self.context = None

    def ensure(self, histories: Sequence[tuple[int, ...]], hints: Sequence[int]
               ) -> tuple[list[int], list[np.ndarray]]:
        """The sequence holding each history and the logits after it (``[vocab]`` float32;
        an empty history's are the prompt's), with at most one decode call. ``hints`` name
        the sequence each history was last held in (-1: none). At most ``slots // 2``
        different non-empty histories per call."""
        self._clock += 1
        unique: dict[tuple[int, ...], int] = {}
        order = sorted(range(len(histories)), key=lambda i: -len(histories[i]))
        for i in order:
            unique.setdefault(tuple(histories[i]), hints[i])
        if sum(1 for h in unique if h) > self.slots // 2:
            raise ValueError(f"at most {self.slots // 2} different histories per call; got "
                             f"{sum(1 for h in unique if h)}")
        plan, where = self._plan(unique)
        self._run(plan)
        seqs, logits = [], []
        for h in histories:
            seq = where.get(tuple(h), PROMPT_SEQ)
            seqs.append(seq)
            logits.append(self.prompt_logits if seq == PROMPT_SEQ else self._held[seq].logits)
        return seqs, logits

    def _plan(self, unique: dict[tuple[int, ...], int]
              ) -> tuple[_Plan, dict[tuple[int, ...], int]]:
        plan = _Plan()
        where: dict[tuple[int, ...], int] = {}
        claimed: set[int] = set()  # sequences this request writes (or reads as they are)
        sources: set[int] = set()  # sequences copied from (kept as they are until copied)
        content = {s: held.tokens for s, held in self._held.items()}  # at copy time
        for h, hint in sorted(unique.items(), key=lambda item: not self._hit(*item)):
            if not h:
                continue
            if self._hit(h, hint) and hint not in claimed:
                where[h] = hint
                claimed.add(hint)
                self._held[hint].used = self._clock
                continue
            seq, common = self._best(h, hint, content)
            if seq is not None and seq not in claimed and seq not in sources:
                if common < len(content[seq]):
                    plan.truncations.append((seq, common))
            else:
                free = self._free(claimed | sources)
                plan.clears.append(free)
                if seq is not None and common:
                    plan.copies.append((seq, free, common))
                    sources.add(seq)
                else:
                    plan.copies.append((PROMPT_SEQ, free, 0))
                content[free] = h[:common]
                seq = free
            claimed.add(seq)
            where[h] = seq
            plan.decode.append((seq, h, common))
        return plan, where

    def _hit(self, h: tuple[int, ...], hint: int) -> bool:
        held = self._held.get(hint)
        return bool(h) and held is not None and held.logits is not None and held.tokens == h

    def _best(self, h: tuple[int, ...], hint: int, content: dict[int, tuple[int, ...]]
              ) -> tuple[int | None, int]:
        """The sequence sharing the longest prefix with ``h`` (the hint first) and that
        prefix's length, at most ``len(h) - 1`` (the last token is decoded for its logits)."""
        most = len(h) - 1
        best, best_common = None, 0
        candidates = ([hint] if hint in content else []) + list(content)
        for seq in candidates:
            tokens = content[seq]
            common = _common_prefix(tokens, h, most)
            if common > best_common or (best is None and common == best_common == 0
                                        and seq == hint):
                best, best_common = seq, common
                if common == most:
                    break
        return (best, best_common) if best_common else (None, 0)

    def _free(self, busy: set[int]) -> int:
        """The least recently used sequence not in ``busy``."""
        free = [s for s in self._held if s not in busy]
        return min(free, key=lambda s: self._held[s].used)

    def _run(self, plan: _Plan) -> None:
        lib, memory = self._llama, self.memory
        for seq in plan.clears:
            lib.llama_memory_seq_rm(memory, seq, -1, -1)
            self._held[seq] = _Held()
        for src, dst, generated in plan.copies:
            lib.llama_memory_seq_cp(memory, src, dst, -1, self.n_prompt + generated)
            tokens = () if src == PROMPT_SEQ else self._held[src].tokens[:generated]
            self._held[dst] = _Held(tokens=tokens)
        for seq, generated in plan.truncations:
            if not lib.llama_memory_seq_rm(memory, seq, self.n_prompt + generated, -1):
                raise LlamaCppError(f"llama_memory_seq_rm could not cut sequence {seq}")
            self._held[seq].tokens = self._held[seq].tokens[:generated]
            self._held[seq].logits = None
        if not plan.decode:
            return
        items = []
        for seq, h, start in plan.decode:
            for j in range(start, len(h)):
                items.append((seq, self.n_prompt + j, h[j], j == len(h) - 1))
        outputs = self._decode(items)
        for (seq, h, _), logits in zip(plan.decode, outputs, strict=True):
            self._held[seq] = _Held(tokens=h, logits=logits, used=self._clock)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> list[np.ndarray]:
        """One ``llama_decode`` of ``(seq, position, token, wants_logits)`` items; the logits
        of the flagged items, in order (copied: the next call overwrites llama's buffer)."""
        lib = self._llama
        n = len(items)
        batch = lib.llama_batch_init(n, 0, 1)
        try:
            for i, (seq, pos, token, wants) in enumerate(items):
                batch.token[i] = int(token)
                batch.pos[i] = int(pos)
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = int(seq)
                batch.logits[i] = 1 if wants else 0
            batch.n_tokens = n
            code = lib.llama_decode(self.context, batch)
            self.decode_calls += 1
            if code != 0:
                raise LlamaCppError(f"llama_decode returned {code} for {n} tokens "
                                    f"(1: no room in the KV cache)")
            outputs = []
            for i, (_, _, _, wants) in enumerate(items):
                if wants:
                    pointer = lib.llama_get_logits_ith(self.context, i)
                    outputs.append(np.ctypeslib.as_array(
                        ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)),
                        shape=(self.vocab_size,)).copy())
            return outputs
        finally:
            lib.llama_batch_free(batch)


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...], most: int) -> int:
    """The length of the common prefix of ``a`` and ``b``, at most ``most``."""
    n = min(len(a), len(b), most)
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
