"""Decode-time hiding per KV head (kvpress's ``DecodingPress`` over an ``AdaKVPress``) on every row.

A ``DecodingPress`` (or ``CompressionRatioDecodingPress``) whose ``base_press`` is an
``AdaKVPress`` (a press object, or the spec ``decoding-adakv-<scorer>:interval=I,target=T``)
compresses on the schedule of any other (:class:`~kvdrift.lm.engine.decoding.
DecodingRule`: same steps, same target), but removes nothing: AdaKV scores every entry of the
cache, keeps the ``target`` best per KV head on average (each head at least its safeguard) and
*hides* the others in the KV heads where they lost, by their positions in the cache. The cache
keeps growing in its own order (prompt, then generated tokens), and each later compression
chooses the hidden entries again, from scratch, over the whole cache.

kvpress hides an entry by writing, at each step, a fake key over it in the cache, built from
that step's queries (its ``search_hyperplane``) so that their attention weight underflows to
zero. A compression therefore scores, for each hidden entry, the fake key of its own step, not
the entry's key. kvdrift replays exactly that: at each compression it computes the step's fake
key per KV head from the step's queries, with kvpress's own function, puts it in place of every
entry hidden until then, and lets the press's own ``compress`` choose the new hidden entries
(read from its ``masked_key_indices``). Between compressions it masks hidden entries exactly
(equal up to float noise, as for head-adaptive prefill presses), and searches the step's fake
keys as kvpress does (:meth:`HeadAdaptiveRule.check_step`) only to fail where kvpress fails.
Entries hidden by a head-adaptive prefill press are hidden from the start, like kvpress's.

Hidden entries are recorded as evictions at the compression's step (:class:`~kvdrift.lm.engine.
decoding.DecodeEvictions`), so truncation and forks replay them like a ``DecodingPress``'s.
That holds while every entry once hidden stays hidden, which scorers that rank by the key's
norm or by the attention to it do: the fake key's norm is orders of magnitude above any key's.
An entry shown again would be attended through the fake key left over it, which kvdrift does
not store: such a compression fails in one line instead of differing from kvpress.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from kvpress.attention_patch import search_hyperplane
from kvpress.utils import get_prerope_query_states
from transformers.models.llama.modeling_llama import rotate_half

from kvdrift.lm.actions.presses import clamp_to_length
from kvdrift.lm.engine.decoding import DecodingRule, scoring
from kvdrift.lm.engine.score_shapes import checked_scorers


@dataclass(frozen=True)
class HeadAdaptiveRule:
    """A ``DecodingPress`` (or ``CompressionRatioDecodingPress``) ``press`` over an
    ``AdaKVPress`` as a decoding-time rule, named ``label`` in messages (module docstring)."""

    press: Any
    label: str
    failure: Callable[[str], Exception] = ValueError
    spec: bool = False
    n_prompt: int = 0

    def for_prompt(self, n_prompt: int) -> HeadAdaptiveRule:
        return dataclasses.replace(self, n_prompt=n_prompt)

    @functools.cached_property
    def schedule(self) -> DecodingRule:
        """When the press compresses and to what target (a ``DecodingPress``'s own rule)."""
        return DecodingRule(self.press, self.label, self.failure, self.spec, self.n_prompt)

    @property
    def target(self) -> int:
        return 1  # (DecodeEvictions' order width: the cache keeps its own order)

    def check(self, action: str | None = None, horizon: int | None = None) -> None:
        """The press's rules (:meth:`DecodingRule.check`), for the scorer AdaKV wraps."""
        scored = copy.copy(self.press)
        scored.base_press = self.press.base_press.press
        dataclasses.replace(self.schedule, press=scored).check(action, horizon)

    def compresses(self, lengths: torch.Tensor) -> torch.Tensor:
        """``[n]`` bool: rows that compress after reaching these lengths."""
        return self.schedule.compresses(lengths)

    def compress(self, ev: Any, rows: torch.Tensor, lengths: torch.Tensor,
                 slots: torch.Tensor, slot_step: torch.Tensor, cache: Any,
                 modules: list[Any], positions: dict[int, Any]) -> Any:
        """``ev`` (:class:`~kvdrift.lm.engine.decoding.DecodeEvictions`) with the entries each
        compressing row's press hides now recorded as hidden after its length."""
        prompt = [p.clone() for p in ev.prompt]
        own = [o.clone() for o in ev.own]
        for i in rows.tolist():
            length = int(lengths[i])
            for layer_idx, module in enumerate(modules):
                layer = cache.layers[layer_idx]
                valid = torch.nonzero(slots[i]).squeeze(-1)  # generated slots, in cache order
                was = torch.cat([ev.prompt[layer_idx][i] < length,
                                 ev.own[layer_idx][i][:, valid] < length], dim=1)  # [kv, m]
                if layer.prompt_live is not None:
                    was[:, :layer.prompt_live.shape[2]] |= ~layer.prompt_live[0]
                cos, sin = positions[layer_idx]
                now = self.hidden_after(module, layer, ev.inputs[layer_idx][i], valid, i, was,
                                        (cos[i:i + 1], sin[i:i + 1]), length)
                if now is None:
                    continue
                shown = was & ~now
                if bool(shown.any()):
                    raise self.failure(
                        f"{self.label}: its {type(self.press.base_press).__name__} shows again, "
                        f"after generated token {length}, {int(shown.sum())} entries it hid "
                        f"before; kvpress then attends to each through the fake key it wrote "
                        f"over it, which kvdrift does not replay; score with a press under "
                        f"which hidden entries stay hidden (e.g. KnormPress)")
                new = now & ~was
                n_prompt = ev.prompt[layer_idx].shape[2]
                prompt[layer_idx][i][new[:, :n_prompt]] = length
                row = own[layer_idx][i]
                kept = row[:, valid]
                kept[new[:, n_prompt:]] = length
                row[:, valid] = kept
        return dataclasses.replace(ev, prompt=tuple(prompt), own=tuple(own))

    def check_step(self, ev: Any, lengths: torch.Tensor, cache: Any, modules: list[Any],
                   positions: dict[int, Any]) -> None:
        """Fail where kvpress's step just taken (rows now at ``lengths``) found no fake key:
        kvpress searches one at every step of a layer that hides entries, for all the step's
        queries, and raises when its search does not end (rows that hide nothing skip it)."""
        before = lengths.to(torch.int32)[:, None, None]
        for layer_idx, module in enumerate(modules):
            layer = cache.layers[layer_idx]
            hides = ((ev.prompt[layer_idx] < before).flatten(1).any(1)
                     | (ev.own[layer_idx] < before).flatten(1).any(1))
            if layer.prompt_live is not None and not bool(layer.prompt_live.all()):
                hides = torch.ones_like(hides)
            rows = torch.nonzero(hides).squeeze(-1)
            if rows.numel() == 0:
                continue
            cos, sin = positions[layer_idx]
            inputs = ev.inputs[layer_idx][rows, lengths[rows] - 1]  # [r, hidden]
            with scoring(self.failure, f"{self.label}: kvpress hides entries at each step by "
                                       f"a fake key, and finds none after generated token "
                                       f"{int(lengths[rows].max())}", inputs.device):
                fake_keys(module, inputs, (cos[rows], sin[rows]), layer.prompt_keys.shape[1])

    def hidden_after(self, module: Any, layer: Any, inputs: torch.Tensor, valid: torch.Tensor,
                     i: int, was: torch.Tensor, position_embeddings: Any,
                     length: int) -> torch.Tensor | None:
        """``[kv, m]`` bool: the entries of row ``i``'s cache (prompt, then its ``valid``
        generated slots) its press hides after generated step ``length``, given those it hid
        until then (``was``) and the layer's attention inputs ``inputs`` ``[T, hidden]``; None
        when the cache holds at most the target (kvpress leaves its mask as it is)."""
        keys = torch.cat([layer.prompt_keys[0], layer.keys[i][:, valid]], dim=1)  # [kv, m, d]
        values = torch.cat([layer.prompt_values[0], layer.values[i][:, valid]], dim=1)
        kv, m = keys.shape[:2]
        target = self.schedule.target_at(length)
        if m <= target:
            return None
        hidden = inputs[length - self.schedule.window_at(length):length][None]
        press = copy.deepcopy(self.press.base_press)
        clamp_to_length(press.press, m)
        press.compression_ratio = self.press._find_target_compression_ratio(m, target)
        kwargs = {"hidden_states": hidden, "position_embeddings": position_embeddings}
        before = getattr(module, "masked_key_indices", None)
        try:
            with scoring(self.failure, f"{self.label}: {type(press).__name__} cannot hide "
                                       f"entries during decoding", hidden.device), \
                    checked_scorers(press):
                fake = fake_keys(module, inputs[length - 1], position_embeddings, kv)  # [kv, d]
                keys = torch.where(was[..., None], fake[:, None].to(keys.dtype), keys)
                press.compress(module, hidden, keys[None], values[None], None, kwargs)
            _, heads, seq = module.masked_key_indices
        finally:
            module.masked_key_indices = before  # kvdrift masks; kvpress's patch must not
        now = torch.zeros(kv, m, dtype=torch.bool, device=keys.device)
        now[heads.to(keys.device), seq.to(keys.device)] = True
        return now


def fake_keys(module: Any, hidden: torch.Tensor, position_embeddings: Any,
              kv_heads: int) -> torch.Tensor:
    """``[kv_heads, head_dim]`` (``[r, kv_heads, head_dim]`` for ``r`` rows): the key kvpress
    writes over each hidden entry at a step whose attention input is ``hidden``
    ``[hidden_size]`` (or ``[r, hidden_size]``; position embeddings ``[r, 1, dim]``): its
    ``search_hyperplane`` of the step's queries, per group of query heads sharing a KV head."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    query = get_prerope_query_states(module, rows[:, None])  # [r, heads, 1, d]
    cos, sin = position_embeddings
    query = query * cos.unsqueeze(1) + rotate_half(query) * sin.unsqueeze(1)
    r, heads, dim = query.shape[0], query.shape[1], query.shape[-1]
    fake = search_hyperplane(query.reshape(r * kv_heads, heads // kv_heads, dim))
    return fake.reshape(r, kv_heads, dim) if hidden.dim() > 1 else fake


__all__ = ["HeadAdaptiveRule", "fake_keys"]
