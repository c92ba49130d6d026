"""Prefill: one prompt through the model, into a full or a compressed prompt cache.

Prefill gives the full prompt cache (side ``"p"`` of :class:`~kvdrift.lm.pair.LMKernelPair`);
the same prefill run inside an action's kvpress press context gives the compressed cache (side
``"q"``; kvpress compresses only in the prefill forward). The kept entries of every layer and KV
head are checked against the action's promise; layers may keep different numbers. Entries that
a head-adaptive press hides per KV head (kvpress's ``masked_key_indices``) stay stored: prefill
reads them into :attr:`PromptCache.live` and clears them from the model, and the attention of
:mod:`kvdrift.lm.shared_attention` masks them exactly.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from kvdrift.lm.actions import Action
from kvdrift.lm.model import LoadedModel
from kvdrift.lm.presses import fixed_press_randomness
from kvdrift.lm.shared_attention import attention_implementation


@dataclass(frozen=True)
class PromptCache:
    """The KV cache of one prompt after prefill (batch of one) and its next-token logits.

    Layers may hold different numbers of entries (per-layer budgets); ``live`` marks, per layer,
    the entries each KV head attends to when a head-adaptive press hides some (None: all).
    """

    keys: tuple[torch.Tensor, ...]  # per layer [1, kv_heads, P_l, head_dim]
    values: tuple[torch.Tensor, ...]  # per layer [1, kv_heads, P_l, head_dim]
    logits: torch.Tensor  # [1, V] float32: next-token logits after the full prompt
    n_prompt: int  # true prompt length; generated token t sits at position n_prompt + t - 1
    live: tuple[torch.Tensor | None, ...] | None = None  # per layer [1, kv_heads, P_l] bool

    def __post_init__(self) -> None:
        if len(self.keys) == 0 or len(self.keys) != len(self.values):
            raise ValueError("a prompt cache needs the same positive number of key and value "
                             "layers")
        if any(k.shape[2] != v.shape[2] for k, v in zip(self.keys, self.values, strict=True)):
            raise ValueError("keys and values of a layer must hold the same number of entries")
        if self.live is not None and len(self.live) != len(self.keys):
            raise ValueError(f"live needs one entry per layer ({len(self.keys)}); got "
                             f"{len(self.live)}")
        counts = self.counts
        if int(counts.min()) < 1 or int(counts.max()) > self.n_prompt:
            raise ValueError(f"kept entries must be in [1, {self.n_prompt}] in every layer and "
                             f"KV head; got {counts.tolist()}")

    @property
    def counts(self) -> torch.Tensor:
        """``[layers, kv_heads]`` long: prompt entries each KV head of each layer attends to."""
        rows = []
        for i, k in enumerate(self.keys):
            live = self.live[i] if self.live is not None else None
            if live is None:
                rows.append(torch.full((k.shape[1],), k.shape[2], dtype=torch.long))
            else:
                rows.append(live[0].sum(-1).long().cpu())
        return torch.stack(rows)

    @property
    def kept(self) -> int:
        """Prompt entries per layer and KV head; ValueError if layers or heads differ."""
        counts = self.counts
        if int(counts.min()) != int(counts.max()):
            raise ValueError(f"layers or KV heads keep different numbers of prompt entries "
                             f"({counts.tolist()}); see counts")
        return int(counts[0, 0])

    @property
    def is_full(self) -> bool:
        """Whether every layer and KV head holds all ``n_prompt`` entries."""
        return bool((self.counts == self.n_prompt).all())



def unwrap_model(model: Any) -> Any:
    """The transformers model inside a :class:`~kvdrift.lm.model.LoadedModel` (else ``model``)."""
    return model.model if isinstance(model, LoadedModel) else model


def prefill(model: Any, prompt_ids: torch.Tensor, action: Action | None = None) -> PromptCache:
    """Run the prompt through the model, inside ``action``'s press context if it evicts.

    Returns the (possibly compressed) prompt cache and the next-token logits of the prefill,
    which always see the full prompt (kvpress compresses each layer after its attention).
    The entries kept in every layer and KV head are checked against what the action promises.
    """
    model = unwrap_model(model)
    ids = as_prompt(prompt_ids, model)
    n = ids.shape[1]
    press = action.make_press(n) if action is not None else None
    if press is not None and action.prefill_is_noop(n):
        press = None  # a decoding-only action leaves the prefill alone
    press_ctx = press(model) if press is not None else contextlib.nullcontext()
    attn = "eager" if press is not None and action.needs_attention_weights else None
    cache = DynamicCache(config=model.config)
    try:
        with (torch.no_grad(), attention_implementation(model, attn), press_ctx,
              fixed_press_randomness(ids.device)):
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        hidden = _take_hidden_entries(model, len(cache.layers))
    finally:
        _clear_hidden_entries(model)
    if any(layer.is_sliding for layer in cache.layers):  # every cache layer says
        raise NotImplementedError("sliding-window attention layers are not supported by kvdrift")
    keys = tuple(layer.keys for layer in cache.layers)
    values = tuple(layer.values for layer in cache.layers)
    live = None
    if any(h is not None for h in hidden):
        live = tuple(_live_mask(k, h) for k, h in zip(keys, hidden, strict=True))
    logits = out.logits[:, -1].float()  # [1, V]
    pc = PromptCache(keys=keys, values=values, logits=logits, n_prompt=n, live=live)
    if action is not None:
        action.check_counts(n, pc.counts, model.config)
    elif not pc.is_full:
        raise RuntimeError(f"the full-cache prefill kept {pc.counts.tolist()} entries, not all "
                           f"{n}")
    return pc


def attention_modules(model: Any) -> list[Any]:
    """The model's attention modules (those with a ``layer_idx`` and an ``o_proj``)."""
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "o_proj")]


