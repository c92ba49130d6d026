"""Cache merging during decoding (kvpress's ``CAMPress``) replayed on every row of a Q state.

At every decoding step CAMPress adds, per layer and KV head, the attention the step's query
gives each cached entry (its own ``_compute_current_token_attention``, averaged over the
query heads of a KV head) to a running sum kept with the cache. After ``compression_interval``
steps of a layer, once that layer holds more than ``target_size`` entries, it scores the
entries with its base scorer, keeps the ``target_size`` best in cache order, merges evicted
values into the next ``merge_budget`` kept ones (each merge drawn with ``torch.bernoulli``
from the running sums) and prunes the sums with the cache.

kvdrift keeps, per row: the running sums of the entries it holds (:class:`CamRows`, aligned
with the stored entries), each layer's steps since its last compression, the last attention
inputs, and the row's own random generator for the merge draws. A compression calls
kvpress's own ``CAMPress.compress`` on the row's live entries (batch of one) with the press's
state set to the row's; its draws come from torch's global generator, which kvdrift sets to
the row's generator state for the call and reads back (the caller's random state is restored,
:func:`row_stream`). The merged values live in the row: a CAM row holds only its live entries
(:mod:`~kvdrift.lm.engine.live_rows`), whatever ``rewind`` says, so it cannot go back to an
earlier length (its sums and draws cannot be undone); forks carry the sums and the generator
state with the row.

Merge seeds: Q row ``r`` of a pair (the ``r``-th Q row it starts, counting from 0: replicate
``r`` of a rollout) draws its merges from a generator seeded with :func:`merge_seed` of the
unit's seed and ``r``. The merges are part of Q's randomness, realized once per row: seeding
torch's global generator with that seed before kvpress's own ``generate`` on the row alone
gives the same merges.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kvpress
import torch
from kvpress.utils import get_prerope_query_states
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

from kvdrift.lm.engine.cache import SharedPromptCache
from kvdrift.lm.engine.decoding import scoring
from kvdrift.lm.engine.live_entries import LiveEntries
from kvdrift.lm.engine.live_rows import LiveRows, held_entries, rebuilt_rows, slot_order
from kvdrift.lm.engine.press_rules import problems
from kvdrift.lm.engine.score_shapes import checked_scorers

SWRB_REFUSAL = ("its CAMPress merges evicted values into kept ones and sums the attention "
                "each entry received at every step, so a row cannot go back to an earlier "
                "length; estimator swrb branches from earlier lengths: use the rollout "
                "estimator")


def merge_seed(key: int, row: int) -> int:
    """The seed of Q row ``row``'s merge draws in a unit keyed ``key`` (the unit's seed): the
    first 8 bytes of SHA-256 of ``"cam-merges", key, row``, as a 63-bit integer (a CPU
    generator uses its low 32 bits)."""
    digest = hashlib.sha256(f"cam-merges\0{int(key)}\0{int(row)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class CamRule:
    """kvpress's ``CAMPress`` ``press`` as a decoding-time rule, named ``label`` in messages."""

    press: Any  # kvpress.CAMPress over a ScorerPress
    label: str
    failure: Callable[[str], Exception] = ValueError
    spec: bool = False  # named by a spec (fields interval=, buffer=), not a press object
    n_prompt: int = 0
    # prompt entries every layer holds after the prefill (None: not known, or they differ)
    prompt_kept: int | None = None

    def for_prompt(self, n_prompt: int) -> CamRule:
        return dataclasses.replace(self, n_prompt=n_prompt)

    def index(self, length: int) -> int:
        """Compressions at generated steps ``1..length`` (every layer alike): the first once
        ``interval`` steps are taken and the cache holds more than ``target``, then every
        ``interval`` steps; ValueError where layers kept different prompt counts."""
        if self.every_step:
            return length
        if self.prompt_kept is None:
            raise ValueError("layers compress at different steps")
        first = max(self.interval, self.target - self.prompt_kept + 1)
        return 0 if length < first else 1 + (length - first) // self.interval

    def target_at(self, length: int) -> int:
        return self.target

    @property
    def scorer_name(self) -> str:
        return type(self.press.base_press).__name__

    @property
    def interval(self) -> int:
        return int(self.press.compression_interval)

    @property
    def target(self) -> int:
        return int(self.press.target_size)

    @property
    def buffer(self) -> int:
        return int(self.press.hidden_states_buffer_size)

    @property
    def window(self) -> int:
        """Attention inputs a compression scores from, at least (it scores the last
        ``min(steps since the last one, buffer + 1)``, and steps reach ``interval``)."""
        return min(self.interval, self.buffer + 1)

    @property
    def every_step(self) -> int:
        """Nonzero when kvpress compresses at every step (a target of at most 1)."""
        return 1 << 30 if self.target <= 1 else 0

    def check(self, action: str | None = None, horizon: int | None = None) -> None:
        """Raise ``failure`` (one line) if the press's own rules cannot hold
        (:func:`~kvdrift.lm.engine.press_rules.problems`)."""
        found = problems(self, horizon)
        if found:
            raise self.failure(found[0] if action is None else f"action {action!r}: {found[0]}")

    @functools.cached_property
    def worker(self) -> Any:
        """A copy of the press whose per-layer state is set to one row's at each compression
        (the press given is never changed)."""
        return copy.deepcopy(self.press)

    def start_rows(self, prompt_keys: tuple[torch.Tensor, ...], n: int, hidden: int,
                   dtype: torch.dtype, seeds: list[int]) -> CamRows:
        """``n`` rows with no generated entry, row ``i`` drawing its merges from a generator
        seeded with ``seeds[i]``."""
        dev = prompt_keys[0].device
        states = []
        for seed in seeds:
            gen = torch.Generator(device=dev)
            gen.manual_seed(int(seed))
            states.append(gen.get_state())
        return CamRows(
            rows=LiveRows.start(prompt_keys, n, hidden, dtype, self.buffer + 1),
            prompt_attn=tuple(torch.zeros(n, k.shape[1], k.shape[2], dtype=dtype, device=dev)
                              for k in prompt_keys),
            own_attn=tuple(torch.zeros(n, k.shape[1], 0, dtype=dtype, device=dev)
                           for k in prompt_keys),
            steps=torch.zeros(n, len(prompt_keys), dtype=torch.long),
            rng=torch.stack(states))

    @torch.no_grad()
    def advanced(self, state: CamRows, lengths: torch.Tensor, mask: torch.Tensor,
                 slot_step: torch.Tensor, cache: SharedPromptCache, modules: list[Any],
                 seen: dict[int, Any]) -> tuple[CamRows, SharedPromptCache, torch.Tensor,
                                                torch.Tensor]:
        """After a step (lengths ``[n]`` and valid slots ``mask`` ``[n, G]`` after it; ``seen``:
        each layer's attention inputs and position embeddings): add the step's attention to
        the running sums, then compress each row's layers that reach a compression, as
        kvpress's forward hook does; returns the new ``(rows, cache, mask, slot_step)``."""
        state = state.appended(lengths - 1, [seen[i][0][:, -1] for i in range(len(modules))])
        valid = mask.bool()
        prompt_attn, own_attn = list(state.prompt_attn), list(state.own_attn)
        held_counts = []
        for layer_idx, module in enumerate(modules):
            hidden, positions = seen[layer_idx]
            held = state.rows.own[layer_idx] & valid[:, None, :]  # [n, kv, G]
            reads = state.rows.reads_prompt
            attn = step_attention(module, hidden, positions, cache.layers[layer_idx],
                                  reads if state.rows.prompt_read else None, held)
            n_prompt = prompt_attn[layer_idx].shape[2]
            prompt_attn[layer_idx] = prompt_attn[layer_idx] + attn[..., :n_prompt]
            own_attn[layer_idx] = own_attn[layer_idx] + attn[..., n_prompt:]
            held_counts.append(held[:, 0].sum(-1) + reads.long() * n_prompt)
        steps = state.steps + 1
        counts = torch.stack(held_counts, dim=1).cpu()  # [n, layers]: entries per KV head
        due = ((steps >= self.interval) & (counts > self.target)) | (self.target <= 1)
        state = dataclasses.replace(state, prompt_attn=tuple(prompt_attn),
                                    own_attn=tuple(own_attn), steps=torch.where(due, 0, steps))
        if not bool(due.any()):
            return state, cache, mask, slot_step
        return self._compressed(state, due, steps, lengths, mask, slot_step, cache, modules,
                                seen)

    def _compressed(self, state: CamRows, due: torch.Tensor, steps: torch.Tensor,
                    lengths: torch.Tensor, mask: torch.Tensor, slot_step: torch.Tensor,
                    cache: SharedPromptCache, modules: list[Any], seen: dict[int, Any]
                    ) -> tuple[CamRows, SharedPromptCache, torch.Tensor, torch.Tensor]:
        """Compress the layers ``due`` ``[n, layers]`` of each row (their step counts
        ``steps``) with kvpress's ``CAMPress.compress`` and store every row's new entries."""
        valid = mask.bool()
        ring_size = self.buffer + 1
        rng = state.rng.clone()
        blocks: dict[int, list[LiveEntries]] = {}
        sums: dict[int, list[torch.Tensor]] = {}
        for i in torch.nonzero(due.any(dim=1)).squeeze(-1).tolist():
            length = int(lengths[i])
            reads = bool(state.rows.reads_prompt[i])
            blocks[i], sums[i] = [], []
            for layer_idx, module in enumerate(modules):
                live, attn = _row_live(state, cache, layer_idx, i, valid[i], reads)
                if bool(due[i, layer_idx]):
                    k = int(steps[i, layer_idx])
                    window = min(k, ring_size)
                    ring = torch.arange(length - window, length, device=mask.device) % ring_size
                    hidden = state.rows.inputs[layer_idx][i:i + 1].index_select(1, ring)
                    positions = tuple(t[i:i + 1] for t in seen[layer_idx][1])
                    live, attn, rng[i] = self.compress_row(module, live, attn, hidden,
                                                           positions, k, rng[i])
                blocks[i].append(live)
                sums[i].append(attn)
        rows, cache, new_mask, new_steps = rebuilt_rows(state.rows, blocks, lengths, mask,
                                                        slot_step, cache)
        order = slot_order(valid, new_mask.shape[1])
        own_attn = []
        for layer_idx, old in enumerate(state.own_attn):
            n, kv = old.shape[:2]
            new = old.new_zeros(n, kv, new_mask.shape[1])
            new[:, :, :order.shape[1]] = old.gather(2, order[:, None, :].expand(n, kv, -1))
            for i, row_sums in sums.items():
                new[i] = 0
                new[i, :, :row_sums[layer_idx].shape[1]] = row_sums[layer_idx]
            own_attn.append(new)
        return (dataclasses.replace(state, rows=rows, own_attn=tuple(own_attn), rng=rng),
                cache, new_mask, new_steps)

    def compress_row(self, module: Any, live: LiveEntries, attn: torch.Tensor,
                     hidden: torch.Tensor, positions: tuple[torch.Tensor, torch.Tensor],
                     steps: int, rng: torch.Tensor
                     ) -> tuple[LiveEntries, torch.Tensor, torch.Tensor]:
        """One row's compression in one layer: kvpress's ``CAMPress.compress`` on its live
        entries ``live`` and running sums ``attn`` ``[kv, m]`` in cache order, from the
        attention inputs ``hidden`` ``[1, w, hidden]``, after ``steps`` steps of the layer,
        drawing from the generator state ``rng``; returns the entries and sums left and the
        generator's new state."""
        press, layer_idx = self.worker, int(module.layer_idx)
        press._running_attn_sum = {layer_idx: attn[None].clone()}
        press.layer_step_counts = defaultdict(int, {layer_idx: steps})
        kwargs = {"hidden_states": hidden, "position_embeddings": positions}
        with scoring(self.failure, f"{self.label}: {self.scorer_name} cannot score during "
                                   f"decoding", hidden.device), checked_scorers(press), \
                row_stream(rng, hidden.device) as drawn:
            keys, values = press.compress(module, hidden, live.keys[None].clone(),
                                          live.values[None].clone(), attn[None].clone(),
                                          kwargs)
        pruned = press._running_attn_sum.pop(layer_idx)[0]
        press.layer_step_counts = defaultdict(int)
        return LiveEntries(keys[0], values[0]), pruned, drawn[0]


