"""The attribution's algorithm before issue 45 (kvdrift.lm.attribution at d05dcf6), kept as
the reference the new one is checked against (tests/test_attribution.py) and measured beside it
(benchmarks/attribution_memory.py).

It matches Q's entries to P's by a ``[kv_heads, kept, n]`` distance matrix per layer and replays
the divergence step with eager attention, ``output_attentions=True``: every layer's weights of
every query, on a copy of P's prompt cache per history. Its memory grows with the square of the
prompt length; do not use it outside tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from kvdrift.lm import attribution
from kvdrift.lm.attribution import TOP_POSITIONS, LostContext
from kvdrift.lm.engine.prefill import PromptCache, unwrap_model
from kvdrift.lm.engine.shared_attention import attention_implementation

#: Histories replayed in one forward.
REPLAY_ROWS = 8


def loss_weights(reference: PromptCache, compressed: PromptCache) -> torch.Tensor:
    """The loss weights with each held entry matched by the whole ``[kv_heads, kept, n]``
    distance matrix (in float32) of each layer."""
    return attribution.loss_weights(reference, compressed, match=distance_matrix_match)


def distance_matrix_match(entries: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``[kv_heads, m]``: the nearest of P's entries to each held one, all at once."""
    return torch.cdist(held.float(), entries.float()).argmin(-1)


def divergence_attention(model: Any, reference: PromptCache, prompt_ids: torch.Tensor,
                         histories: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """P's attention at the step after each history (``[m]`` long, m >= 0 generated tokens):
    ``[R, layers, heads, n]`` float64 weights of each history's last query on the prompt
    positions, and those steps' next-token logits ``[R, V]`` (P's, for checking the replay).

    Histories are replayed together, right-padded, :data:`REPLAY_ROWS` at a time in order of
    length (the least padding): a causal query never sees the padding after it, so each row's
    last real query is its own step."""
    model = unwrap_model(model)
    order = sorted(range(len(histories)), key=lambda i: histories[i].numel())
    weights, logits = [], []
    for start in range(0, len(order), REPLAY_ROWS):
        chunk = [histories[i] for i in order[start:start + REPLAY_ROWS]]
        w, lg = _replay(model, reference, prompt_ids, chunk)
        weights.append(w)
        logits.append(lg)
    back = torch.argsort(torch.tensor(order))  # the rows in the order given
    return torch.cat(weights)[back], torch.cat(logits)[back]


def _replay(model: Any, reference: PromptCache, prompt_ids: torch.Tensor,
            histories: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`divergence_attention` of at most :data:`REPLAY_ROWS` histories in one forward."""
    n, rows = reference.n_prompt, len(histories)
    device = reference.keys[0].device
    ids, last = attribution.replay_ids(prompt_ids, histories, device)  # [R, L], [R]
    cache = DynamicCache(config=model.config)
    for i, (k, v) in enumerate(zip(reference.keys, reference.values, strict=True)):
        cache.update(k[:, :, :n - 1].expand(rows, -1, -1, -1).contiguous(),
                     v[:, :, :n - 1].expand(rows, -1, -1, -1).contiguous(), i)
    positions = torch.arange(n - 1, n - 1 + ids.shape[1], device=device)
    with torch.no_grad(), attention_implementation(model, "eager"):
        out = model(input_ids=ids, past_key_values=cache, position_ids=positions.expand(rows, -1),
                    cache_position=positions, use_cache=True, output_attentions=True,
                    output_hidden_states=True, logits_to_keep=1)
        rows_at = torch.arange(rows, device=device)
        weights = torch.stack([a[rows_at, :, last, :n].double() for a in out.attentions], 1)
        logits = model.get_output_embeddings()(out.hidden_states[-1][rows_at, last]).float()
    return weights, logits


def lost_contexts(model: Any, reference: PromptCache, compressed: PromptCache,
                  prompt_ids: torch.Tensor, histories: Sequence[torch.Tensor],
                  top: int = TOP_POSITIONS) -> list[LostContext]:
    """For each history (a divergent replicate's x_1..x_{tau-1}), the prompt positions Q had
    lost, ranked by P's attention at the step after it (module docstring)."""
    if compressed is reference or not histories:
        return [LostContext((), (), 0.0) for _ in histories]
    w = loss_weights(reference, compressed)  # [layers, kv_heads, n]
    attention, _ = divergence_attention(model, reference, prompt_ids, histories)
    per_kv = attention.shape[2] // w.shape[1]
    masses = (attention * w.repeat_interleave(per_kv, dim=1)).mean(dim=(1, 2))  # [R, n]
    return attribution.ranked(masses, top)
