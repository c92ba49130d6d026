"""The language-model kernel pair: full prompt cache (P) versus an evicted one (Q).

One document, one action. :func:`~kvdrift.lm.engine.prefill.prefill` gives the full prompt cache
(side ``"p"``) and, inside the action's kvpress press context, the compressed one (side
``"q"``); this module steps path states over them. The first generated position is computed
before eviction, so both sides start from the full-cache prefill logits (``delta_1 = 0``).
Generated entries are kept, except under a ``decoding-*`` action, whose per-row compressions
during generation are in :mod:`kvdrift.lm.engine.decoding` (``evictions`` of a Q state: every
slot kept and masked) or, for a state started with ``rewind=False``, in
:mod:`kvdrift.lm.engine.live_rows` (only the entries the press keeps).

Path states
-----------
A state holds ``n`` rows, each a generated history on one side. The side's prompt cache is
stored once and shared by every row of every path on that side (:mod:`kvdrift.lm.engine.cache`);
only generated entries are per row, and decoding attends to both with the shared-prompt
attention of :mod:`kvdrift.lm.engine.shared_attention`::

    cache      SharedPromptCache: per layer the shared prompt [1, kv_heads, kept, head_dim]
               and generated slots [n, kv_heads, G, head_dim]
    mask       [n, G] long, 1 = valid generated slot, 0 = hole
    slot_step  [n, G] long, generated index held by each slot (-1: an entry a row holding
               only its live entries kept at its last compression, lm/engine/live_rows.py)
    tokens     [n, T] long, generated tokens (row i valid up to lengths[i])
    lengths    [n] long, generated length per row
    logits     [n, V] float32, next-token logits of each row (temperature 1)

Because the cache's physical length is not the token position after eviction, every decoding
step passes explicit ``position_ids`` (true positions ``n_prompt + t - 1`` for the t-th
generated token).

``select`` and ``join`` copy only generated entries, never the prompt, so forks are cheap.
``truncate`` never re-prefills and runs no forward pass: slots of generated tokens at index >=
the new length become holes (mask 0), and the rows' next-token logits become *stale*. They are
computed only if asked for (``logprobs``): on a throw-away fork of the stale rows, the last kept
token is fed again at its true position with its own slot hidden. An estimator that truncates
and then advances (SWRB's branch) never pays for it. Rows truncated to length 0 take the stored
prefill logits. Holes cost memory but keep everything batched; later tokens are appended at
the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from kvdrift import checks
from kvdrift.kernel import Side, check_side
from kvdrift.lm.actions.spec import Action, parse_action
from kvdrift.lm.engine.cache import HOLE_STEP, GroupedCache, SharedPromptCache
from kvdrift.lm.engine.decoding import (
    DecodeEvictions,
    DecodingRule,
    capture_attention_inputs,
    compress_rows,
)
from kvdrift.lm.engine.decoding_cam import CamRows, CamRule, merge_seed
from kvdrift.lm.engine.decoding_presses import stage_rule
from kvdrift.lm.engine.live_rows import LiveRows, compact_rows
from kvdrift.lm.engine.prefill import (
    PromptCache,
    as_prompt,
    attention_modules,
    own_prefill_reason,
    prefill,
    prefill_shared,
    prepare_presses,
    unwrap_model,
)
from kvdrift.lm.engine.press_path import KEPT_ENTRIES, STORED_BYTES, PressCache
from kvdrift.lm.engine.row_invariant import row_invariant_keys
from kvdrift.lm.engine.shared_attention import ATTENTION_NAME, attention_implementation, hidden_bias
from kvdrift.lm.quantized.transform import GeneratedView, kv_memory


@dataclass(frozen=True, eq=False)
class LMPathState:
    """Opaque batched state of an :class:`LMKernelPair` (see the module docstring)."""

    side: Side
    cache: SharedPromptCache
    mask: torch.Tensor  # [n, G] long
    slot_step: torch.Tensor  # [n, G] long
    tokens: torch.Tensor  # [n, T] long
    lengths: torch.Tensor  # [n] long
    logits: torch.Tensor  # [n, V] float32 (rows flagged in ``stale`` hold old values)
    stale: torch.Tensor  # [n] bool, rows whose logits must be recomputed (after truncate)
    # Q rows under decode-time eviction: every slot kept and masked (rewindable), or only
    # the live entries (lm/engine/live_rows.py)
    evictions: DecodeEvictions | LiveRows | CamRows | None = None
    # host-side: whether any row may be stale (False: ``logprobs`` reads nothing from ``stale``,
    # so a decoding loop without truncation never waits for the device)
    maybe_stale: bool = False
    # host-side: an upper bound of ``lengths`` (rows holding only live entries have fewer
    # generated slots than tokens, so the slots no longer bound the history)
    longest: int = 0

    @property
    def n(self) -> int:
        """Number of rows."""
        return self.lengths.shape[0]

class LMKernelPair:
    """Kernel pair for one document: P = full prompt cache, Q = cache evicted by ``action``.

    Parameters
    ----------
    model : transformers causal LM or :class:`~kvdrift.lm.loading.model.LoadedModel`
    prompt_ids : LongTensor ``[n]`` or ``[1, n]``
    action : :class:`~kvdrift.lm.actions.spec.Action` or its spec string (e.g. ``"snapkv-half"``)
    reference : optional full-cache :class:`PromptCache` of the same prompt, to share one
        reference prefill across several actions of a document.
    compressed : optional prompt cache of ``action`` on the same prompt (from
        :func:`~kvdrift.lm.engine.prefill.prefill_shared`), instead of running its own prefill.
    general : optional Q cache made by a press object (the general path,
        :func:`~kvdrift.lm.engine.press_path.press_prompt_cache`): used as the press left it, with
        its logits and decoding-time rule; ``action`` then only names it.
    eos_token_id : overrides the model's EOS. By default the primary (first) id of
        ``generation_config.eos_token_id`` (falling back to ``config.eos_token_id``).
    question_after : the prompt ends with a question appended after the context was compressed
        (:func:`~kvdrift.lm.engine.question.append_question`): ``reference`` and ``compressed``
        (or ``general``) are given, and each side keeps its own first next-token logits.
    """

    def __init__(
        self,
        model: Any,
        prompt_ids: torch.Tensor,
        action: Action | str,
        *,
        reference: PromptCache | None = None,
        compressed: PromptCache | None = None,
        general: PressCache | None = None,
        eos_token_id: int | None = None,
        question_after: bool = False,
    ) -> None:
        self.model = unwrap_model(model)
        self.action = parse_action(action)
        ids = as_prompt(prompt_ids, self.model)
        self.n_prompt = ids.shape[1]
        window = getattr(self.model.config, "max_position_embeddings", None)
        if window is not None and self.n_prompt >= window:
            raise ValueError(f"the prompt has {self.n_prompt} tokens, more than the model's "
                             f"context window allows ({window} positions, including generated "
                             f"ones); shorten the document")
        self.general = general
        if general is not None:
            compressed = general.cache
        elif (reference is None and compressed is None and own_prefill_reason(self.action) is
                None and not self.action.prefill_is_noop(self.n_prompt)):
            # set-up close to one prefill: P's cache and Q's from one forward, entry for entry
            # what a prefill inside the press keeps (lm/engine/prefill.py)
            shared = prefill_shared(self.model, ids, [self.action])
            reference = shared.reference
            compressed = shared.compressed[self.action.name]
        if reference is None:
            reference = prefill(self.model, ids)
        elif reference.n_prompt != self.n_prompt or not reference.is_full:
            raise ValueError(f"reference must be the full cache of this {self.n_prompt}-token "
                             f"prompt; got n_prompt={reference.n_prompt}, kept "
                             f"{sorted(set(reference.counts.flatten().tolist()))}")
        if general is None and self.action.prefill_is_noop(self.n_prompt):
            compressed = reference  # bit-identical to full: no prefill press runs
        elif compressed is not None:
            if compressed.n_prompt != self.n_prompt:
                raise ValueError(f"compressed must be a cache of this {self.n_prompt}-token "
                                 f"prompt; got n_prompt={compressed.n_prompt}")
        else:
            compressed = prefill(self.model, ids, self.action)
        quant = self.action.quantization
        if compressed is not reference and general is None and not question_after and not (
                quant is not None and quant.before_attention):
            # the first generated position is computed before eviction (and before KIVI
            # quantizes): share P's logits; a gguf or fp8 prefill attends to quantized entries
            compressed = dataclasses.replace(compressed, logits=reference.logits)
        self._prompt: dict[str, PromptCache] = {"p": reference, "q": compressed}
        self._rule = general.rule if general is not None else None
        if self.action.decoding is not None:
            self._rule = stage_rule(self.action.decoding)
        if self._rule is not None:
            self._rule = self._rule.for_prompt(self.n_prompt)
            if isinstance(self._rule, CamRule):  # when its layers compress (records' schedule)
                kept = {int(k.shape[2]) for k in self._prompt["q"].keys}
                self._rule = dataclasses.replace(
                    self._rule, prompt_kept=kept.pop() if len(kept) == 1 else None)
            self._rule.check(None if general is not None else self.action.name)
            prepare_presses(self.model, [self._rule.press])  # as kvpress's context would
        self._modules = sorted(attention_modules(self.model), key=lambda m: m.layer_idx)
        self._eos = eos_token_id if eos_token_id is not None else _primary_eos(self.model)
        self._vocab = self.model.get_output_embeddings().weight.shape[0]
        self._dtype = reference.keys[0].dtype  # the attention's queries and keys
        self._merge_key = 0  # CAMPress: the key of Q rows' merge seeds (key_merges)
        self._q_rows = 0  # CAMPress: Q rows started so far (the next row's number)

    # --- protocol properties -------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Size of the model's output logits (may be smaller than the tokenizer's length)."""
        return self._vocab

    @property
    def eos_token_id(self) -> int | None:
        """Primary EOS id (the first one if the generation config lists several)."""
        return self._eos

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def q_is_p(self) -> bool:
        """Whether Q is P by construction (no entry evicted for this prompt, e.g. ``full``).

        Then both sides share one prompt cache, and equal histories in equally shaped batches
        give bit-identical logprobs; batches of different shapes may differ by float noise.
        """
        return self._prompt["q"] is self._prompt["p"] and self._rule is None

    def kv_memory(self) -> tuple[float, float]:
        """``(kv_bytes, kv_fraction)`` of Q's prompt cache (:func:`~kvdrift.lm.quantized.transform.
        kv_memory`): bytes held, and their fraction of P's full cache in the model's dtype
        (the general path: bytes as stored, :func:`~kvdrift.lm.engine.press_path.stored_memory`)."""
        if self.general is not None:
            return self.general.kv_bytes, self.general.kv_fraction
        pc = self._prompt["q"]
        return kv_memory(pc.keys, pc.live, self.n_prompt, self.action.quantization)

    def weights_memory(self) -> tuple[float, float]:
        """``(weights_bytes, weights_fraction)``: the model's weights at their dtype, and 1
        (Q runs on P's model; two models: :class:`~kvdrift.lm.generators.pair.GeneratorPair`)."""
        held = {id(p): p.numel() * p.element_size() for p in self.model.parameters()}
        return float(sum(held.values())), 1.0

    @property
    def kv_measure(self) -> str:
        """How :meth:`kv_memory` was obtained (the records' ``kv_measure``)."""
        return STORED_BYTES if self.general is not None else KEPT_ENTRIES

    @property
    def decoding_rule(self) -> DecodingRule | CamRule | None:
        """How Q's rows are compressed during generation (None: they are not)."""
        return self._rule

    def key_merges(self, key: int) -> None:
        """Key the merge draws of the Q rows started from now on (a ``CAMPress``'s, a random
        part of Q, :mod:`~kvdrift.lm.engine.decoding_cam`) with ``key`` (the runner gives the
        unit's seed); rows are numbered from 0 again."""
        self._merge_key, self._q_rows = int(key), 0

    def prompt_cache(self, side: Side) -> PromptCache:
        """The side's prompt cache (``"q"``: after eviction)."""
        return self._prompt[check_side(side)]

    # --- protocol methods -------------------------------------------------------------------
    def start(self, side: Side, n: int, *, rewind: bool = True, slots: int = 0) -> LMPathState:
        """``n`` rows with the empty history over the side's prompt cache (shared, not copied).

        Under a decoding-time press, ``rewind=False`` keeps only what the press keeps (memory
        O(target + interval), :mod:`~kvdrift.lm.engine.live_rows`): the rows can then be
        truncated only to lengths after their last compression. ``rewind=True`` keeps every
        slot, masked, so a row can go back to any length (:mod:`~kvdrift.lm.engine.decoding`).
        ``slots``: the tokens the rows will be advanced by (0: not known); rows that keep every
        generated entry allocate their buffers for them at once
        (:meth:`~kvdrift.lm.engine.cache.SharedPromptCache.empty`), rows holding only what a
        press keeps stay at their bounded size."""
        pc = self._prompt[check_side(side)]
        n = checks.integer(n, "number of rows", 1)
        slots = checks.integer(slots, "slots", 0)
        dev = self.device
        evictions: DecodeEvictions | LiveRows | CamRows | None = None
        if isinstance(self._rule, CamRule) and side == "q":
            # merged values live in the row: it holds only its live entries, whatever rewind
            seeds = [merge_seed(self._merge_key, self._q_rows + i) for i in range(n)]
            self._q_rows += n
            evictions = self._rule.start_rows(pc.keys, n, self.model.config.hidden_size,
                                              pc.keys[0].dtype, seeds)
        elif self._rule is not None and side == "q":
            # a threshold rule (DMS) hides entries per head as they leave its window: its rows
            # stay rewindable, every slot kept and masked
            masked = rewind or not isinstance(self._rule, DecodingRule)
            hidden = self.model.config.hidden_size
            evictions = (DecodeEvictions.start(pc.keys, n, hidden, pc.keys[0].dtype,
                                               self._rule.target) if masked else
                         LiveRows.start(pc.keys, n, hidden, pc.keys[0].dtype, self._rule.window))
        bounded = isinstance(evictions, (LiveRows, CamRows))
        return LMPathState(
            side=side,
            cache=SharedPromptCache.empty(pc.keys, pc.values, n, pc.live,
                                          reserve=0 if bounded else slots),
            mask=torch.empty(n, 0, dtype=torch.long, device=dev),
            slot_step=torch.empty(n, 0, dtype=torch.long, device=dev),
            tokens=torch.empty(n, 0, dtype=torch.long, device=dev),
            lengths=torch.zeros(n, dtype=torch.long, device=dev),
            logits=pc.logits.expand(n, -1),
            stale=torch.zeros(n, dtype=torch.bool, device=dev),
            evictions=evictions,
        )

    def logprobs(self, state: LMPathState) -> torch.Tensor:
        """``[n, V]`` float64 log-softmax of each row's next-token logits (temperature 1)."""
        logits = state.logits
        if state.maybe_stale and bool(state.stale.any()):
            rows = torch.nonzero(state.stale).squeeze(-1)
            logits = logits.index_copy(0, rows, self._refed_logits(self.select(state, rows)))
        return torch.log_softmax(logits.to(torch.float64), dim=-1)

    def _refed_logits(self, fork: LMPathState) -> torch.Tensor:
        """Next-token logits of rows after truncate: feed the last kept token again at its true
        position, its own slot hidden (``fork`` is consumed; its rows have length >= 1)."""
        last = fork.lengths - 1
        tok = fork.tokens.gather(1, last[:, None]).squeeze(1)
        mask = fork.mask * (fork.slot_step != last[:, None]).long()
        [(logits, _, _)] = self._step([_Rows(fork, mask, tok, self.n_prompt + last,
                                             torch.zeros_like(tok, dtype=torch.bool),
                                             live_after=last)])
        return logits

    def advance(self, state: LMPathState, tokens: torch.Tensor) -> LMPathState:
        """Append ``tokens[i]`` to row ``i`` with one batched decoding step (reuses the cache).

        Under decode-time eviction, rows that reach a compression length then compress."""
        return self.advance_many([state], [tokens])[0]

    def advance_many(
        self, states: list[LMPathState], tokens: list[torch.Tensor], *, checked: bool = True,
    ) -> list[LMPathState]:
        """Advance several states (of either side) in one model call: ``advance`` of each.

        Rows of every state go through the weights together; the shared-prompt attention
        groups them by side (runs of consecutive states of one side read their prompt in one
        call) and each row attends its own generated entries. Logits equal separate
        ``advance`` calls to float noise (matrix products over a different number of rows).
        When Q is P by construction (:attr:`q_is_p`, e.g. ``full``) every state is its own
        forward, so a P state and a Q state with equal inputs go through equally shaped
        calls and stay bit-identical whatever the BLAS (a forced Q state never joins Y's).

        ``checked=False`` skips the range check of the tokens (a host read of the device): the
        estimators pass tokens drawn from the pair's own ``[n, V]`` distributions, in range by
        construction.
        """
        if len(states) != len(tokens):
            raise ValueError(f"need one token tensor per state; got {len(states)} states and "
                             f"{len(tokens)} token tensors")
        if not states:
            return []
        if len({id(s.cache) for s in states}) < len(states):
            raise ValueError("a state appears twice in advance_many (a state is consumed by "
                             "advancing it); select a copy of its rows instead")
        toks = [self._check_tokens(s, t, checked) for s, t in zip(states, tokens, strict=True)]
        rows = [_Rows(s, s.mask, tok, self.n_prompt + s.lengths,
                      torch.ones_like(tok, dtype=torch.bool), live_after=s.lengths)
                for s, tok in zip(states, toks, strict=True)]
        # When Q is P (nothing evicted), P and Q rows with equal inputs must get bit-identical
        # logits, but a BLAS rounds a row differently depending on the number of rows in the
        # call (docs/engine.md): then each state is its own forward, so X's and Y's calls have
        # equal shapes even when forced rows (Q along X) are stepped too.
        calls = ([[i] for i in range(len(states))] if self.q_is_p
                 else [list(range(len(states)))])
        steps: list[Any] = [None] * len(states)
        for call in calls:
            for i, step in zip(call, self._step([rows[i] for i in call]), strict=True):
                steps[i] = step
        return [self._advanced(s, tok, *step)
                for s, tok, step in zip(states, toks, steps, strict=True)]

    def _advanced(self, state: LMPathState, tok: torch.Tensor, logits: torch.Tensor,
                  mask: torch.Tensor, seen: dict[int, Any]) -> LMPathState:
        """The state after its decoding step wrote ``tok``'s slot (logits ``[n, V]``)."""
        history = state.tokens
        # lengths <= longest (every advance adds one token to every row, truncate only
        # shortens): a bound the host knows, so growing the history never reads the device
        if history.shape[1] <= state.longest:
            grow = max(16, history.shape[1])
            history = torch.cat([history, history.new_zeros(state.n, grow)], dim=1)
        history = history.scatter(1, state.lengths[:, None], tok[:, None])
        lengths = state.lengths + 1
        slot_step = torch.cat([state.slot_step, state.lengths[:, None]], dim=1)
        evictions, cache = state.evictions, state.cache
        if isinstance(evictions, CamRows):
            evictions, cache, mask, slot_step = self._rule.advanced(
                evictions, lengths, mask, slot_step, cache, self._modules, seen)
        elif evictions is not None:
            evictions = evictions.appended(state.lengths, [seen[i][0][:, -1]
                                                           for i in range(len(self._modules))])
            rows = torch.nonzero(self._rule.compresses(lengths)).squeeze(-1)
            positions = {i: seen[i][1] for i in seen}
            if hasattr(self._rule, "check_step"):  # a press that may fail at any step
                self._rule.check_step(evictions, lengths, cache, self._modules, positions)
            if rows.numel() and isinstance(evictions, LiveRows):
                evictions, cache, mask, slot_step = compact_rows(
                    self._rule, evictions, rows, lengths, mask, slot_step, cache,
                    self._modules, positions)
            elif rows.numel():
                evictions = compress_rows(self._rule, evictions, rows, lengths, mask.bool(),
                                          slot_step, cache, self._modules, positions)
        return dataclasses.replace(
            state, cache=cache, mask=mask, slot_step=slot_step, tokens=history, lengths=lengths,
            logits=logits, stale=torch.zeros_like(state.stale), evictions=evictions,
            maybe_stale=False, longest=state.longest + 1,
        )

    def truncate(self, state: LMPathState, lengths: torch.Tensor) -> LMPathState:
        """Rows at the shorter prefixes ``lengths`` (no re-prefill; see the module docstring)."""
        new = torch.as_tensor(lengths, dtype=torch.long, device=self.device).reshape(-1)  # [n]
        if new.shape[0] != state.n:
            raise ValueError(f"lengths must have one entry per row ({state.n}); got {new.shape[0]}")
        if bool((new < 0).any()) or bool((new > state.lengths).any()):
            raise ValueError(f"lengths must be in [0, current length]; got {new.tolist()} "
                             f"for current {state.lengths.tolist()}")
        mask = state.mask * (state.slot_step < new[:, None]).long()  # later slots: holes
        empty = new == 0
        stale = (state.stale | (new < state.lengths)) & ~empty
        logits = state.logits
        if bool(empty.any()):
            logits = torch.where(empty[:, None], self._prompt[state.side].logits, logits)
        evictions = state.evictions
        if isinstance(evictions, (LiveRows, CamRows)):
            evictions = evictions.truncated(new, state.lengths)
        elif evictions is not None:
            evictions = evictions.truncated(new)
        return dataclasses.replace(state, mask=mask, lengths=new, logits=logits, stale=stale,
                                   evictions=evictions, maybe_stale=bool(stale.any()))

    def select(self, state: LMPathState, rows: torch.Tensor, *,
               checked: bool = True) -> LMPathState:
        """A state made of the given rows, in that order (copies only generated entries).
        ``checked=False`` skips the range check (a host read of the device)."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.device).reshape(-1)
        if idx.numel() == 0:
            raise ValueError("select needs at least one row")
        if checked and bool(((idx < 0) | (idx >= state.n)).any()):
            raise ValueError(f"rows must be in [0, {state.n}); got {idx.tolist()}")
        return LMPathState(
            side=state.side, cache=state.cache.take(idx), mask=state.mask.index_select(0, idx),
            slot_step=state.slot_step.index_select(0, idx),
            tokens=state.tokens.index_select(0, idx),
            lengths=state.lengths.index_select(0, idx),
            logits=state.logits.index_select(0, idx),
            stale=state.stale.index_select(0, idx),
            evictions=state.evictions.take(idx) if state.evictions is not None else None,
            maybe_stale=state.maybe_stale, longest=state.longest,
        )

    def join(self, states: list[LMPathState]) -> LMPathState:
        """All rows of several states of one side, in order (copies only generated entries).

        States with fewer generated slots or a shorter token history are padded with holes.
        """
        if not states:
            raise ValueError("join needs at least one state")
        side = states[0].side
        if any(s.side != side for s in states):
            raise ValueError(f"only states of one side can be joined; got "
                             f"{sorted({s.side for s in states})}")
        width = max(s.mask.shape[1] for s in states)
        history = max(s.tokens.shape[1] for s in states)

        def pad(t: torch.Tensor, to: int, value: int) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, to - t.shape[1]), value=value)

        return LMPathState(
            side=side,
            cache=SharedPromptCache.join([s.cache for s in states]),
            mask=torch.cat([pad(s.mask, width, 0) for s in states]),
            slot_step=torch.cat([pad(s.slot_step, width, HOLE_STEP) for s in states]),
            tokens=torch.cat([pad(s.tokens, history, 0) for s in states]),
            lengths=torch.cat([s.lengths for s in states]),
            logits=torch.cat([s.logits for s in states]),
            stale=torch.cat([s.stale for s in states]),
            evictions=_joined_evictions([s.evictions for s in states], width),
            maybe_stale=any(s.maybe_stale for s in states),
            longest=max(s.longest for s in states),
        )

    # --- internals ----------------------------------------------------------------------------
    def _check_tokens(self, state: LMPathState, tokens: torch.Tensor,
                      checked: bool = True) -> torch.Tensor:
        tok = torch.as_tensor(tokens, device=self.device).reshape(-1).long()  # [n]
        if tok.shape[0] != state.n:
            raise ValueError(f"need one token per row ({state.n}); got {tok.shape[0]}")
        if checked and bool(((tok < 0) | (tok >= self._vocab)).any()):
            raise ValueError(f"tokens must be in [0, {self._vocab}); got {tok.tolist()}")
        return tok

    def _step(self, parts: list[_Rows]) -> list[tuple[torch.Tensor, torch.Tensor, dict]]:
        """One decoding step for all rows of every part, in one model call; returns per part
        its logits ``[n, V]``, its mask ``[n, G + 1]`` and, under decode-time eviction, each
        layer's attention inputs (else empty).

        The query always attends to its own new slot; ``valid`` only decides whether later
        steps see it (a re-fed token leaves a hole).
        """
        slots, lives, biases = [], [], []
        for part in parts:
            if part.state.cache.get_seq_length() != part.mask.shape[1]:
                raise RuntimeError("path state was already consumed (cache and mask lengths "
                                   "differ); advance/truncate may reuse storage, so use the "
                                   "returned state")
            slots.append(torch.cat([part.mask.bool(), part.mask.new_ones(part.mask.shape[0], 1,
                                                                         dtype=torch.bool)], 1))
            # the same as an additive mask [n, 1, 1, G + 1], built once for every layer
            biases.append(hidden_bias(~slots[-1][:, None, None, :], self._dtype))
            ev = part.state.evictions
            lives.append(None if ev is None else ev.live(part.live_after))
        extra: dict[str, Any] = {}
        if len(parts) == 1:
            cache: Any = parts[0].state.cache
            physical = parts[0].mask.shape[1]
            extra["kvdrift_slots"] = slots[0]
            extra["kvdrift_slot_bias"] = biases[0]
            if lives[0] is not None:
                extra["kvdrift_live"] = lives[0]
        else:  # states of one side next to each other share one pass over their prompt
            sides = [part.state.side for part in parts]
            groups = [0]
            for before, side in zip(sides, sides[1:], strict=False):
                groups.append(groups[-1] + (side != before))
            cache = GroupedCache([part.state.cache for part in parts], groups)
            physical = 0  # per part; the grouped layers do not read it
            extra["kvdrift_slots"] = slots
            extra["kvdrift_slot_bias"] = biases
            if any(live is not None for live in lives):
                extra["kvdrift_live"] = lives
        capture: Any = contextlib.nullcontext({})
        if any(live is not None for live in lives):
            capture = capture_attention_inputs(self._modules)
        quant = self.action.quantization
        if quant is not None:  # what a Q row's attention reads of its generated entries
            views = [GeneratedView(quant, torch.cat([part.state.slot_step,
                                                     part.live_after[:, None]], dim=1),
                                   slots[i], part.live_after) if part.state.side == "q" else None
                     for i, part in enumerate(parts)]
            if len(parts) == 1:
                if views[0] is not None:
                    extra["kvdrift_quant"] = views[0]
            elif any(v is not None for v in views):
                extra["kvdrift_quant"] = views
        # under a decoding-time press the first layer's keys and values are the same bits in
        # any batch, so its exact ties fall the same way in every batch (lm/engine/row_invariant)
        rows_alone: Any = contextlib.nullcontext()
        if self._rule is not None:
            rows_alone = row_invariant_keys(self._modules[0])
        with torch.no_grad(), attention_implementation(self.model, ATTENTION_NAME), \
                capture as seen, rows_alone:
            out = self.model(
                input_ids=torch.cat([part.tokens for part in parts])[:, None],
                position_ids=torch.cat([part.positions for part in parts])[:, None],
                past_key_values=cache,
                cache_position=torch.tensor([physical], device=self.device),
                use_cache=True,
                kvdrift_cache=cache,
                **extra,
            )
        logits = out.logits[:, -1].float()  # [rows of all parts, V]
        results, start = [], 0
        for part in parts:
            stop = start + part.tokens.shape[0]
            rows = slice(start, stop)
            part_seen = {} if part.state.evictions is None else {
                i: (hidden[rows], None if pos is None else tuple(t[rows] for t in pos))
                for i, (hidden, pos) in seen.items()}
            mask = torch.cat([part.mask, part.valid.long()[:, None]], dim=1)
            results.append((logits[rows] if len(parts) > 1 else logits, mask, part_seen))
            start = stop
        return results


@dataclass(frozen=True, eq=False)
class _Rows:
    """One state's rows in a decoding step (see :meth:`LMKernelPair._step`)."""

    state: LMPathState
    mask: torch.Tensor  # [n, G] long
    tokens: torch.Tensor  # [n] long
    positions: torch.Tensor  # [n] long, true positions
    valid: torch.Tensor  # [n] bool, whether the new slot counts for later steps
    live_after: torch.Tensor  # [n] long, decode-time evictions up to this step apply


def _joined_evictions(parts: list[Any], width: int
                      ) -> DecodeEvictions | LiveRows | CamRows | None:
    """The decode-time eviction records of joined states (one kind: all rewindable or all
    holding only their live entries)."""
    kinds = {type(p) for p in parts}
    if len(kinds) > 1:
        raise ValueError("cannot join states started with rewind=True and rewind=False (one "
                         "keeps every slot, the other only the live entries)")
    if parts[0] is None:
        return None
    if isinstance(parts[0], LiveRows):
        return LiveRows.join(parts, width)
    if isinstance(parts[0], CamRows):
        return CamRows.join(parts, width)
    return DecodeEvictions.join(parts, width, max(p.inputs[0].shape[1] for p in parts))


def _primary_eos(model: Any) -> int | None:
    """The model's EOS id: the first of ``generation_config.eos_token_id`` if it is a list."""
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        if eos is not None:
            return int(eos)
    return None
