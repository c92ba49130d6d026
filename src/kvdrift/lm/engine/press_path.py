"""The general path: any kvpress press object as an action, its cache as the press left it.

Named actions (and spec strings) keep the shared prefill of :mod:`kvdrift.lm.engine.prefill`, where
kvdrift knows what each press keeps. Every other press object (a user's own ``ScorerPress``,
``BasePress`` or ``DecodingPress`` subclass, compositions, kvpress classes whose cache is not a
kept set of entries: ThinK, the merging presses, DMS, SimLayerKV, KVCompose, Compactor, ...)
runs here, exactly as kvpress runs it::

    with press(model):                      # its own hooks and attention patches
        model(prompt, past_key_values=cache)
    # (presses that compress on leaving the context, e.g. KVCompose, have done so now)

Q's prompt cache is then whatever the press left stored, layer by layer: entries evicted
(layers may differ), hidden per KV head (kvpress's ``masked_key_indices``, read and masked
exactly as for head-adaptive named actions), merged, channel-pruned or re-valued. Its keys and
values are Q's own tensors, distinct from P's (like a quantized cache), and Q's first
next-token distribution is the logits of this prefill. P's cache stays the shared full
prefill. A decoding-time press (kvpress's ``DecodingPress``, alone or as the decoding half of
a ``PrefillDecodingPress``) compresses every Q row during generation with the machinery of
:mod:`kvdrift.lm.engine.decoding`.

``kv_fraction`` of such a cache is what it stores: bytes of keys and values (hidden entries
not counted, nor key or value channels that are zero in every entry a KV head keeps: a
channel-pruned press such as ThinK stores them as zeros only because kvpress keeps the shape)
over the bytes of the full cache. Records say so in ``kv_measure`` (``"stored bytes"``).

A press that fails (raises, returns the wrong shapes, keeps nothing, leaves non-finite keys or
values) raises :class:`PressFailed`: one line naming the action, the document and what was
wrong. The model is left as it was found (the press's context removes its hooks; hidden
entries are cleared), so the next unit or command runs; a press that leaves the model changed
(its config, attention implementation, buffers, a module's settings or ``forward``, a hook:
:mod:`kvdrift.lm.model_state`) is refused so, and the model put back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from kvdrift.lm.actions.attention_use import needs_eager
from kvdrift.lm.actions.hub_files import missing_files_message
from kvdrift.lm.actions.presses import fixed_press_randomness
from kvdrift.lm.actions.spec import Action
from kvdrift.lm.engine.decoding import DecodingRule
from kvdrift.lm.engine.decoding_presses import decoding_rule
from kvdrift.lm.engine.decoding_threshold import ThresholdRule
from kvdrift.lm.engine.prefill import (
    PromptCache,
    as_prompt,
    check_not_sliding,
    clear_hidden_entries,
    live_mask,
    quantized,
    take_hidden_entries,
    unwrap_model,
)
from kvdrift.lm.engine.score_shapes import WrongScores, checked_scorers
from kvdrift.lm.engine.shared_attention import attention_implementation
from kvdrift.lm.model_state import ModelState, refusal
from kvdrift.lm.quantized.transform import Quantization, QuantizingCache, kv_memory
from kvdrift.unit_errors import UnitStopped

STORED_BYTES = "stored bytes"
"""``kv_measure`` of a general-path cache: bytes of keys and values as stored."""
KEPT_ENTRIES = "kept entries"
"""``kv_measure`` of a named action's cache: its kept entries at their bits (hidden ones
counted: they stay stored)."""


class PressFailed(UnitStopped):
    """A press that failed on a document (one line: the action, the document, what was wrong)."""


@dataclass(frozen=True)
class PressCache:
    """Q's prompt cache as a press left it, its decoding-time rule and what it stores."""

    cache: PromptCache
    rule: DecodingRule | ThresholdRule | None  # compressions during Q's generation (None: none)
    kv_bytes: float
    kv_fraction: float




