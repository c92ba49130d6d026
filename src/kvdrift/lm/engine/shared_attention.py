"""Shared-prompt ("cascade") attention, registered with transformers' ``AttentionInterface``.

During decoding every row attends to its side's prompt entries (stored once, batch of one) and
to its own generated entries. The prompt part is one attention call over all rows' queries
``[kv_heads, n * groups, head_dim]`` against ``[kv_heads, P, head_dim]`` (the prompt is read
once per step, not once per row; on CPU PyTorch's fused flash-attention kernel); the generated
part is per row. The two partial results are merged by their log-sum-exps, so the result is
exact attention over prompt + generated entries (the technique of Hydragen, arXiv 2402.05099,
and FlashInfer's cascade attention).

The function reads the prompt from the :class:`~kvdrift.lm.engine.cache.SharedPromptCache` passed to
the model's forward as ``kvdrift_cache=`` and which generated slots each row may attend from
``kvdrift_slots=`` (``[n, G]`` bool, the new slot included); transformers hands extra forward
keyword arguments down to the attention function. No mask is built by the model: the name is
not registered as a mask function, so transformers passes ``attention_mask=None``.

A joint step (:meth:`~kvdrift.lm.engine.pair.LMKernelPair.advance_many`) passes a
:class:`~kvdrift.lm.engine.cache.GroupedCache` instead: rows of several path states in one batch,
grouped by side; each run of states of one side reads its prompt in one call, and
each state's rows attend their own generated entries (``kvdrift_slots`` and ``kvdrift_live``
then hold one entry per state).

Eviction that differs per KV head is a mask, never a copy: the layer's ``prompt_live``
(``[1, kv_heads, P]``, head-adaptive presses, shared by all rows) and, for decode-time
eviction, ``kvdrift_live=`` (per layer a pair of per-row masks ``[n, kv_heads, P]`` over the
prompt and ``[n, kv_heads, G]`` over the generated slots). Hidden entries get score ``-inf``
before the softmax, so they take exactly zero weight. A state whose rows hold their live
entries themselves (:mod:`~kvdrift.lm.engine.live_rows`) passes :data:`UNREAD` as its prompt
mask: when no row of a group reads the prompt, the prompt is not read at all.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import kvpress  # noqa: F401  (imported before the registration below: see there)
import torch
from transformers import AttentionInterface

from kvdrift.lm.engine.cache import GroupedCache, SharedPromptCache

ATTENTION_NAME = "kvdrift_shared_prompt"
UNREAD = "unread"  # a state's prompt mask when none of its rows reads the prompt any more


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
    kvdrift_slot_bias: Any = None,  # [n, 1, 1, G] additive mask of kvdrift_slots (per part)
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Exact attention of one new query per row over shared prompt + own generated entries.

    With a :class:`~kvdrift.lm.engine.cache.GroupedCache` (a joint step of several path states),
    ``kvdrift_slots`` and ``kvdrift_live`` hold one entry per part (state); each run of parts
    of one group reads its prompt in one call, and each part its own generated entries.
    ``kvdrift_slot_bias`` (optional) is ``kvdrift_slots`` as an additive mask
    (:func:`hidden_bias` of its negation), built once per step instead of once per layer.
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
        return _attend_groups(query, scale, [[(layer, key, value, kvdrift_slots, live)]],
                              [kvdrift_slot_bias]), None
    grouped = kvdrift_cache.layers[module.layer_idx]
    parts_n = len(grouped.parts)
    lives = kvdrift_live if kvdrift_live is not None else [None] * parts_n
    quants = kvdrift_quant if kvdrift_quant is not None else [None] * parts_n
    biases = kvdrift_slot_bias if kvdrift_slot_bias is not None else [None] * parts_n
    groups, start = [], 0
    for stop in _group_ends(kvdrift_cache.groups):
        groups.append([(part, *_generated(quants[i], part.keys, part.values), kvdrift_slots[i],
                        None if lives[i] is None else lives[i][module.layer_idx])
                       for i, part in enumerate(grouped.parts[start:stop], start)])
        start = stop
    return _attend_groups(query, scale, groups, biases), None


def _generated(quant: Any, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A part's generated entries as its cache holds them (quantized for Q of a quantization
    action, else as stored)."""
    return (keys, values) if quant is None else quant(keys, values)


