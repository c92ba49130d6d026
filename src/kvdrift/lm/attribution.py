"""What Q's cache had lost at the divergence: the prompt entries that P's query attended to at
a replicate's first divergence and that Q's cache no longer holds (docs/method.md, section 9).

At the first divergence tau the two branches share the history x_1..x_{tau-1}; P's
next-token distribution there comes from the query of that history's last token (the last
prompt token when tau = 1). :func:`divergence_attention` replays that one step on P's full
prompt cache with eager attention (one forward of the tau tokens, not a prefill) and reads the
query's attention weights a_{l,h}(j) on each prompt position j, per layer l and query head h.

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

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from kvdrift.lm.prefill import PromptCache, unwrap_model
from kvdrift.lm.shared_attention import attention_implementation

#: Prompt positions recorded per divergent replicate, the most lost attention first.
TOP_POSITIONS = 5


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
        kp, vp = kp[0].double(), vp[0].double()  # [kv_heads, n, d]
        kq, vq = kq[0].double(), vq[0].double()  # [kv_heads, P_l, d]
        entry = torch.cat([kp, vp], -1)  # [kv_heads, n, 2d]
        held = torch.cat([kq, vq], -1)  # [kv_heads, P_l, 2d]
        nearest = torch.cdist(held, entry).argmin(-1)  # [kv_heads, P_l] position of each
        at = entry.gather(1, nearest[..., None].expand(-1, -1, entry.shape[-1]))
        distortion = ((held - at).norm(dim=-1) / at.norm(dim=-1).clamp_min(1e-30)).clamp(0, 1)
        live = compressed.live[i] if compressed.live is not None else None
        if live is not None:  # hidden entries count as lost
            distortion = torch.where(live[0].to(distortion.device), distortion, 1.0)
        w = torch.ones(kp.shape[0], n, dtype=torch.float64, device=kp.device)
        w.scatter_reduce_(1, nearest, distortion, reduce="amin")
        layers.append(w)
    return torch.stack(layers)


def divergence_attention(model: Any, reference: PromptCache, prompt_ids: torch.Tensor,
                         history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """P's attention at the step after ``history`` (``[m]`` long, m >= 0 generated tokens):
    ``[layers, heads, n]`` float64 weights of the last query on the prompt positions, and
    that step's next-token logits ``[V]`` (P's, for checking the replay)."""
    model = unwrap_model(model)
    n = reference.n_prompt
    ids = torch.cat([prompt_ids.reshape(1, -1)[:, -1:], history.reshape(1, -1).long()], 1)
    cache = DynamicCache(config=model.config)
    for i, (k, v) in enumerate(zip(reference.keys, reference.values, strict=True)):
        cache.update(k[:, :, :n - 1].clone(), v[:, :, :n - 1].clone(), i)
    positions = torch.arange(n - 1, n - 1 + ids.shape[1], device=ids.device)
    with torch.no_grad(), attention_implementation(model, "eager"):
        out = model(input_ids=ids.to(model.device), past_key_values=cache,
                    position_ids=positions[None], cache_position=positions, use_cache=True,
                    output_attentions=True, logits_to_keep=1)
    weights = torch.stack([a[0, :, -1, :n].double() for a in out.attentions])
    return weights, out.logits[0, -1].float()


def lost_context(model: Any, reference: PromptCache, compressed: PromptCache,
                 prompt_ids: torch.Tensor, history: torch.Tensor,
                 top: int = TOP_POSITIONS, weights: torch.Tensor | None = None) -> LostContext:
    """The prompt positions Q had lost, ranked by P's attention at the step after
    ``history`` (module docstring); ``weights``: :func:`loss_weights`, when already computed."""
    if compressed is reference:
        return LostContext((), (), 0.0)
    w = loss_weights(reference, compressed) if weights is None else weights
    attention, _ = divergence_attention(model, reference, prompt_ids, history)
    per_kv = attention.shape[1] // w.shape[1]
    mass = (attention * w.repeat_interleave(per_kv, dim=1)).mean(dim=(0, 1))  # [n]
    order = torch.argsort(mass, descending=True, stable=True)[:top]
    chosen = [int(j) for j in order if float(mass[j]) > 0]
    return LostContext(tuple(chosen), tuple(float(mass[j]) for j in chosen),
                       float(mass.sum()))
