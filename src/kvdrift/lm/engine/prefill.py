"""Prefill: one prompt through the model, into a full or a compressed prompt cache.

Prefill gives the full prompt cache (side ``"p"`` of :class:`~kvdrift.lm.engine.pair.LMKernelPair`);
the same prefill run inside an action's kvpress press context gives the compressed cache (side
``"q"``; kvpress compresses only in the prefill forward). The kept entries of every layer and KV
head are checked against the action's promise; layers may keep different numbers. Entries that
a head-adaptive press hides per KV head (kvpress's ``masked_key_indices``) stay stored: prefill
reads them into :attr:`PromptCache.live` and clears them from the model, and the attention of
:mod:`kvdrift.lm.engine.shared_attention` masks them exactly.

One prefill serves many actions (:func:`prefill_shared`). kvpress compresses a layer's cache in
a hook that runs after the layer's attention, and later layers never read an earlier layer's
cache during the prefill, so the prefill forward is the same with or without a press: only what
is kept differs. :func:`prefill_shared` runs the prompt once with the full cache (P) and, in a
hook on every attention layer, hands each action's own kvpress press (kvpress's
``forward_hook``: its ``compress``/``score``, chains in order, per-layer budgets, head-adaptive
hidden entries) that layer's full keys and values in a private one-layer view, then keeps what
the press left there. Each press draws its random numbers from its own stream seeded as in
:func:`prefill`, so every action keeps exactly the entries its own prefill keeps. Actions that
change the prefill computation itself fall back to their own prefill (:func:`own_prefill_reason`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from transformers import DynamicCache

from kvdrift.lm.actions.presses import PRESS_SEED, fixed_press_randomness
from kvdrift.lm.actions.spec import Action
from kvdrift.lm.engine.shared_attention import attention_implementation
from kvdrift.lm.loading.model import LoadedModel
from kvdrift.lm.quantized.transform import QuantizingCache


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
    def kept_per_layer(self) -> list[int]:
        """Prompt entries each layer keeps per KV head (head-adaptive presses: the mean over
        its KV heads, a whole number since they split a per-layer total)."""
        counts = self.counts
        return [int(row.sum()) // counts.shape[1] for row in counts]

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
    """The transformers model inside a :class:`~kvdrift.lm.loading.model.LoadedModel`
    (else ``model``)."""
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
    quant = action.quantization if action is not None else None
    if quant is not None:
        quant.check(_head_dim(model.config))
    cache = QuantizingCache(quant, config=model.config) if quant is not None and \
        quant.before_attention else DynamicCache(config=model.config)
    try:
        with (torch.no_grad(), attention_implementation(model, attn), press_ctx,
              fixed_press_randomness(ids.device)):
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        hidden = take_hidden_entries(model, len(cache.layers))
    finally:
        clear_hidden_entries(model)
    check_not_sliding(cache)
    logits = out.logits[:, -1].float()  # [1, V]
    return _prompt_cache([layer.keys for layer in cache.layers],
                         [layer.values for layer in cache.layers], hidden, logits, n, action,
                         model.config)


def check_not_sliding(cache: DynamicCache) -> None:
    if any(layer.is_sliding for layer in cache.layers):  # every cache layer says
        raise NotImplementedError("sliding-window attention layers are not supported by kvdrift")


def _prompt_cache(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
                  hidden: Sequence[Any], logits: torch.Tensor, n: int, action: Action | None,
                  config: Any) -> PromptCache:
    """A checked :class:`PromptCache` from a prefill's per-layer keys, values and hidden
    entries: the kept counts are what ``action`` promises (None: every entry)."""
    keys, values = tuple(keys), tuple(values)
    live = None
    if any(h is not None for h in hidden):
        live = tuple(live_mask(k, h) for k, h in zip(keys, hidden, strict=True))
    pc = PromptCache(keys=keys, values=values, logits=logits, n_prompt=n, live=live)
    if action is not None:
        action.check_counts(n, pc.counts, config)
    elif not pc.is_full:
        raise RuntimeError(f"the full-cache prefill kept {pc.counts.tolist()} entries, not all "
                           f"{n}")
    return quantized(pc, action)


def quantized(pc: PromptCache, action: Action | None) -> PromptCache:
    """``pc`` with ``action``'s KIVI quantization applied to its kept entries (a new cache;
    gguf and fp8 entries were quantized as they entered the prefill's cache: ``pc`` as is)."""
    quant = action.quantization if action is not None else None
    if quant is None or quant.before_attention:
        return pc
    pairs = [quant.prompt(k, v) for k, v in zip(pc.keys, pc.values, strict=True)]
    return dataclasses.replace(pc, keys=tuple(k for k, _ in pairs),
                               values=tuple(v for _, v in pairs))


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def own_prefill_reason(action: Action) -> str | None:
    """Why ``action`` needs its own prefill forward rather than :func:`prefill_shared`'s, or
    None if the full-cache prefill serves it.

    A press that reads eager attention weights (ObservedAttentionPress) needs a prefill with
    eager attention, which the full-cache prefill does not use: its hidden states differ from
    the default attention's by float noise, and so could its kept set.
    """
    if action.needs_attention_weights:
        names = ", ".join(s.scorer_name for s in action.stages if s.needs_attention_weights)
        return f"{names} reads eager attention weights, which the shared prefill does not compute"
    if action.quantization is not None and action.quantization.before_attention:
        return (f"{action.quantization.label} quantizes entries before the prefill's attention "
                f"reads them (llama.cpp), so its prefill forward differs from P's")
    return None