def press_prompt_cache(model: Any, prompt_ids: torch.Tensor, press: Any, action: str,
                       document: str, eager: bool = False,
                       quantization: Quantization | None = None) -> PressCache:
    """Q's prompt cache: the prompt's prefill run inside ``press`` (module docstring).

    ``action`` and ``document`` name the unit in a :class:`PressFailed`. The prefill runs
    with eager attention where the press reads attention weights
    (:func:`~kvdrift.lm.actions.attention_use.needs_eager`), or wherever ``eager``.
    ``quantization`` (a press chained with a quantizer, ``mine+kivi:bits=4``) quantizes what
    the press keeps as the same chain after a named action does: llama.cpp's kinds as entries
    enter the prefill's cache, KIVI after the prefill (:func:`chained_quantization`).
    """
    fail = _Failure(action, document)
    rule = decoding_rule(press, action)
    if rule is not None:  # a scorer failing during Q's steps names the unit too
        rule = dataclasses.replace(rule, label=f"its {type(rule.press).__name__}", failure=fail)
    model = unwrap_model(model)
    ids = as_prompt(prompt_ids, model)
    n = ids.shape[1]
    if quantization is not None:
        quantization.check(model.config.head_dim if getattr(model.config, "head_dim", None)
                           else model.config.hidden_size // model.config.num_attention_heads)
    cache = QuantizingCache(quantization, config=model.config) if quantization is not None \
        and quantization.before_attention else DynamicCache(config=model.config)
    clear_hidden_entries(model)  # a stale mask (left by a generate) would be read as this one's
    state = ModelState.of(model)  # a press may switch attention (KVCompose: eager), or worse
    changes: tuple = ()
    try:
        with torch.no_grad(), attention_implementation(model, "eager" if eager or
                                                        needs_eager(press) else None), \
                fixed_press_randomness(ids.device):
            with checked_scorers(press), press(model):  # some score on leaving (KVCompose)
                out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                            logits_to_keep=1)
            hidden = take_hidden_entries(model, len(cache.layers))
            if isinstance(rule, ThresholdRule):  # the prompt's window of scores
                rule = rule.after_prefill(rule.press, len(cache.layers))
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except WrongScores as exc:  # what its score returned, and what was expected
        raise fail(str(exc)) from None
    except Exception as exc:  # the press's own code: any error is its failure
        raise fail(f"the press raised {_first_line(exc, press, model)}") from exc
    finally:
        clear_hidden_entries(model)
        changes = state.changes()
        state.restore()  # as found, even if the press failed
    if changes:  # the press left the model changed: nothing it computed is used
        raise PressFailed(refusal(action, press, document, changes))
    check_not_sliding(cache)
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    live = _check_layers(keys, values, hidden, n, model.config, fail)
    if isinstance(rule, DecodingRule) and live is not None:
        raise ValueError(f"action {action!r}: its prefill press hides entries per KV head by "
                         f"their positions in the cache, and its DecodingPress's first "
                         f"compression reorders and shortens that cache, so kvpress then hides "
                         f"positions that hold other entries or no longer exist; use a prefill "
                         f"press that evicts, or the DecodingPress alone")
    logits = out.logits[:, -1].float()  # [1, V]: the press's own prefill
    if not bool(torch.isfinite(logits).all()):
        raise fail("the prefill inside the press gave non-finite logits")
    pc = PromptCache(keys=tuple(keys), values=tuple(values), logits=logits, n_prompt=n,
                     live=live)
    if quantization is not None:
        return chained_quantization(pc, rule, quantization, action)
    kv_bytes, kv_fraction = stored_memory(pc, model.config)
    return PressCache(pc, rule, kv_bytes, kv_fraction)


def chained_quantization(pc: PromptCache, rule: DecodingRule | None,
                         quantization: Quantization, action: str) -> PressCache:
    """A press's cache with a quantizer chained after it: what it keeps, quantized as a named
    chain's (:func:`~kvdrift.lm.engine.prefill.quantized`), its bytes at the quantizer's bits.
    Only a press that keeps one set of entries per KV head and compresses at prefill only."""
    if rule is not None or pc.live is not None:
        what = "compresses during decoding" if rule is not None else "hides entries per KV head"
        raise ValueError(f"action {action!r}: its press {what}; a quantization can follow a "
                         f"press that keeps one set of entries per KV head at prefill only")
    chained = quantized(pc, Action(name=action, quantization=quantization))
    kv_bytes, kv_fraction = kv_memory(chained.keys, None, chained.n_prompt, quantization)
    return PressCache(chained, None, kv_bytes, kv_fraction)


@dataclass(frozen=True)
class _Failure:
    action: str
    document: str

    def __call__(self, what: str) -> PressFailed:
        return PressFailed(f"action {self.action!r} failed on document {self.document!r}: {what}")


