"""Shared-prompt ("cascade") attention, registered with transformers' ``AttentionInterface``.

During decoding every row attends to its side's prompt entries (stored once, batch of one) and
to its own generated entries. The prompt part is one attention call over all rows' queries
``[kv_heads, n * groups, head_dim]`` against ``[kv_heads, P, head_dim]`` (the prompt is read
once per step, not once per row; on CPU PyTorch's fused flash-attention kernel); the generated
part is per row. The two partial results are merged by their log-sum-exps, so the result is
exact attention over prompt + generated entries (the technique of Hydragen, arXiv 2402.05099,
and FlashInfer's cascade attention).

The function reads the prompt from the :class:`~kvdrift.lm.cache.SharedPromptCache` passed to
the model's forward as ``kvdrift_cache=`` and which generated slots each row may attend from
``kvdrift_slots=`` (``[n, G]`` bool, the new slot included); transformers hands extra forward
keyword arguments down to the attention function. No mask is built by the model: the name is
not registered as a mask function, so transformers passes ``attention_mask=None``.

A joint step (:meth:`~kvdrift.lm.pair.LMKernelPair.advance_many`) passes a
:class:`~kvdrift.lm.cache.GroupedCache` instead: rows of several path states in one batch,
grouped by side; each run of states of one side reads its prompt in one call, and
each state's rows attend their own generated entries (``kvdrift_slots`` and ``kvdrift_live``
then hold one entry per state).

Eviction that differs per KV head is a mask, never a copy: the layer's ``prompt_live``
(``[1, kv_heads, P]``, head-adaptive presses, shared by all rows) and, for decode-time
eviction, ``kvdrift_live=`` (per layer a pair of per-row masks ``[n, kv_heads, P]`` over the
prompt and ``[n, kv_heads, G]`` over the generated slots). Hidden entries get score ``-inf``
before the softmax, so they take exactly zero weight.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import kvpress  # noqa: F401  (imported before the registration below: see there)
import torch
from transformers import AttentionInterface

from kvdrift.lm.cache import GroupedCache, SharedPromptCache

ATTENTION_NAME = "kvdrift_shared_prompt"


def shared_prompt_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [n, heads, 1, head_dim]
    key: torch.Tensor,  # [n, kv_heads, G, head_dim]: the rows' generated keys
    value: torch.Tensor,  # [n, kv_heads, G, head_dim]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,  # transformers' own attention functions' order: dropout, scaling
    scaling: float | None = None,
    kvdrift_cache: SharedPromptCache | GroupedCache | None = None,
    kvdrift_slots: torch.Tensor | list[torch.Tensor] | None = None,  # [n, G] bool (per part)
    kvdrift_live: Any = None,
    kvdrift_quant: Any = None,  # GeneratedView (per part when grouped): Q rows quantized
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Exact attention of one new query per row over shared prompt + own generated entries.

    With a :class:`~kvdrift.lm.cache.GroupedCache` (a joint step of several path states),
    ``kvdrift_slots`` and ``kvdrift_live`` hold one entry per part (state); each run of parts
    of one group reads its prompt in one call, and each part its own generated entries.
    """
    if kvdrift_cache is None or kvdrift_slots is None:
        raise RuntimeError(f"the {ATTENTION_NAME!r} attention needs kvdrift_cache= and "
                           "kvdrift_slots= in the model's forward (it is kvdrift's decoding path)")
    n, heads, q_len, dim = query.shape
    if q_len != 1:
        raise ValueError(f"shared-prompt attention decodes one token per row; got q_len={q_len}")
    scale = dim ** -0.5 if scaling is None else scaling
    if not isinstance(kvdrift_cache, GroupedCache):  # one state: its own generated entries
        layer = kvdrift_cache.layers[module.layer_idx]
        live = None if kvdrift_live is None else kvdrift_live[module.layer_idx]
        if kvdrift_quant is not None:  # generated entries as the quantized cache holds them
            key, value = kvdrift_quant(key, value)
        return _attend(query, scale, [(layer, key, value, kvdrift_slots, live)]), None
    grouped = kvdrift_cache.layers[module.layer_idx]
    lives = kvdrift_live if kvdrift_live is not None else [None] * len(grouped.parts)
    quants = kvdrift_quant if kvdrift_quant is not None else [None] * len(grouped.parts)
    outs, start = [], 0
    for stop in _group_ends(kvdrift_cache.groups):
        parts = [(part, *_generated(quants[i], part.keys, part.values), kvdrift_slots[i],
                  None if lives[i] is None else lives[i][module.layer_idx])
                 for i, part in enumerate(grouped.parts[start:stop], start)]
        rows = slice(grouped.bounds[start], grouped.bounds[stop])
        outs.append(_attend(query[rows], scale, parts))
        start = stop
    return torch.cat(outs), None


