"""What Q's cache had lost at the divergence: the prompt entries that P's query attended to at
a replicate's first divergence and that Q's cache no longer holds (docs/method.md, section 8,
"What the compressed cache had lost at the divergence").

At the first divergence tau the two branches share the history x_1..x_{tau-1}; P's
next-token distribution there comes from the query of that history's last token (the last
prompt token when tau = 1). :func:`divergence_attention` replays that one step on P's full
prompt cache with eager attention (a forward of the tau tokens, not a prefill; a unit's
divergent replicates in one batch) and reads the query's attention weights a_{l,h}(j) on each
prompt position j, per layer l and query head h.

Each prompt entry of layer l and KV head g has a loss weight w_{l,g}(j)
(:func:`loss_weights`): 1 where Q's cache does not hold it (evicted, or hidden by a
head-adaptive press); for an entry it holds, the relative distance of Q's stored key and value
from P's, ``||(k', v') - (k, v)|| / ||(k, v)||`` capped at 1 (0 for an entry kept as it is;
the quantization error for a quantized cache). Q's entries are matched to prompt positions as
the nearest of P's (key, value) entries of the same layer and KV head (kvpress stores kept
entries in its own order and records no positions; RoPE makes P's entries distinct). The lost
mass on position j is the uniform mean over layers and query heads

    m(j) = (1 / (L * H_q)) sum_l sum_h a_{l,h}(j) * w_{l,g(h)}(j),

with g(h) the KV head of query head h; its total over j is the share of P's attention, so
averaged, that fell on what Q lost. Decode-time evictions (``decoding-*`` actions) are not
counted: only the prompt cache is compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from kvdrift.lm.prefill import PromptCache, unwrap_model
from kvdrift.lm.shared_attention import attention_implementation

#: Prompt positions recorded per divergent replicate, the most lost attention first.
TOP_POSITIONS = 5
#: Histories replayed in one forward (bounds the attention weights held at once).
REPLAY_ROWS = 8


@dataclass(frozen=True)
class LostContext:
    """The prompt positions whose lost attention mass is largest, largest first (only those
    with a positive mass), their masses m(j), and the total lost mass over all positions."""

    positions: tuple[int, ...]
    shares: tuple[float, ...]
    lost_mass: float


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
