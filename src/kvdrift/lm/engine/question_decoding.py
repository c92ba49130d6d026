"""A ``DecodingPress`` over a question: the state kvpress's pipeline generates from.

kvpress's ``KVPressTextGenerationPipeline`` prefills the context (through the prefill press of
a ``PrefillDecodingPress``; uncompressed for a ``DecodingPress``), then runs the question's
tokens through the model inside the press in one forward. The ``DecodingPress``'s hook counts
that forward as a decoding step: it buffers the question's attention inputs (``q`` of them, one
buffer entry) and compresses each layer at once where the step count reaches
``compression_interval`` (an interval of 1) or the question has at least ``target_size``
tokens; otherwise the first compression comes ``compression_interval - 1`` generated steps
later and scores the question's inputs with theirs (as far as ``hidden_states_buffer_size``
reaches). :func:`question_start` builds that state for Q's side: the cache after the question
(compressed where the question's step compressed it, in kvpress's order) and the rule that
generates from it (:attr:`~kvdrift.lm.engine.decoding.DecodingRule.lead`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kvdrift.lm.engine.decoding import DecodingRule, capture_attention_inputs
from kvdrift.lm.engine.prefill import PromptCache, attention_modules, unwrap_model
from kvdrift.lm.engine.question import append_question, over_question
from kvdrift.lm.engine.row_compression import RowEntries


def replays_over_question(rule: Any) -> bool:
    """Whether kvdrift starts ``rule`` from a question's step
    (:func:`~kvdrift.lm.engine.question.over_question`: a plain ``DecodingPress``'s)."""
    return isinstance(rule, DecodingRule) and over_question(rule.press)


def question_start(model: Any, context: PromptCache, question_ids: torch.Tensor,
                   rule: DecodingRule) -> tuple[PromptCache, DecodingRule]:
    """Q's cache after the question's step and the rule that generates from it (module
    docstring); ``context`` is Q's cache of the context as the prefill left it."""
    model = unwrap_model(model)
    modules = sorted(attention_modules(model), key=lambda m: m.layer_idx)
    with capture_attention_inputs(modules) as seen:
        answered = append_question(model, context, question_ids)
    rule = rule.for_prompt(answered.n_prompt)
    q = int(question_ids.shape[-1])
    inputs = tuple(seen[m.layer_idx][0][0] for m in modules)  # per layer [q, hidden]
    if rule.interval > 1 and q < int(rule.press.target_size):
        return answered, dataclasses.replace(rule, lead=inputs)
    keys, values = [], []
    with torch.no_grad():
        for module, k, v, x in zip(modules, answered.keys, answered.values, inputs, strict=True):
            kept = rule.compress_row(module, RowEntries(k[0], v[0], x, seen[module.layer_idx][1],
                                                        0)).order  # [kv, kept]
            idx = kept[:, :, None].expand(-1, -1, k.shape[-1])
            keys.append(k[0].gather(1, idx)[None])
            values.append(v[0].gather(1, idx)[None])
    return dataclasses.replace(answered, keys=tuple(keys), values=tuple(values)), rule