def _take_hidden_entries(model: Any, n_layers: int) -> list[Any]:
    """Per layer, the (batch, head, position) indices a head-adaptive press hid (kvpress's
    ``masked_key_indices``, which it would emulate with fake keys during decoding), or None."""
    hidden: list[Any] = [None] * n_layers
    for module in attention_modules(model):
        indices = getattr(module, "masked_key_indices", None)
        if indices is not None:
            hidden[module.layer_idx] = indices
    return hidden


def _clear_hidden_entries(model: Any) -> None:
    """Forget kvpress's per-head masks: kvdrift masks exactly, and a stale one left on a module
    would make kvpress's attention patch overwrite keys in a later forward."""
    for module in attention_modules(model):
        if getattr(module, "masked_key_indices", None) is not None:
            module.masked_key_indices = None


def _live_mask(keys: torch.Tensor, hidden: Any) -> torch.Tensor | None:
    """``[1, kv_heads, P]`` bool: False at the entries a head-adaptive press hid."""
    if hidden is None:
        return None
    _, head_idx, seq_idx = hidden
    live = torch.ones(keys.shape[:3], dtype=torch.bool, device=keys.device)
    live[0, head_idx.to(keys.device), seq_idx.to(keys.device)] = False
    return live


def as_prompt(prompt_ids: torch.Tensor, model: Any) -> torch.Tensor:
    """``prompt_ids`` (``[n]`` or ``[1, n]`` integer ids) as a ``[1, n]`` long tensor on the
    model's device; ValueError for any other shape, an empty prompt or non-integer ids."""
    ids = torch.as_tensor(prompt_ids)
    if ids.ndim == 1:
        ids = ids.unsqueeze(0)
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise ValueError(f"prompt_ids must have shape [n] or [1, n]; got {tuple(ids.shape)}")
    if ids.shape[1] < 1:
        raise ValueError("prompt_ids is empty; a document needs at least one token")
    if ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"prompt_ids must be integer token ids; got dtype {ids.dtype}")
    return ids.to(device=model.device, dtype=torch.long)  # [1, n]