@dataclass(frozen=True)
class SharedPrefill:
    """The full prompt cache and the compressed caches of several actions from one forward."""

    reference: PromptCache
    compressed: dict[str, PromptCache]  # action name -> its prompt cache (logits: P's)


def prefill_shared(model: Any, prompt_ids: torch.Tensor, actions: Sequence[Action] = ()
                   ) -> SharedPrefill:
    """One prefill forward: the full prompt cache and every action's compressed cache.

    Each action's cache is what :func:`prefill` inside its press keeps, entry for entry and
    in the same order (module docstring). Actions whose prefill evicts nothing share P's
    cache; an action with an :func:`own_prefill_reason` is refused (ValueError). Besides P's
    cache, the forward holds each action's kept entries (at most its budget per layer) and,
    per layer, only the tensors a press computes from that layer's inputs while it runs.
    """
    for action in actions:
        reason = own_prefill_reason(action)
        if reason is not None:
            raise ValueError(f"action {action.name} needs its own prefill: {reason}")
    model = unwrap_model(model)
    ids = as_prompt(prompt_ids, model)
    n = ids.shape[1]
    presses = {a.name: a.make_press(n) for a in actions if not a.prefill_is_noop(n)}
    presses = {name: press for name, press in presses.items() if press is not None}
    for action in actions:
        if action.quantization is not None:
            action.quantization.check(_head_dim(model.config))
    n_layers = model.config.num_hidden_layers
    views = {name: SimpleNamespace(layers=[SimpleNamespace(keys=None, values=None)
                                           for _ in range(n_layers)]) for name in presses}
    hidden: dict[str, list[Any]] = {name: [None] * n_layers for name in presses}
    streams = _PressStreams(ids.device, presses)

    def hook(module: Any, args: Any, kwargs: dict, output: Any) -> Any:
        i = module.layer_idx
        full = kwargs["past_key_values"].layers[i]
        for name, press in presses.items():
            view = views[name]
            view.layers[i].keys, view.layers[i].values = full.keys, full.values
            with streams.drawing(name):
                press.forward_hook(module, args, {**kwargs, "past_key_values": view}, output)
            hidden[name][i] = getattr(module, "masked_key_indices", None)
            if hidden[name][i] is not None:  # read, then cleared for the next press
                module.masked_key_indices = None
        return output

    cache = DynamicCache(config=model.config)
    handles = []
    try:
        prepare_presses(model, presses.values())
        handles = [m.register_forward_hook(hook, with_kwargs=True)
                   for m in attention_modules(model)]
        with torch.no_grad(), attention_implementation(model, None), \
                torch.random.fork_rng(devices=_cuda_devices(ids.device)):
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
        clear_hidden_entries(model)
    check_not_sliding(cache)
    logits = out.logits[:, -1].float()  # [1, V]
    reference = _prompt_cache([layer.keys for layer in cache.layers],
                              [layer.values for layer in cache.layers], [None] * n_layers,
                              logits, n, None, model.config)
    by_name = {a.name: a for a in actions}
    compressed = {}
    for action in actions:
        if action.name not in presses:  # nothing evicted at prefill: P's cache (quantized)
            compressed[action.name] = quantized(reference, action)
            continue
        layers = views[action.name].layers
        compressed[action.name] = _prompt_cache(
            [layer.keys for layer in layers], [layer.values for layer in layers],
            hidden[action.name], logits, n, by_name[action.name], model.config)
    return SharedPrefill(reference, compressed)