def _generated(quant: Any, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A part's generated entries as its cache holds them (quantized for Q of a quantization
    action, else as stored)."""
    return (keys, values) if quant is None else quant(keys, values)


def _group_ends(groups: list[int]) -> list[int]:
    """End index (exclusive) of each run of consecutive equal group ids."""
    return [i + 1 for i in range(len(groups)) if i + 1 == len(groups) or groups[i + 1] != groups[i]]


def _attend(
    query: torch.Tensor,  # [n, heads, 1, head_dim], rows of every part in order
    scale: float,
    parts: list[tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, Any]],
) -> torch.Tensor:
    """Attention of the rows of parts that share one prompt: ``(layer, generated keys
    [m, kv, G, dim], generated values, slots [m, G] bool, decode-time live masks or None)``
    per part. The prompt is read once for all rows (:func:`_prompt_attention`); each part's
    rows attend their own generated entries, and the two partial results are merged by their
    log-sum-exps (:func:`_merge`), which is exact softmax attention over prompt + generated
    entries. Returns ``[n, 1, heads, head_dim]`` as transformers expects."""
    n, heads, _, dim = query.shape
    layer = parts[0][0]
    prompt_keys, prompt_values = layer.prompt_keys[0], layer.prompt_values[0]  # [kv, P, dim]
    kv_heads, n_prompt = prompt_keys.shape[0], prompt_keys.shape[1]
    groups = heads // kv_heads

    q = query.reshape(n, kv_heads, groups, dim) * scale  # [n, kv, g, dim]
    hidden = None  # [kv, 1 or n g, P] bool: prompt entries a row does not attend
    if layer.prompt_live is not None:
        hidden = ~layer.prompt_live[0][:, None, :]
    if any(live is not None for *_, live in parts):  # decode-time eviction: per-row masks
        per_row = []
        for _, key, _, _, live in parts:
            m = key.shape[0]
            if live is None:
                per_row.append(torch.zeros(kv_heads, m * groups, n_prompt, dtype=torch.bool,
                                           device=query.device))
            else:  # [m, kv, P] -> [kv, m g, P]
                rows_hidden = ~live[0].permute(1, 0, 2)[:, :, None, :].expand(-1, -1, groups, -1)
                per_row.append(rows_hidden.reshape(kv_heads, m * groups, n_prompt))
        rows_hidden = torch.cat(per_row, dim=1)
        hidden = rows_hidden if hidden is None else hidden | rows_hidden
    q_shared = q.permute(1, 0, 2, 3).reshape(kv_heads, n * groups, dim)  # [kv, n g, dim]
    out_prompt, lse_prompt = _prompt_attention(q_shared, prompt_keys, prompt_values, hidden)
    out_prompt = out_prompt.reshape(kv_heads, n, groups, dim).permute(1, 0, 2, 3)
    lse_prompt = lse_prompt.reshape(kv_heads, n, groups).permute(1, 0, 2)  # [n, kv, g]

    outs_own, lses_own, start = [], [], 0
    for _, key, value, slots, live in parts:
        m = key.shape[0]
        q_part = q[start:start + m]
        start += m
        own_slots = slots[:, None, None, :]  # [m, 1, 1, G]
        if live is not None:
            own_slots = own_slots & live[1][:, :, None, :]  # [m, kv, 1, G]
        # lse is finite: a row always sees its new slot
        out, lse = _softmax_attention(q_part, key, value, ~own_slots)  # [m, kv, g, dim]
        outs_own.append(out)
        lses_own.append(lse)
    out_own = outs_own[0] if len(parts) == 1 else torch.cat(outs_own)
    lse_own = lses_own[0] if len(parts) == 1 else torch.cat(lses_own)
    out = _merge(out_prompt, lse_prompt, out_own, lse_own)
    return out.to(query.dtype).reshape(n, 1, heads, dim)


def _prompt_attention(
    q: torch.Tensor,  # [kv, r, dim], already scaled
    keys: torch.Tensor,  # [kv, P, dim]
    values: torch.Tensor,  # [kv, P, dim]
    hidden: torch.Tensor | None,  # [kv, 1 or r, P] bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of ``r`` query rows per KV head over the prompt alone: the output
    ``[kv, r, dim]`` and each row's log-sum-exp of scores ``[kv, r]`` (float32; ``-inf`` for a
    row that sees no prompt entry, whose output is then 0).

    On CPU this is PyTorch's fused flash-attention kernel (it never builds the ``[kv, r, P]``
    score matrix and measured 2.6x faster than two matrix products and a softmax over a
    4,000-entry prompt); elsewhere, or without that kernel, matrix products and a softmax.
    """
    if q.device.type == "cpu" and _FLASH_CPU is not None:
        mask = None
        if hidden is not None:
            mask = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device).masked_fill_(
                hidden, float("-inf"))[None]
        out, lse = _FLASH_CPU(q[None], keys[None], values[None], attn_mask=mask, scale=1.0)
        out, lse = out[0], lse[0]
    else:
        out, lse = _softmax_attention(q, keys, values, hidden)
    if hidden is not None:  # the fused kernel returns lse 0 for a row with no entry
        lse = lse.masked_fill(hidden.all(dim=-1).expand_as(lse), float("-inf"))
    return out, lse


