"""Shared-prompt ("cascade") attention, registered with transformers' ``AttentionInterface``.

During decoding every row attends to its side's prompt entries (stored once, batch of one) and
to its own generated entries. The prompt part is one batched matrix product over all rows'
queries ``[kv_heads, n * groups, head_dim] x [kv_heads, head_dim, P]`` (the prompt is read once
per step, not once per row); the generated part is per row. Both parts' scores are joined
before one softmax, so the result is exact attention over prompt + generated entries (the
technique of Hydragen, arXiv 2402.05099, and FlashInfer's cascade attention).

The function reads the prompt from the :class:`~kvdrift.lm.cache.SharedPromptCache` passed to
the model's forward as ``kvdrift_cache=`` and which generated slots each row may attend from
``kvdrift_slots=`` (``[n, G]`` bool, the new slot included); transformers hands extra forward
keyword arguments down to the attention function. No mask is built by the model: the name is
not registered as a mask function, so transformers passes ``attention_mask=None``.

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

import torch
from transformers import AttentionInterface

from kvdrift.lm.cache import SharedPromptCache

ATTENTION_NAME = "kvdrift_shared_prompt"


def shared_prompt_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [n, heads, 1, head_dim]
    key: torch.Tensor,  # [n, kv_heads, G, head_dim]: the rows' generated keys
    value: torch.Tensor,  # [n, kv_heads, G, head_dim]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    kvdrift_cache: SharedPromptCache | None = None,
    kvdrift_slots: torch.Tensor | None = None,  # [n, G] bool
    kvdrift_live: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    kvdrift_quant: Any = None,  # GeneratedView: Q rows of a quantization action
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Exact attention of one new query per row over shared prompt + own generated entries."""
    if kvdrift_cache is None or kvdrift_slots is None:
        raise RuntimeError(f"the {ATTENTION_NAME!r} attention needs kvdrift_cache= and "
                           "kvdrift_slots= in the model's forward (it is kvdrift's decoding path)")
    n, heads, q_len, dim = query.shape
    if q_len != 1:
        raise ValueError(f"shared-prompt attention decodes one token per row; got q_len={q_len}")
    layer = kvdrift_cache.layers[module.layer_idx]
    if kvdrift_quant is not None:  # generated entries as the quantized cache holds them
        key, value = kvdrift_quant(key, value)
    prompt_keys, prompt_values = layer.prompt_keys[0], layer.prompt_values[0]  # [kv, P, dim]
    kv_heads, n_prompt = prompt_keys.shape[0], prompt_keys.shape[1]
    groups = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling

    q = query.reshape(n, kv_heads, groups, dim) * scale  # [n, kv, g, dim]
    q_shared = q.permute(1, 0, 2, 3).reshape(kv_heads, n * groups, dim)  # [kv, n g, dim]
    scores_prompt = torch.matmul(q_shared, prompt_keys.transpose(1, 2))  # [kv, n g, P]
    if layer.prompt_live is not None:
        scores_prompt = scores_prompt.masked_fill(~layer.prompt_live[0][:, None, :], float("-inf"))
    own_slots = kvdrift_slots[:, None, None, :]  # [n, 1, 1, G]
    if kvdrift_live is not None:
        prompt_live, own_live = kvdrift_live[module.layer_idx]  # [n, kv, P], [n, kv, G]
        hidden = ~prompt_live.permute(1, 0, 2)[:, :, None, :].expand(-1, -1, groups, -1)
        scores_prompt = scores_prompt.masked_fill(hidden.reshape(kv_heads, n * groups, n_prompt),
                                                  float("-inf"))
        own_slots = own_slots & own_live[:, :, None, :]  # [n, kv, 1, G]
    scores_own = torch.matmul(q, key.transpose(2, 3))  # [n, kv, g, G]
    scores_own = scores_own.masked_fill(~own_slots, float("-inf"))
    n_own = key.shape[2]
    scores_own = scores_own.permute(1, 0, 2, 3).reshape(kv_heads, n * groups, n_own)
    scores = torch.cat([scores_prompt, scores_own], dim=-1)  # [kv, n g, P + G]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)

    out = torch.matmul(probs[..., :n_prompt], prompt_values)  # [kv, n g, dim]
    out = out.reshape(kv_heads, n, groups, dim).permute(1, 0, 2, 3)  # [n, kv, g, dim]
    probs_own = probs[..., n_prompt:].reshape(kv_heads, n, groups, n_own).permute(1, 0, 2, 3)
    out = out + torch.matmul(probs_own, value)  # [n, kv, g, dim]
    return out.reshape(n, 1, heads, dim), None  # [n, q_len, heads, dim] as transformers expects


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