def _first_line(exc: BaseException, press: Any = None, model: Any = None) -> str:
    hub = _hub_file(exc)
    if hub is not None:
        name = str(getattr(getattr(model, "config", None), "name_or_path", "") or "")
        return f"{type(exc).__name__}: {missing_files_message(hub, press, name)}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def _hub_file(exc: BaseException) -> str | None:
    """``repo_id[/filename]`` of a hub download that failed within ``exc``, or None."""
    seen, found = set(), None
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if "huggingface_hub" in type(exc).__module__:
            tb = exc.__traceback__
            while tb is not None:
                f_locals = tb.tb_frame.f_locals
                repo, filename = f_locals.get("repo_id"), f_locals.get("filename")
                if isinstance(repo, str):
                    found = repo + (f"/{filename}" if isinstance(filename, str) else "")
                tb = tb.tb_next
            found = found or "a file"
        exc = exc.__cause__ or exc.__context__
    return found


def _check_layers(keys: list[torch.Tensor], values: list[torch.Tensor], hidden: list[Any],
                  n: int, config: Any, fail: _Failure) -> tuple[torch.Tensor | None, ...] | None:
    """Each layer's per-head live mask, after checking what the press left stored."""
    if len(keys) != config.num_hidden_layers:
        raise fail(f"the cache holds {len(keys)} layers, the model has "
                   f"{config.num_hidden_layers}")
    heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or \
        config.hidden_size // config.num_attention_heads
    lives = []
    for i, (k, v, h) in enumerate(zip(keys, values, hidden, strict=True)):
        if k is None or v is None or k.dim() != 4 or v.dim() != 4 or k.shape[:3] != \
                v.shape[:3] or k.shape[0] != 1 or k.shape[1] != heads:
            shapes = [tuple(t.shape) if t is not None else None for t in (k, v)]
            raise fail(f"layer {i} holds keys and values of shapes {shapes[0]} and {shapes[1]};"
                       f" expected [1, {heads}, entries, head_dim] alike")
        if k.shape[3] != head_dim or v.shape[3] != head_dim:
            raise fail(f"layer {i} holds keys and values of {k.shape[3]} and {v.shape[3]} "
                       f"channels; the model's head_dim is {head_dim}")
        if k.shape[2] > n:
            raise fail(f"layer {i} holds {k.shape[2]} entries, more than the prompt's {n}")
        try:
            live = live_mask(k, h)
        except (IndexError, RuntimeError, ValueError, TypeError) as exc:
            raise fail(f"layer {i}: its hidden entries do not index its cache "
                       f"({_first_line(exc)})") from None
        counts = live[0].sum(-1) if live is not None else torch.full((heads,), k.shape[2])
        if int(counts.min()) < 1:
            raise fail(f"layer {i} keeps nothing in a KV head ({counts.tolist()} entries per "
                       f"KV head)")
        if not (bool(torch.isfinite(k).all()) and bool(torch.isfinite(v).all())):
            raise fail(f"layer {i} holds non-finite keys or values")
        lives.append(live)
    return tuple(lives) if any(m is not None for m in lives) else None


def stored_memory(pc: PromptCache, config: Any) -> tuple[float, float]:
    """``(kv_bytes, kv_fraction)`` of a cache as stored (module docstring): per layer and KV
    head, live entries times the key and value channels not zero in all of them."""
    total = full = 0.0
    for i, (k, v) in enumerate(zip(pc.keys, pc.values, strict=True)):
        heads, width = k.shape[1], k.element_size()
        live = pc.live[i] if pc.live is not None and pc.live[i] is not None else None
        keep = torch.ones(k.shape[:3], dtype=torch.bool, device=k.device) if live is None \
            else live
        counts = keep[0].sum(-1)  # [kv_heads]
        channels = sum(((t[0] * keep[0, :, :, None]) != 0).any(dim=1).sum(-1)
                       for t in (k, v))  # [kv_heads]: stored key + value channels
        total += float((counts * channels).sum()) * width
        full += heads * pc.n_prompt * (k.shape[3] + v.shape[3]) * width
    return total, total / full


__all__ = ["KEPT_ENTRIES", "STORED_BYTES", "PressCache", "PressFailed", "decoding_rule",
           "needs_eager", "press_prompt_cache", "stored_memory"]