def prepare_presses(model: Any, presses: Any) -> None:
    """What kvpress's press context does before it hooks a model: each press's
    ``post_init_from_model``, and the rotary embedding on every attention module."""
    base = model.model
    language_model = base.language_model if hasattr(base, "language_model") else base
    for layer in language_model.layers:
        layer.self_attn.rotary_emb = language_model.rotary_emb
    for press in presses:
        press.post_init_from_model(model)


def _cuda_devices(device: torch.device) -> list[int]:
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


class _PressStreams:
    """One random stream per press, each starting where :func:`fixed_press_randomness` starts
    a press's own prefill, so interleaving presses in one forward changes no press's draws."""

    def __init__(self, device: torch.device, names: Any):
        self.cuda = _cuda_devices(device)
        with torch.random.fork_rng(devices=self.cuda):
            torch.default_generator.manual_seed(PRESS_SEED)
            for index in self.cuda:
                with torch.cuda.device(index):
                    torch.cuda.manual_seed(PRESS_SEED)
            start = self._get()
        self.states = {name: start for name in names}

    def _get(self) -> tuple[torch.Tensor, ...]:
        return (torch.get_rng_state(), *(torch.cuda.get_rng_state(i) for i in self.cuda))

    def _set(self, state: tuple[torch.Tensor, ...]) -> None:
        torch.set_rng_state(state[0])
        for index, cuda_state in zip(self.cuda, state[1:], strict=True):
            torch.cuda.set_rng_state(cuda_state, index)

    @contextlib.contextmanager
    def drawing(self, name: str) -> Any:
        self._set(self.states[name])
        try:
            yield
        finally:
            self.states[name] = self._get()


def attention_modules(model: Any) -> list[Any]:
    """The model's attention modules (those with a ``layer_idx`` and an ``o_proj``)."""
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "o_proj")]


def take_hidden_entries(model: Any, n_layers: int) -> list[Any]:
    """Per layer, the (batch, head, position) indices a head-adaptive press hid (kvpress's
    ``masked_key_indices``, which it would emulate with fake keys during decoding), or None."""
    hidden: list[Any] = [None] * n_layers
    for module in attention_modules(model):
        indices = getattr(module, "masked_key_indices", None)
        if indices is not None:
            hidden[module.layer_idx] = indices
    return hidden


def clear_hidden_entries(model: Any) -> None:
    """Forget kvpress's per-head masks: kvdrift masks exactly, and a stale one left on a module
    would make kvpress's attention patch overwrite keys in a later forward."""
    for module in attention_modules(model):
        if getattr(module, "masked_key_indices", None) is not None:
            module.masked_key_indices = None


def live_mask(keys: torch.Tensor, hidden: Any) -> torch.Tensor | None:
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