def _group_ends(groups: list[int]) -> list[int]:
    """End index (exclusive) of each run of consecutive equal group ids."""
    return [i + 1 for i in range(len(groups)) if i + 1 == len(groups) or groups[i + 1] != groups[i]]


def hidden_bias(hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask of ``hidden`` (bool, True = entry not attended): ``-inf``
    there, 0 elsewhere. Every mask (head-adaptive, per-row, generated slots) reaches every
    attention path (fused CPU kernel, CUDA kernels, matrix products) in this one form."""
    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill_(
        hidden, float("-inf"))


def _attend_groups(
    query: torch.Tensor,  # [n, heads, 1, head_dim], rows of every part of every group in order
    scale: float,
    groups: list[list[tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, Any]]],
    slot_biases: list[torch.Tensor | None] | None = None,  # per part: [m, 1, 1, G] or None
) -> torch.Tensor:
    """Attention of the rows of groups of parts; the parts of a group share one prompt:
    ``(layer, generated keys [m, kv, G, dim], generated values, slots [m, G] bool,
    decode-time live masks or None)`` per part. Each group's prompt is read once for all its
    rows (one fused call, :func:`_prompt_part`); each part's rows attend their own generated
    entries (one fused call per part); the two partial results of every row are merged by
    their log-sum-exps (:func:`_merge`, once for all rows), which is exact softmax attention
    over prompt + generated entries. Returns ``[n, 1, heads, head_dim]`` as transformers
    expects."""
    n, heads, _, dim = query.shape
    kv_heads = groups[0][0][0].prompt_keys.shape[1]
    g = heads // kv_heads
    q = query.reshape(n, kv_heads, g, dim)
    if q.device.type == "cpu" and q.dtype in HALF:
        q = q.float()  # scaled in float32, as PyTorch's CPU kernels scale
    q = q * scale  # [n, kv, g, dim], once for all rows
    outs_p, lses_p, outs_o, lses_o = [], [], [], []
    start, index = 0, 0
    for parts in groups:
        m = sum(part[1].shape[0] for part in parts)
        q_group = q[start:start + m]
        out, lse = _prompt_part(q_group, parts)  # [m, kv, g, dim], [m, kv, g]
        outs_p.append(out)
        lses_p.append(lse)
        row = 0
        for _, key, value, slots, live in parts:
            rows = key.shape[0]
            bias = None if slot_biases is None else slot_biases[index]
            if live is not None:  # decode-time eviction: per-row, per-head generated masks
                bias = hidden_bias(~(slots[:, None, None, :] & live[1][:, :, None, :]), q.dtype)
            elif bias is None or bias.dtype != q.dtype:
                bias = hidden_bias(~slots[:, None, None, :], q.dtype)  # [m, 1, 1, G]
            # lse is finite: a row always sees its new slot
            out, lse = _fused_attention(q_group[row:row + rows], key, value, bias)
            outs_o.append(out)
            lses_o.append(lse)
            row += rows
            index += 1
        start += m

    def joined(items: list[torch.Tensor]) -> torch.Tensor:
        return items[0] if len(items) == 1 else torch.cat(items)

    out = _merge(joined(outs_p), joined(lses_p), joined(outs_o), joined(lses_o))
    return out.to(query.dtype).reshape(n, 1, heads, dim)


def _prompt_part(
    q: torch.Tensor,  # [m, kv, g, dim], already scaled: the rows of one group
    parts: list[tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, Any]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One group's attention over its prompt: ``[m, kv, g, dim]`` and log-sum-exps
    ``[m, kv, g]``, all the group's rows as one query block per KV head."""
    m, kv_heads, g, dim = q.shape
    layer = parts[0][0]
    prompt_keys, prompt_values = layer.prompt_keys[0], layer.prompt_values[0]  # [kv, P, dim]
    n_prompt = prompt_keys.shape[1]
    if all(live is not None and live[0] is UNREAD for *_, live in parts):
        # every row holds its live entries itself (compacted decode-time eviction): no prompt
        return q.new_zeros(m, kv_heads, g, dim), torch.full(
            (m, kv_heads, g), float("-inf"), dtype=torch.float32, device=q.device)
    hidden = None  # [kv, 1 or m g, P] bool: prompt entries a row does not attend
    if layer.prompt_live is not None:
        hidden = ~layer.prompt_live[0][:, None, :]
    if any(live is not None for *_, live in parts):  # decode-time eviction: per-row masks
        per_row = []
        for _, key, _, _, live in parts:
            rows = key.shape[0]
            if live is None or live[0] is UNREAD:
                per_row.append(torch.full((kv_heads, rows * g, n_prompt), live is not None,
                                          dtype=torch.bool, device=q.device))
            else:  # [rows, kv, P] -> [kv, rows g, P]
                rows_hidden = ~live[0].permute(1, 0, 2)[:, :, None, :].expand(-1, -1, g, -1)
                per_row.append(rows_hidden.reshape(kv_heads, rows * g, n_prompt))
        rows_hidden = torch.cat(per_row, dim=1)
        hidden = rows_hidden if hidden is None else hidden | rows_hidden
    q_shared = q.permute(1, 0, 2, 3).reshape(kv_heads, m * g, dim)  # [kv, m g, dim]
    out, lse = _prompt_attention(q_shared, prompt_keys, prompt_values, hidden)
    return (out.reshape(kv_heads, m, g, dim).permute(1, 0, 2, 3),
            lse.reshape(kv_heads, m, g).permute(1, 0, 2))


def _prompt_attention(
    q: torch.Tensor,  # [kv, r, dim], already scaled
    keys: torch.Tensor,  # [kv, P, dim]
    values: torch.Tensor,  # [kv, P, dim]
    hidden: torch.Tensor | None,  # [kv, 1 or r, P] bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of ``r`` query rows per KV head over the prompt alone: the output
    ``[kv, r, dim]`` and each row's log-sum-exp of scores ``[kv, r]`` (float32; ``-inf`` for a
    row that sees no prompt entry, whose output is then 0).

    One fused call (:func:`_fused_attention`): on CPU PyTorch's flash-attention kernel, which
    never builds the ``[kv, r, P]`` score matrix (measured 2.6x faster than two matrix
    products and a softmax over a 4,000-entry prompt); on CUDA PyTorch's flash or
    memory-efficient kernel; elsewhere matrix products and a softmax.
    """
    bias = None if hidden is None else hidden_bias(hidden, q.dtype)[None]
    out, lse = _fused_attention(q[None], keys[None], values[None], bias)
    out, lse = out[0], lse[0]
    if hidden is not None:  # the fused kernel returns lse 0 for a row with no entry
        lse = lse.masked_fill(hidden.all(dim=-1).expand_as(lse), float("-inf"))
    return out, lse


def _fused_attention(
    q: torch.Tensor,  # [b, h, r, dim], already scaled
    keys: torch.Tensor,  # [b, h, S, dim]
    values: torch.Tensor,  # [b, h, S, dim]
    bias: torch.Tensor | None,  # additive mask broadcast to [b, h, r, S] (hidden_bias)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with the log-sum-exp ``[b, h, r]`` (float32) in one kernel where the
    device has one: on CPU ``_scaled_dot_product_flash_attention_for_cpu``; on CUDA
    ``_scaled_dot_product_flash_attention`` (no mask, half precision) or
    ``_scaled_dot_product_efficient_attention`` (any mask); else, or if the kernel refuses the
    inputs, matrix products and a softmax (:func:`_softmax_attention`). The log-sum-exp of a
    row that sees no entry is not defined here (callers that allow such rows fix it)."""
    if q.device.type == "cpu" and keys.dtype in HALF:
        # both parts in float32, rounded once after the merge (as PyTorch's CPU kernel over
        # the whole cache rounds its float32 result once)
        q, keys, values = q.float(), keys.float(), values.float()
        bias = None if bias is None else bias.float()
    if q.device.type == "cpu" and _FLASH_CPU is not None:
        return _FLASH_CPU(q, keys, values, attn_mask=bias, scale=1.0)
    if q.device.type == "cuda" and _CUDA_KERNELS_OK[0]:
        try:
            return _cuda_attention(q, keys, values, bias)
        except RuntimeError as exc:  # an input the kernels refuse: the matrix products
            _CUDA_KERNELS_OK[0] = False
            warnings.warn(f"kvdrift: PyTorch's fused CUDA attention refused the shared-prompt "
                          f"attention's inputs ({exc}); using matrix products", stacklevel=2)
    return _softmax_attention(q, keys, values, bias)


def _cuda_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_fused_attention` on CUDA (not measured in this project: no GPU was lent to its
    sessions; see docs/engine.md). Mirrors the CPU call: same scaled queries, same additive
    mask, log-sum-exp returned for the same merge."""
    b, h, r, dim = q.shape
    flash, efficient = _cuda_kernels()
    if bias is None and q.dtype in (torch.float16, torch.bfloat16) and dim <= 256:
        out, lse = flash(q, keys, values, 0.0, False, False, scale=1.0)[:2]
        return out, lse.float()
    if bias is not None:  # the kernel reads the mask with its last axis aligned to 16 entries
        s = bias.shape[-1]
        aligned = torch.nn.functional.pad(bias, (0, -s % 16))[..., :s]
        bias = aligned.expand(b, h, r, s)
    out, lse = efficient(q, keys, values, bias, True, 0.0, False, scale=1.0)[:2]
    return out, lse[..., :r].float()  # the kernel pads the query axis of lse (to 32)


def _cuda_kernels() -> tuple[Any, Any]:
    """PyTorch's CUDA flash and memory-efficient attention operators (looked up when used)."""
    return (torch.ops.aten._scaled_dot_product_flash_attention,
            torch.ops.aten._scaled_dot_product_efficient_attention)


def _softmax_attention(
    q: torch.Tensor,  # [..., r, dim], already scaled
    keys: torch.Tensor,  # [..., S, dim]
    values: torch.Tensor,  # [..., S, dim]
    bias: torch.Tensor | None,  # additive mask (hidden_bias), broadcast to [..., r, S]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention by matrix products: the output ``[..., r, dim]`` (in ``q``'s dtype)
    and each row's log-sum-exp ``[..., r]`` (float32; a row that sees nothing: ``-inf``, output
    0). Where no fused kernel runs."""
    scores = torch.matmul(q, keys.transpose(-2, -1))  # [..., r, S]
    if bias is not None:
        scores = scores + bias  # s + 0 is s, s + -inf is -inf: a masked_fill
    scores = scores.float()
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None]).nan_to_num_(0.0)  # rows that see nothing: 0
    return torch.matmul(probs.to(q.dtype), values), lse


def _merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
           lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint sets of entries from each set's normalised
    output ``[..., dim]`` and log-sum-exp ``[...]`` (``lse_b`` finite): part ``a`` takes the
    share ``exp(lse_a) / (exp(lse_a) + exp(lse_b)) = sigmoid(lse_a - lse_b)`` of the softmax
    mass, part ``b`` the rest (in float32 at least; ``lse_a = -inf``: exactly ``out_b``)."""
    dtype = torch.promote_types(torch.promote_types(out_a.dtype, lse_a.dtype), torch.float32)
    share = torch.sigmoid(lse_a - lse_b).to(dtype)[..., None]
    return torch.lerp(out_b.to(dtype), out_a.to(dtype), share)


#: On CPU a half-precision model's attention runs in float32 and is rounded once (on a GPU the
#: fused kernels take half precision themselves).
HALF = (torch.bfloat16, torch.float16)
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CUDA_KERNELS_OK = [True]  # cleared (with a warning) the first time a CUDA kernel refuses


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
