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

from kvdrift.lm.attribution import TOP_POSITIONS, LostContext
from kvdrift.lm.prefill import PromptCache, unwrap_model
from kvdrift.lm.shared_attention import attention_implementation

#: Histories replayed in one forward.
REPLAY_ROWS = 8


def loss_weights(reference: PromptCache, compressed: PromptCache) -> torch.Tensor:
    """``[layers, kv_heads, n]`` float64: w_{l,g}(j) of every prompt entry (module docstring);
    all zero where Q's cache is P's."""
    n = reference.n_prompt
    layers = []
    for i, (kp, vp) in enumerate(zip(reference.keys, reference.values, strict=True)):
        kq, vq = compressed.keys[i], compressed.values[i]
        entry = torch.cat([kp[0], vp[0]], -1).float()  # [kv_heads, n, 2d]
        held = torch.cat([kq[0], vq[0]], -1).float()  # [kv_heads, P_l, 2d]
        nearest = torch.cdist(held, entry).argmin(-1)  # [kv_heads, P_l] position of each
        entry, held = entry.double(), held.double()
        at = entry.gather(1, nearest[..., None].expand(-1, -1, entry.shape[-1]))
        distortion = ((held - at).norm(dim=-1) / at.norm(dim=-1).clamp_min(1e-30)).clamp(0, 1)
        live = compressed.live[i] if compressed.live is not None else None
        if live is not None:  # hidden entries count as lost
            distortion = torch.where(live[0].to(distortion.device), distortion, 1.0)
        w = torch.ones(entry.shape[0], n, dtype=torch.float64, device=entry.device)
        w.scatter_reduce_(1, nearest, distortion, reduce="amin")
        layers.append(w)
    return torch.stack(layers)


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
    lengths = [int(h.numel()) for h in histories]
    ids = torch.zeros(rows, 1 + max(lengths), dtype=torch.long, device=device)  # [R, L]
    ids[:, 0] = prompt_ids.reshape(-1)[-1]
    for r, h in enumerate(histories):
        ids[r, 1:1 + lengths[r]] = h.reshape(-1).to(device)
    cache = DynamicCache(config=model.config)
    for i, (k, v) in enumerate(zip(reference.keys, reference.values, strict=True)):
        cache.update(k[:, :, :n - 1].expand(rows, -1, -1, -1).contiguous(),
                     v[:, :, :n - 1].expand(rows, -1, -1, -1).contiguous(), i)
    positions = torch.arange(n - 1, n - 1 + ids.shape[1], device=device)
    with torch.no_grad(), attention_implementation(model, "eager"):
        out = model(input_ids=ids, past_key_values=cache, position_ids=positions.expand(rows, -1),
                    cache_position=positions, use_cache=True, output_attentions=True,
                    output_hidden_states=True, logits_to_keep=1)
        last = torch.tensor(lengths, device=device)  # each row's own last query
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
    out = []
    for mass in masses:
        order = torch.argsort(mass, descending=True, stable=True)[:top]
        chosen = [int(j) for j in order if float(mass[j]) > 0]
        out.append(LostContext(tuple(chosen), tuple(float(mass[j]) for j in chosen),
                               float(mass.sum())))
    return out
