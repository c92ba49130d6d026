"""The question after the compressed context: kvpress's own protocol.

kvpress's ``KVPressTextGenerationPipeline`` compresses the *context* only: it prefills the
context inside the press, then runs the question (and the chat template's tail) through the
model over the compressed cache, outside the press, and decodes from there. A method then
cannot see the question it will be asked. :func:`append_question` does that second step for
one side's prompt cache: the question's tokens attend to the side's context entries (kept
ones, hidden per KV head masked exactly) and causally to each other, at their true positions
``n_context ..``; their keys and values are appended uncompressed, and the next-token logits
are the side's own. P's side runs it over the full context cache, Q's over the compressed one,
so Q's first generated position may differ from P's (``delta_1 >= 0``).

The question's forward uses transformers' SDPA call with kvdrift's own mask (per layer: the
context's live entries, then a causal block), registered as :data:`ATTENTION_NAME`: where no
entry is hidden and every layer keeps the same number, the mask is the one transformers builds
for the pipeline's forward, so the call is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kvpress  # (imported before the registration below: kvpress wraps earlier ones)
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvdrift.lm.engine.prefill import PromptCache, as_prompt, unwrap_model
from kvdrift.lm.engine.shared_attention import attention_implementation
from kvdrift.lm.grammar.after_context import WHOLE_PROMPT_HINT, refusal

ATTENTION_NAME = "kvdrift_question"


def question_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, heads, q, head_dim]
    key: torch.Tensor,  # [1, kv_heads, P_l + q, head_dim]: the context's entries, then q's
    value: torch.Tensor,  # [1, kv_heads, P_l + q, head_dim]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    kvdrift_question_live: Sequence[torch.Tensor | None] | None = None,  # per layer [1, kv, P_l]
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA of the question's queries over the context's live entries and, causally, over the
    question's own (transformers' ``attention_mask`` is not read: this function builds it)."""
    q_len, total = query.shape[2], key.shape[2]
    n_context = total - q_len
    allowed = torch.ones(1, 1, q_len, total, dtype=torch.bool, device=query.device)
    allowed[..., n_context:] = torch.ones(q_len, q_len, dtype=torch.bool,
                                          device=query.device).tril()
    live = None if kvdrift_question_live is None else kvdrift_question_live[module.layer_idx]
    if live is not None:  # head-adaptive hiding: per query head, the KV head's live entries
        groups = query.shape[1] // key.shape[1]
        per_head = live[0].repeat_interleave(groups, dim=0)  # [heads, P_l]
        allowed = allowed.expand(1, query.shape[1], q_len, total).clone()
        allowed[0, :, :, :n_context] &= per_head[:, None, :]
    return sdpa_attention_forward(module, query, key, value, allowed, dropout=dropout,
                                  scaling=scaling, **kwargs)


AttentionInterface.register(ATTENTION_NAME, question_attention)


def append_question(model: Any, context: PromptCache, question_ids: torch.Tensor
                    ) -> PromptCache:
    """``context`` (one side's prompt cache of the context alone) with the question appended.

    Returns a prompt cache of ``n_context + q`` positions: the context's entries as they were
    (kept, hidden, quantized), then the question's ``q`` entries, computed over them; its
    logits are the next-token logits after the question on this side (module docstring).
    """
    model = unwrap_model(model)
    ids = as_prompt(question_ids, model)  # [1, q]
    n_context = context.n_prompt
    cache = DynamicCache(config=model.config)
    for i, (k, v) in enumerate(zip(context.keys, context.values, strict=True)):
        cache.update(k, v, i)
    positions = torch.arange(n_context, n_context + ids.shape[1], device=ids.device)[None]
    with torch.no_grad(), attention_implementation(model, ATTENTION_NAME):
        out = model(input_ids=ids, position_ids=positions, past_key_values=cache,
                    use_cache=True, logits_to_keep=1, kvdrift_question_live=context.live)
    keys = tuple(layer.keys for layer in cache.layers)
    values = tuple(layer.values for layer in cache.layers)
    live = None
    if context.live is not None:
        live = tuple(None if m is None else torch.cat(
            [m, m.new_ones(*m.shape[:2], ids.shape[1])], dim=-1) for m in context.live)
    return PromptCache(keys=keys, values=values, logits=out.logits[:, -1].float(),
                       n_prompt=n_context + ids.shape[1], live=live)


def after_context_refusal(action: Any, document: str | None = None) -> str | None:
    """Why ``action`` (an :class:`~kvdrift.lm.actions.spec.Action`) cannot be measured with the
    question after the compressed context yet, or None (``document``: the one that asks, for
    the message; :func:`kvdrift.lm.grammar.after_context.refusal`)."""
    return refusal(action.name, decoding=action.decoding is not None,
                   quantization=action.quantization is not None, document=document)


def press_refusal(name: str, press: Any, document: str | None = None,
                  hint: str = WHOLE_PROMPT_HINT) -> str | None:
    """As :func:`after_context_refusal`, for a press object given as action ``name``: a
    decoding press over a question is measured where it is a ``DecodingPress`` with a fixed
    ``target_size`` over a scorer (alone or as a ``PrefillDecodingPress``'s decoding press,
    :mod:`kvdrift.lm.engine.question_decoding`); any other that compresses during decoding
    (``CompressionRatioDecodingPress``, ``CAMPress``, one over ``AdaKVPress``,
    ``DMSPress(decoding=True)``) is refused."""
    if isinstance(press, kvpress.PrefillDecodingPress):
        press = press.decoding_press
    decodes = isinstance(press, kvpress.DecodingPress) or (
        isinstance(press, kvpress.DMSPress) and bool(press.decoding))
    if decodes and over_question(press):
        return None
    return refusal(name, decoding=decodes, quantization=False, document=document, hint=hint)


def over_question(press: Any) -> bool:
    """Whether kvdrift replays the decoding press ``press`` from a question's step."""
    return (isinstance(press, kvpress.DecodingPress) and not isinstance(press, kvpress.CAMPress)
            and not isinstance(press.base_press, kvpress.AdaKVPress)
            and type(press)._resolve_target_size is kvpress.DecodingPress._resolve_target_size)