def _softmax_attention(
    q: torch.Tensor,  # [..., r, dim], already scaled
    keys: torch.Tensor,  # [..., S, dim]
    values: torch.Tensor,  # [..., S, dim]
    hidden: torch.Tensor | None,  # bool, broadcast to [..., r, S]: entries a row does not see
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention by matrix products: the output ``[..., r, dim]`` (in ``q``'s dtype)
    and each row's log-sum-exp ``[..., r]`` (float32; a row that sees nothing: ``-inf``, output
    0). The generated part of every step, and the prompt part off CPU."""
    scores = torch.matmul(q, keys.transpose(-2, -1))  # [..., r, S]
    if hidden is not None:
        scores = scores.masked_fill(hidden, float("-inf"))
    scores = scores.float()
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None]).nan_to_num_(0.0)  # rows that see nothing: 0
    return torch.matmul(probs.to(q.dtype), values), lse


def _merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
           lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint sets of entries from each set's normalised
    output ``[..., dim]`` and log-sum-exp ``[...]`` (``lse_b`` finite): each part is weighted by
    its share ``exp(lse - logaddexp(lse_a, lse_b))`` of the total softmax mass (float32)."""
    total = torch.logaddexp(lse_a, lse_b)
    w_a = torch.exp(lse_a - total)[..., None]
    w_b = torch.exp(lse_b - total)[..., None]
    return out_a.float() * w_a + out_b.float() * w_b


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


# kvpress wraps every attention function registered when it is imported (to hide keys per head
# with fake keys during decoding); this function masks per head itself, so it registers after
# kvpress is imported (above) and stays unwrapped.
AttentionInterface.register(ATTENTION_NAME, shared_prompt_attention)


_SWITCHABLE: set[type] = set()  # model classes whose attention switch has been validated


def _validate_switch(model: Any, name: str) -> None:
    """Switch once through ``set_attn_implementation`` (it validates the model class, reading
    its source file: too slow for every decoding step) and back; fail clearly if refused."""
    if type(model) in _SWITCHABLE:
        return
    current = model.config._attn_implementation
    model.set_attn_implementation(name)
    switched = model.config._attn_implementation == name
    model.set_attn_implementation(current)
    if not switched:
        raise ValueError(f"{type(model).__name__} does not take registered attention functions "
                         f"(transformers' AttentionInterface), which kvdrift needs; use a "
                         f"Llama-, Qwen- or Mistral-style model")
    _SWITCHABLE.add(type(model))


@contextlib.contextmanager
def attention_implementation(model: Any, name: str | None) -> Iterator[None]:
    """Temporarily switch the model's attention implementation (e.g. to eager for a prefill).

    The first switch of a model class goes through ``set_attn_implementation``; later ones set
    the config's attention implementation directly (what that method does once validated).
    """
    current = model.config._attn_implementation
    if name is None or name == current:
        yield
        return
    _validate_switch(model, name)
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = current
