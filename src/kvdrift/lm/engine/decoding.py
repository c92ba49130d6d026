"""Decode-time eviction (kvpress's ``DecodingPress``) on every row of a path state.

With a ``decoding-<scorer>`` action, Q's cache is compressed again during generation: after the
generated step that brings a row to length ``L`` with ``L % interval == 0`` (every step if
``target <= 1``), each layer scores the row's live entries (prompt and generated, in cache order)
with the scorer, from the attention inputs of the last ``min(interval, buffer + 1)`` steps,
and keeps the ``target`` best per KV head. Rows no longer share a kept set, so the shared
prompt stays stored once and each row carries *when* each entry was evicted::

    prompt   per layer [n, kv_heads, P] int32: step at which the prompt entry was evicted
    own      per layer [n, kv_heads, G] int32: same for the row's generated slots
    inputs   per layer [n, T, hidden]: the attention input at each generated step

An entry is live for the step that feeds token ``L + 1`` iff its eviction step is > ``L``
(``NEVER`` when it was not evicted). Truncating a row to length ``L'`` forgets the evictions
after ``L'`` (they belong to the discarded history), so the forced path of an estimator replays
the row's own compressions along whatever history it is given: Q along X compresses at the same
generated positions as Q along its own draws.

kvpress keeps a compressed cache in score order (the order ``topk`` returns) and appends new
entries after it, and some scorers see that order (SnapKV pools scores over cache neighbours,
StreamingLLM keeps the first entries, ties go to the first): ``order`` records, per row and
compression, the entries left in that order, so every compression scores exactly the sequence
kvpress would. Y then equals kvpress's ``generate`` under ``DecodingPress`` through any number
of compressions (tests pin this for several scorers).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kvpress
import torch
from kvpress.utils import compute_n_kept

from kvdrift.limits import MAX_HORIZON
from kvdrift.lm.actions.presses import Stage, clamp_to_length, fixed_press_randomness
from kvdrift.lm.engine.live_entries import LiveEntries
from kvdrift.lm.engine.press_rules import problems
from kvdrift.lm.engine.row_compression import RowEntries, RowKept
from kvdrift.lm.engine.score_shapes import WrongScores, check_scores

NEVER = torch.iinfo(torch.int32).max  # eviction step of an entry that was never evicted


@dataclass(frozen=True)
class DecodingRule:
    """When and how a row's cache is compressed during generation: kvpress's
    ``DecodingPress`` ``press`` (a ``decoding-<scorer>`` stage's, or a press object given as
    an action; ``CompressionRatioDecodingPress`` too, whose target follows the tokens seen),
    named ``label`` in messages, for a prompt of ``n_prompt`` tokens (:meth:`for_prompt`).

    kvpress counts the steps since a row's last compression and compresses when they reach
    ``interval`` or when the target is at most 1 (every step then): compression ``j`` happens
    after generated step :meth:`step_of` ``(j)``.
    """

    press: Any  # kvpress.DecodingPress (or CompressionRatioDecodingPress) over a ScorerPress
    label: str
    failure: Callable[[str], Exception] = ValueError  # the exception a failing scorer raises
    spec: bool = False  # named by a spec (fields interval=, buffer=), not a press object
    n_prompt: int = 0  # the prompt's tokens (the first generated token is at position n_prompt)
    # kvpress's pipeline over a question: the question's forward was a decoding step before
    # generated step 1, per layer its attention inputs [q, hidden] (lm/engine/question_decoding)
    lead: tuple[torch.Tensor, ...] | None = None

    @staticmethod
    def of_stage(stage: Stage) -> DecodingRule:
        """The rule of a ``decoding-<scorer>`` stage (its kvpress ``DecodingPress``)."""
        return DecodingRule(stage.build(1), stage.label, spec=True)

    def for_prompt(self, n_prompt: int) -> DecodingRule:
        return dataclasses.replace(self, n_prompt=n_prompt)

    @property
    def scorer_name(self) -> str:
        return type(self.press.base_press).__name__

    def target_at(self, length: int) -> int:
        """Entries kept by the compression after generated step ``length`` (kvpress's own
        ``_resolve_target_size`` at that step's position)."""
        position = torch.tensor([[self.n_prompt + length - 1]])
        return int(self.press._resolve_target_size({"position_ids": position}))

    @property
    def target(self) -> int:
        """Entries kept by the first compression (every later one for a ``DecodingPress``)."""
        return self.target_at(self.step_of(1))

    @property
    def interval(self) -> int:
        return int(self.press.compression_interval)

    @functools.cached_property
    def every_step(self) -> int:
        """The first generated steps at which the target is at most 1, so kvpress compresses
        at each of them (unbounded for a ``DecodingPress`` with ``target_size <= 1``)."""
        if int(getattr(self.press, "target_size", 2)) <= 1 and \
                type(self.press)._resolve_target_size is kvpress.DecodingPress._resolve_target_size:
            return _UNBOUNDED
        steps = 0  # (beyond the longest horizon, a target at most 1 is every step for good)
        while self.target_at(steps + 1) <= 1:
            steps += 1
            if steps > MAX_HORIZON:
                return _UNBOUNDED
        return steps

    def index(self, length: int) -> int:
        """Compressions at generated steps ``1..length``."""
        if self.lead is not None:  # the question was step 0
            return (length + 1) // self.interval
        k = self.every_step
        return length if length <= k else k + (length - k) // self.interval

    def step_of(self, j: int) -> int:
        """The generated step after which compression ``j`` (1, 2, ...) happens (0 for j=0;
        -1, the question's step, with a :attr:`lead`)."""
        if self.lead is not None:
            return j * self.interval - 1
        k = self.every_step
        return j if j <= k else k + (j - k) * self.interval

    @property
    def buffer(self) -> int:
        return int(self.press.hidden_states_buffer_size)

    def window_at(self, length: int) -> int:
        """Attention inputs the compression after step ``length`` scores from: the steps
        since the last compression, at most ``buffer + 1`` of them."""
        return min(length - self.step_of(self.index(length) - 1), self.buffer + 1)

    @property
    def window(self) -> int:
        """:meth:`window_at` of every compression after the first ``every_step`` ones."""
        return min(self.interval, self.buffer + 1)

    def led(self, layer_idx: int, inputs: torch.Tensor, start: int) -> torch.Tensor:
        """A compression's attention inputs ``[w, hidden]``: ``inputs`` (steps ``start + 1 ..``),
        after the question's own where the window reaches its step (``start < 0``)."""
        if start >= 0 or self.lead is None:
            return inputs
        return torch.cat([self.lead[layer_idx].to(inputs.dtype), inputs])

    def check(self, action: str | None = None, horizon: int | None = None) -> None:
        """Raise ``failure`` (one line naming ``action`` and the fix) if the press's own rules
        cannot hold (:func:`~kvdrift.lm.engine.press_rules.problems`); a failure that
        names the unit itself is given no ``action``."""
        found = problems(self, horizon)
        if found:
            raise self.failure(found[0] if action is None else f"action {action!r}: {found[0]}")

    def scorer(self, m: int, compression_ratio: float) -> Any:
        """The base scorer for ``m`` live entries at ``compression_ratio`` (a copy of the
        press's own, ``window_size`` and ``n_sink`` clamped to ``m - 1`` as a stage's are)."""
        press = copy.deepcopy(self.press.base_press)
        press.compression_ratio = compression_ratio
        return clamp_to_length(press, m)

    def compress_row(self, module: Any, entries: RowEntries) -> RowKept:
        """One row's compression in one layer (``module``), as kvpress's press does it: the
        ``target_at(length)`` best entries by the scorer, in its ``topk`` order."""
        kv, m = entries.keys.shape[:2]
        target = self.target_at(entries.length)
        if m <= target:  # kvpress keeps all, in the same order
            return RowKept(torch.arange(m, device=entries.keys.device).expand(kv, m))
        hidden = entries.inputs[None]  # [1, w, hidden]
        kwargs = {"hidden_states": hidden, "position_embeddings": entries.position_embeddings}
        base = self.scorer(m, self.press._find_target_compression_ratio(m, target))
        with scoring(self.failure, f"{self.label}: {self.scorer_name} cannot score during "
                                   f"decoding", hidden.device):
            scores = base.score(module, hidden, entries.keys[None], entries.values[None], None,
                                kwargs)  # [1, kv, m]
            check_scores(base, scores, entries.keys[None])
        # topk over the very tensor kvpress's ScorerPress.compress ranks ([1, kv, m]), so an
        # exact tie falls the same way (topk's order among ties is not documented)
        return RowKept(scores.topk(compute_n_kept(m, base.compression_ratio), dim=-1).indices[0])

    def compresses(self, lengths: torch.Tensor) -> torch.Tensor:
        """``[n]`` bool: rows that compress after reaching these lengths."""
        if self.lead is not None:
            return (lengths > 0) & ((lengths + 1) % self.interval == 0)
        k = self.every_step
        return (lengths > 0) & ((lengths <= k) | ((lengths - k) % self.interval == 0))


_UNBOUNDED = 1 << 30  # every_step of a press that compresses at every step


@dataclass(frozen=True, eq=False)
class DecodeEvictions:
    """Per row: when each prompt and generated entry was evicted, and the attention inputs."""

    prompt: tuple[torch.Tensor, ...]  # per layer [n, kv_heads, P_l] int32
    own: tuple[torch.Tensor, ...]  # per layer [n, kv_heads, G] int32
    inputs: tuple[torch.Tensor, ...]  # per layer [n, T, hidden]
    # per layer [n, kv_heads, J, target] int32: after the j-th compression, the entries left
    # (index into prompt + generated slots) in kvpress's cache order (-1: none); rows that
    # have not reached a compression hold stale values there, never read
    order: tuple[torch.Tensor, ...]

    @staticmethod
    def start(prompt_keys: tuple[torch.Tensor, ...], n: int, hidden: int,
              dtype: torch.dtype, target: int) -> DecodeEvictions:
        prompt = tuple(torch.full((n, k.shape[1], k.shape[2]), NEVER, dtype=torch.int32,
                                  device=k.device) for k in prompt_keys)
        own = tuple(torch.full((n, k.shape[1], 0), NEVER, dtype=torch.int32, device=k.device)
                    for k in prompt_keys)
        inputs = tuple(torch.zeros(n, 0, hidden, dtype=dtype, device=k.device)
                       for k in prompt_keys)
        order = tuple(torch.full((n, k.shape[1], 0, target), -1, dtype=torch.int32,
                                 device=k.device) for k in prompt_keys)
        return DecodeEvictions(prompt, own, inputs, order)

    def live(self, after: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (prompt ``[n, kv, P]``, generated ``[n, kv, G + 1]``) bool masks of the
        entries live after step ``after`` ``[n]``; the extra slot is the one being written."""
        t = after.to(torch.int32)[:, None, None]
        masks = []
        for prompt, own in zip(self.prompt, self.own, strict=True):
            new = own.new_ones(own.shape[0], own.shape[1], 1, dtype=torch.bool)
            masks.append((prompt > t, torch.cat([own > t, new], dim=2)))
        return masks

    def take(self, rows: torch.Tensor) -> DecodeEvictions:
        return DecodeEvictions(*(tuple(t.index_select(0, rows) for t in part)
                                 for part in (self.prompt, self.own, self.inputs, self.order)))

    @staticmethod
    def join(parts: list[DecodeEvictions], width: int, steps: int) -> DecodeEvictions:
        """Rows of several, generated slots padded to ``width`` and inputs to ``steps``."""
        def pad(t: torch.Tensor, to: int, dim: int, value: float) -> torch.Tensor:
            shape = list(t.shape)
            shape[dim] = to - t.shape[dim]
            return torch.cat([t, t.new_full(shape, value)], dim=dim)

        layers = range(len(parts[0].prompt))
        return DecodeEvictions(
            prompt=tuple(torch.cat([p.prompt[i] for p in parts]) for i in layers),
            own=tuple(torch.cat([pad(p.own[i], width, 2, NEVER) for p in parts]) for i in layers),
            inputs=tuple(torch.cat([pad(p.inputs[i], steps, 1, 0) for p in parts])
                         for i in layers),
            order=tuple(torch.cat([pad(pad(p.order[i], max(q.order[i].shape[2] for q in parts),
                                           2, -1), max(q.order[i].shape[3] for q in parts), 3, -1)
                                   for p in parts]) for i in layers),
        )

    def truncated(self, lengths: torch.Tensor) -> DecodeEvictions:
        """Forget evictions after each row's new length (they belong to a discarded history)."""
        t = lengths.to(torch.int32)[:, None, None]

        def forget(ev: torch.Tensor) -> torch.Tensor:
            return torch.where(ev > t, torch.full_like(ev, NEVER), ev)

        return DecodeEvictions(tuple(forget(p) for p in self.prompt),
                               tuple(forget(o) for o in self.own), self.inputs, self.order)

    def appended(self, lengths: torch.Tensor, inputs: list[torch.Tensor]) -> DecodeEvictions:
        """After a step that wrote one generated slot per row and fed the tokens at index
        ``lengths`` (``[n]``, before the step) with attention inputs ``inputs[layer]``
        ``[n, hidden]``."""
        own = tuple(torch.cat([o, o.new_full((o.shape[0], o.shape[1], 1), NEVER)], dim=2)
                    for o in self.own)
        stored = []
        for history, x in zip(self.inputs, inputs, strict=True):
            if history.shape[1] <= int(lengths.max()):
                grow = max(16, history.shape[1])
                history = torch.cat([history, history.new_zeros(history.shape[0], grow,
                                                                 history.shape[2])], dim=1)
            # in place, like the cache: the state advanced from is consumed
            history[torch.arange(history.shape[0], device=history.device), lengths] = \
                x.to(history.dtype)
            stored.append(history)
        return DecodeEvictions(self.prompt, own, tuple(stored), self.order)


@contextlib.contextmanager
def scoring(failure: Callable[[str], Exception], what: str, device: torch.device
            ) -> Iterator[None]:
    """Run a scorer with its random numbers fixed (:func:`fixed_press_randomness`); an error of
    its own becomes ``failure`` in one line, ``what (Type: first line)``, not its traceback."""
    try:
        with fixed_press_randomness(device):
            yield
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except WrongScores as exc:  # what it returned, and what was expected
        raise failure(str(exc)) from None
    except Exception as exc:  # the scorer's own code
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise failure(f"{what} ({type(exc).__name__}: {first})") from exc


@contextlib.contextmanager
def capture_attention_inputs(modules: list[Any]) -> Iterator[dict[int, Any]]:
    """Record each attention module's input hidden states and position embeddings of one
    forward (what kvpress's decoding hook reads from the same place)."""
    seen: dict[int, Any] = {}

    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        seen[module.layer_idx] = (kwargs["hidden_states"], kwargs.get("position_embeddings"))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def compress_rows(
    rule: Any,  # DecodingRule, or another rule with its own compress
    ev: DecodeEvictions,
    rows: torch.Tensor,  # [r] long: rows that compress now
    lengths: torch.Tensor,  # [n] long: lengths after the step just taken
    slots: torch.Tensor,  # [n, G] bool: valid generated slots
    slot_step: torch.Tensor,  # [n, G] long: generated index held by each slot
    cache: Any,  # SharedPromptCache
    modules: list[Any],  # attention module of each layer, by layer index
    positions: dict[int, Any],  # layer -> (cos, sin) of the step just taken, [n, 1, dim]
) -> DecodeEvictions:
    """Compress the given rows' caches as kvpress's ``DecodingPress`` does (module docstring);
    another rule (:class:`~kvdrift.lm.engine.decoding_threshold.ThresholdRule`,
    :class:`~kvdrift.lm.engine.decoding_adakv.HeadAdaptiveRule`) applies its own ``compress``."""
    if not isinstance(rule, DecodingRule):
        return rule.compress(ev, rows, lengths, slots, slot_step, cache, modules, positions)
    prompt = [p.clone() for p in ev.prompt]
    own = [o.clone() for o in ev.own]
    order = list(ev.order)
    for i in rows.tolist():
        length = int(lengths[i])
        j = rule.index(length)  # this is the row's j-th compression
        width = max(rule.target_at(length), 1)
        for layer_idx, module in enumerate(modules):
            order[layer_idx] = _grown(order[layer_idx], j, width)
            p_live, o_live, kept = _kept_entries(rule, module, cache.layers[layer_idx],
                                                 ev, i, layer_idx, length, slots, slot_step,
                                                 positions)
            n_prompt = p_live.shape[1]
            chosen = torch.zeros(p_live.shape[0], n_prompt + o_live.shape[1], dtype=torch.bool,
                                 device=p_live.device)
            chosen.scatter_(1, kept.long(), True)
            prompt[layer_idx][i][p_live & ~chosen[:, :n_prompt]] = length
            own[layer_idx][i][o_live & ~chosen[:, n_prompt:]] = length
            row_order = order[layer_idx][i, :, j - 1]  # [kv, target]
            row_order.fill_(-1)
            row_order[:, :kept.shape[1]] = kept
    return DecodeEvictions(tuple(prompt), tuple(own), ev.inputs, tuple(order))


def _grown(order: torch.Tensor, j: int, width: int) -> torch.Tensor:
    """``order`` ``[n, kv, J, w]`` with room for ``j`` compressions of ``width`` entries
    (a ``CompressionRatioDecodingPress`` keeps more as the generation grows)."""
    n, kv, have, w = order.shape
    if have < j:
        order = torch.cat([order, order.new_full((n, kv, j - have, w), -1)], dim=2)
    if w < width:
        order = torch.cat([order, order.new_full((n, kv, order.shape[2], width - w), -1)], dim=3)
    return order


def _cache_order(
    rule: DecodingRule, ev: DecodeEvictions, i: int, layer_idx: int, length: int,
    p_live: torch.Tensor, o_live: torch.Tensor, slot_step: torch.Tensor,
) -> torch.Tensor:
    """``[kv, m]``: the row's live entries (index into prompt + generated slots) in the order
    kvpress's cache holds them: before any compression the prompt as stored then the generated
    slots; after one, the entries it left in score order, then the slots written since."""
    n_prompt = p_live.shape[1]
    done = rule.index(length) - 1  # compressions before this one
    if done == 0:
        live = torch.cat([p_live, o_live], dim=1)
        m = int(live[0].sum())
        return torch.sort((~live).to(torch.int8), dim=1, stable=True).indices[:, :m]
    previous = ev.order[layer_idx][i, :, done - 1]  # [kv, target]
    kept = int((previous[0] >= 0).sum())
    since = o_live & (slot_step[i] > rule.step_of(done) - 1)[None, :]  # written after it
    k_new = int(since[0].sum())
    new = torch.sort((~since).to(torch.int8), dim=1, stable=True).indices[:, :k_new] + n_prompt
    return torch.cat([previous[:, :kept].long(), new], dim=1)


def _kept_entries(
    rule: DecodingRule, module: Any, layer: Any, ev: DecodeEvictions, i: int,
    layer_idx: int, length: int, slots: torch.Tensor, slot_step: torch.Tensor,
    positions: dict[int, Any],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt live ``[kv, P]``, generated live ``[kv, G]``, the entries kept ``[kv, k]`` in
    kvpress's cache order after the compression) for one row and layer."""
    p_live = ev.prompt[layer_idx][i] >= length  # [kv, P]: not evicted before this step
    o_live = (ev.own[layer_idx][i] >= length) & slots[i][None, :]  # [kv, G]
    order = _cache_order(rule, ev, i, layer_idx, length, p_live, o_live, slot_step)  # [kv, m]
    m = order.shape[1]
    counts = p_live.sum(-1) + o_live.sum(-1)
    if bool((counts != m).any()):
        raise RuntimeError(f"decode-time eviction: layer {layer_idx} holds {counts.tolist()} "
                           f"live entries per KV head, expected {m} in each")
    if m <= rule.target_at(length):
        return p_live, o_live, order  # kvpress keeps all, in the same order
    keys = torch.cat([layer.prompt_keys[0], layer.keys[i]], dim=1)  # [kv, P + G, dim]
    values = torch.cat([layer.prompt_values[0], layer.values[i]], dim=1)
    idx = order[:, :, None].expand(-1, -1, keys.shape[-1])
    start = length - rule.window_at(length)  # inputs of steps start + 1 .. length (step - 1)
    cos, sin = positions[layer_idx]
    kept = rule.compress_row(module, RowEntries(
        keys.gather(1, idx), values.gather(1, idx),
        rule.led(layer_idx, ev.inputs[layer_idx][i, max(start, 0):length], start),
        (cos[i:i + 1], sin[i:i + 1]), length))
    return p_live, o_live, order.gather(1, kept.order)


def compress_live(
    rule: DecodingRule, module: Any, live: LiveEntries, hidden: torch.Tensor,
    position_embeddings: Any, length: int,
) -> LiveEntries:
    """One compression of one row and layer as a step of the storage contract
    (:class:`~kvdrift.lm.engine.live_entries.LiveEntries` in, the new live entries out):
    :meth:`DecodingRule.compress_row` on the row's live entries (``hidden`` ``[1, w, hidden]``:
    the attention inputs of the last steps), in kvpress's new cache order (all of them, in
    the same order, when the row holds the target or fewer)."""
    if live.valid is not None:
        raise RuntimeError(f"{rule.label}: a scorer rule needs every KV head to hold the same "
                           f"entries count; got {live.valid.sum(-1).tolist()}")
    if live.width <= rule.target_at(length):
        return live
    kept = rule.compress_row(module, RowEntries(live.keys, live.values, hidden[0],
                                                position_embeddings, length))
    idx = kept.order[:, :, None].expand(-1, -1, live.keys.shape[-1])
    return LiveEntries(live.keys.gather(1, idx), live.values.gather(1, idx))


__all__ = ["NEVER", "DecodeEvictions", "DecodingRule", "capture_attention_inputs",
           "compress_live", "compress_rows", "scoring"]