@contextlib.contextmanager
def row_stream(state: torch.Tensor, device: torch.device) -> Iterator[list[torch.Tensor]]:
    """Run kvpress code that draws from torch's global generator on ``device`` with a row's
    generator state ``state`` instead; yields a list whose one item is the state after the
    draws. The caller's global random state is restored afterwards."""
    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) \
        if cuda else None
    after: list[torch.Tensor] = []
    state = state.clone()  # torch reads a state from the start of its storage: not a view
    with torch.random.fork_rng(devices=[index] if cuda else []):
        if cuda:
            torch.cuda.set_rng_state(state, index)
        else:
            torch.set_rng_state(state)
        yield after
        after.append(torch.cuda.get_rng_state(index) if cuda else torch.get_rng_state())


def step_attention(module: Any, hidden: torch.Tensor, positions: tuple[torch.Tensor, ...],
                   layer: Any, reads_prompt: torch.Tensor | None,
                   held: torch.Tensor) -> torch.Tensor:
    """``[n, kv, P + G]``: the attention each row's step query (attention input ``hidden``
    ``[n, 1, hidden]``) gives the entries it holds, prompt (rows of ``reads_prompt``; None:
    no row reads it) then generated slots (``held`` ``[n, kv, G]``), averaged per KV head; 0
    where an entry is not held. The arithmetic of kvpress's ``CAMPress.
    _compute_current_token_attention`` with a mask for the entries a row does not hold."""
    n, kv, width = held.shape
    dtype = layer.keys.dtype
    heads = module.config.num_attention_heads
    cos, sin = positions
    query = get_prerope_query_states(module, hidden)[:, :, -1:, :]
    cos, sin = cos[:, -1:, :].unsqueeze(1), sin[:, -1:, :].unsqueeze(1)
    query = (query * cos) + (rotate_half(query) * sin)  # [n, H, 1, d]
    scale = math.sqrt(layer.keys.shape[-1])
    keys = repeat_kv(layer.keys[:, :, :width], heads // kv)
    scores = torch.matmul(query, keys.transpose(-2, -1)) / scale  # [n, H, 1, G]
    shown = held
    n_prompt = layer.prompt_keys.shape[2]
    if reads_prompt is not None:
        prompt = repeat_kv(layer.prompt_keys, heads // kv)
        scores = torch.cat([torch.matmul(query, prompt.transpose(-2, -1)) / scale, scores], 3)
        prompt_shown = reads_prompt[:, None, None].expand(n, kv, n_prompt)
        if layer.prompt_live is not None:
            prompt_shown = prompt_shown & layer.prompt_live
        shown = torch.cat([prompt_shown, held], dim=2)
    hidden_entries = ~shown.repeat_interleave(heads // kv, dim=1)[:, :, None, :]
    scores = scores.masked_fill(hidden_entries, -torch.inf)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    weights = kvpress.CAMPress._aggregate_attention_per_kv_head(weights, kv)[:, :, 0]
    if reads_prompt is None:
        weights = torch.cat([weights.new_zeros(n, kv, n_prompt), weights], dim=2)
    return weights


def _row_live(state: CamRows, cache: SharedPromptCache, layer_idx: int, i: int,
              valid: torch.Tensor, reads_prompt: bool) -> tuple[LiveEntries, torch.Tensor]:
    """Row ``i``'s live entries of one layer in kvpress's cache order (the prompt if the row
    still reads it, then its held slots) and their running sums ``[kv, m]``."""
    keys, values, held, order = held_entries(state.rows, cache, layer_idx, i, valid,
                                             reads_prompt)
    attn = state.own_attn[layer_idx][i]
    if reads_prompt:
        attn = torch.cat([state.prompt_attn[layer_idx][i], attn], dim=1)
    counts = held.sum(-1)
    if bool((counts != order.shape[1]).any()):
        raise RuntimeError(f"CAMPress needs every KV head to hold the same number of entries; "
                           f"got {counts.tolist()}")
    at = order[:, :, None].expand(-1, -1, keys.shape[-1])
    return LiveEntries(keys.gather(1, at), values.gather(1, at)), attn.gather(1, order)


@dataclass(frozen=True, eq=False)
class CamRows:
    """Rows under CAMPress: their live entries (:class:`~kvdrift.lm.engine.live_rows.
    LiveRows`), the running attention sums of what they hold (per layer: the shared prompt's
    ``[n, kv, P]``, read while a row reads the prompt, and its slots' ``[n, kv, G]``), each
    layer's steps since its last compression ``[n, layers]`` and each row's merge generator
    state ``[n, S]`` uint8."""

    rows: LiveRows
    prompt_attn: tuple[torch.Tensor, ...]
    own_attn: tuple[torch.Tensor, ...]
    steps: torch.Tensor  # [n, layers] long, on the host
    rng: torch.Tensor  # [n, S] uint8, on the host

    def live(self, after: torch.Tensor) -> list[tuple[Any, torch.Tensor]]:
        return self.rows.live(after)

    def appended(self, lengths: torch.Tensor, inputs: list[torch.Tensor]) -> CamRows:
        """After a step that wrote one slot per row (see :meth:`LiveRows.appended`); the new
        slot's running sum starts at 0."""
        own_attn = tuple(torch.cat([a, a.new_zeros(a.shape[0], a.shape[1], 1)], dim=2)
                         for a in self.own_attn)
        return dataclasses.replace(self, rows=self.rows.appended(lengths, inputs),
                                   own_attn=own_attn)

    def take(self, rows: torch.Tensor) -> CamRows:
        host = rows.cpu()
        return CamRows(self.rows.take(rows),
                       tuple(a.index_select(0, rows) for a in self.prompt_attn),
                       tuple(a.index_select(0, rows) for a in self.own_attn),
                       self.steps.index_select(0, host), self.rng.index_select(0, host))

    @staticmethod
    def join(parts: list[CamRows], width: int) -> CamRows:
        def pad(a: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(a, (0, width - a.shape[2]))

        layers = range(len(parts[0].own_attn))
        return CamRows(LiveRows.join([p.rows for p in parts], width),
                       tuple(torch.cat([p.prompt_attn[i] for p in parts]) for i in layers),
                       tuple(torch.cat([pad(p.own_attn[i]) for p in parts]) for i in layers),
                       torch.cat([p.steps for p in parts]), torch.cat([p.rng for p in parts]))

    def truncated(self, new: torch.Tensor, lengths: torch.Tensor) -> CamRows:
        """Only to the rows' own lengths: a CAM row cannot go back (module docstring)."""
        back = new < lengths
        if bool(back.any()):
            i = int(torch.nonzero(back)[0])
            raise ValueError(f"row {i} cannot go back to length {int(new[i])}: under CAMPress "
                             f"it holds merged values and attention sums of its whole history")
        return self


__all__ = ["SWRB_REFUSAL", "CamRows", "CamRule", "merge_seed", "row_stream", "step_attention"]
