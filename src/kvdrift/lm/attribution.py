"""What Q's cache had lost at the divergence: the prompt entries that P's query attended to at
a replicate's first divergence and that Q's cache no longer holds (docs/method.md, section 8,
"What the compressed cache had lost at the divergence").

At the first divergence tau the two branches share the history x_1..x_{tau-1}; P's
next-token distribution there comes from the query of that history's last token (the last
prompt token when tau = 1). The replay (:func:`replay`) runs that one step on P's full prompt
cache (a forward of the tau tokens, not a prefill; :data:`REPLAY_ROWS` histories per forward)
and reads, in every layer l, only the last query's attention weights a_{l,h}(j) on each
prompt position j, per query head h.

Each prompt entry of layer l and KV head g has a loss weight w_{l,g}(j)
(:func:`loss_weights`): 1 where Q's cache does not hold it (evicted, or hidden by a
head-adaptive press); for an entry it holds, the relative distance of Q's stored key and value
from P's, ``||(k', v') - (k, v)|| / ||(k, v)||`` capped at 1 (0 for an entry kept as it is;
the quantization error for a quantized cache). Q's entries are matched to prompt positions by
:mod:`kvdrift.lm.engine.entry_positions` (bit for bit where a press kept P's entry as it is,
else the nearest of P's entries of the same layer and KV head). The lost mass on position j is the
uniform mean over layers and query heads

    m(j) = (1 / (L * H_q)) sum_l sum_h a_{l,h}(j) * w_{l,g(h)}(j),

with g(h) the KV head of query head h; its total over j is the share of P's attention, so
averaged, that fell on what Q lost. Decode-time evictions (``decoding-*`` actions) are not
counted: only the prompt cache is compared.

Memory is linear in the prompt length n. Besides the model and P's prompt cache (read where it
is, never copied), the attribution of a unit holds the loss weights (``[layers, kv_heads, n]``
float64), the masses of its histories (``[R, n]`` float64), one layer's entries and matches at a
time (``O(kv_heads * n * head_dim)``), and per replay forward of r <= ``rows`` histories of at
most t tokens: the forward's activations (``O(r * t * (hidden + intermediate))``) and one
layer's last-query weights (``[r, heads, n]`` float32, with a float64 product of the same shape).
No attention matrix over all queries is built: the replay's attention is one fused call over the
prompt (the kernel of :mod:`kvdrift.lm.engine.shared_attention`) and one over the history, merged by
their log-sum-exps, and the last query's row is computed from its scores and that log-sum-exp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface

from kvdrift.lm.engine.entry_positions import held_positions
from kvdrift.lm.engine.prefill import PromptCache, unwrap_model
from kvdrift.lm.engine.shared_attention import (  # the shared-prompt attention's own kernels
    _fused_attention,
    _merge,
    _prompt_attention,
    attention_implementation,
    hidden_bias,
)

#: Prompt positions recorded per divergent replicate, the most lost attention first.
TOP_POSITIONS = 5
#: Histories replayed in one forward by default (bounds the activations held at once).
REPLAY_ROWS = 8
#: The replay's attention, registered with transformers (module docstring).
REPLAY_ATTENTION = "kvdrift_last_row"


@dataclass(frozen=True)
class LostContext:
    """The prompt positions whose lost attention mass is largest, largest first (only those
    with a positive mass), their masses m(j), and the total lost mass over all positions."""

    positions: tuple[int, ...]
    shares: tuple[float, ...]
    lost_mass: float


#: How Q's entries are matched to prompt positions: (P's ``[kv_heads, n, c]``, Q's
#: ``[kv_heads, m, c]``, one dtype) -> ``[kv_heads, m]`` long.
Match = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def loss_weights(reference: PromptCache, compressed: PromptCache,
                 match: Match = held_positions) -> torch.Tensor:
    """``[layers, kv_heads, n]`` float64: w_{l,g}(j) of every prompt entry (module docstring);
    all zero where Q's cache is P's. ``match`` finds each held entry's position (another
    matcher only to compare with, as the tests do)."""
    n = reference.n_prompt
    layers = []
    for i, (kp, vp) in enumerate(zip(reference.keys, reference.values, strict=True)):
        kq, vq = compressed.keys[i], compressed.values[i]
        entry = torch.cat([kp[0], vp[0]], -1)  # [kv_heads, n, 2d]
        held = torch.cat([kq[0], vq[0]], -1).to(entry.dtype)  # [kv_heads, P_l, 2d]
        nearest = match(entry, held)  # [kv_heads, P_l] position of each
        at = entry.gather(1, nearest[..., None].expand(-1, -1, entry.shape[-1])).double()
        held = held.double()
        distortion = ((held - at).norm(dim=-1) / at.norm(dim=-1).clamp_min(1e-30)).clamp(0, 1)
        live = compressed.live[i] if compressed.live is not None else None
        if live is not None:  # hidden entries count as lost
            distortion = torch.where(live[0].to(distortion.device), distortion, 1.0)
        w = torch.ones(entry.shape[0], n, dtype=torch.float64, device=entry.device)
        w.scatter_reduce_(1, nearest, distortion, reduce="amin")
        layers.append(w)
    return torch.stack(layers)


#: What the replay's attention hands back per layer: (layer, last-query weights [r, heads, n]).
RowSink = Callable[[int, torch.Tensor], None]


@dataclass(frozen=True)
class _Replay:
    """What the replay's attention reads besides the forward's own tensors."""

    reference: PromptCache  # P's prompt cache; entries 0..n-2 are read, never copied
    last: torch.Tensor  # [r] long: each row's last query (its history's length)
    sink: RowSink


def divergence_attention(model: Any, reference: PromptCache, prompt_ids: torch.Tensor,
                         histories: Sequence[torch.Tensor], rows: int = REPLAY_ROWS
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """P's attention at the step after each history (``[m]`` long, m >= 0 generated tokens):
    ``[R, layers, heads, n]`` float64 weights of each history's last query on the prompt
    positions, and those steps' next-token logits ``[R, V]`` (P's, for checking the replay).

    Its memory is what it returns (``R * layers * heads * n`` weights) on top of the replay's
    (module docstring); :func:`lost_contexts` reduces each layer's row as it comes instead."""
    got: dict[int, dict[int, torch.Tensor]] = {}  # history -> layer -> [heads, n]

    def keep(chunk: Sequence[int]) -> RowSink:
        def sink(layer: int, weights: torch.Tensor) -> None:
            for r, i in enumerate(chunk):
                got.setdefault(i, {})[layer] = weights[r].double()
        return sink

    logits = replay(model, reference, prompt_ids, histories, keep, rows)
    layers = range(len(reference.keys))
    return torch.stack([torch.stack([got[i][layer] for layer in layers])
                        for i in range(len(histories))]), logits


def replay(model: Any, reference: PromptCache, prompt_ids: torch.Tensor,
           histories: Sequence[torch.Tensor], sink_for: Callable[[Sequence[int]], RowSink],
           rows: int = REPLAY_ROWS) -> torch.Tensor:
    """Replay P's step after each history, ``rows`` histories per forward, right-padded, in
    order of length (the least padding): a causal query never sees the padding after it, so
    each row's last real query is its own step. Each forward's rows (indices into
    ``histories``) get a sink from ``sink_for``, which receives every layer's last-query
    weights ``[r, heads, n]`` (float32 at least) as the layer runs. Returns the steps'
    next-token logits ``[R, V]`` float32 in the order given."""
    if rows < 1:
        raise ValueError(f"rows must be a positive number of histories per forward; got {rows}")
    model = unwrap_model(model)
    order = sorted(range(len(histories)), key=lambda i: histories[i].numel())
    logits = []
    for start in range(0, len(order), rows):
        chunk = order[start:start + rows]
        logits.append(_forward(model, reference, prompt_ids, [histories[i] for i in chunk],
                               sink_for(chunk)))
    back = torch.argsort(torch.tensor(order))  # the rows in the order given
    return torch.cat(logits)[back]


def _forward(model: Any, reference: PromptCache, prompt_ids: torch.Tensor,
             histories: Sequence[torch.Tensor], sink: RowSink) -> torch.Tensor:
    """One replay forward of at most ``rows`` histories (:func:`replay`): the last prompt
    token and each history at positions n-1.., attending to P's entries 0..n-2 through
    :data:`REPLAY_ATTENTION`; returns each row's next-token logits ``[r, V]``."""
    n, count = reference.n_prompt, len(histories)
    device = reference.keys[0].device
    ids, last = replay_ids(prompt_ids, histories, device)
    positions = torch.arange(n - 1, n - 1 + ids.shape[1], device=device)
    keep = torch.unique(last)  # the sequence indices whose logits are computed
    state = _Replay(reference, last, sink)
    with torch.no_grad(), attention_implementation(model, REPLAY_ATTENTION):
        out = model(input_ids=ids, position_ids=positions.expand(count, -1), use_cache=False,
                    logits_to_keep=keep, kvdrift_replay=state)
    at = torch.searchsorted(keep, last)
    return out.logits[torch.arange(count, device=device), at].float()


def replay_ids(prompt_ids: torch.Tensor, histories: Sequence[torch.Tensor],
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The replay's tokens ``[r, t]`` (the last prompt token, then each history, right-padded
    with 0) and each row's last query ``[r]`` long (its history's length)."""
    lengths = [int(h.numel()) for h in histories]
    ids = torch.zeros(len(histories), 1 + max(lengths), dtype=torch.long, device=device)
    ids[:, 0] = prompt_ids.reshape(-1)[-1]
    for r, h in enumerate(histories):
        ids[r, 1:1 + lengths[r]] = h.reshape(-1).to(device)
    return ids, torch.tensor(lengths, device=device)


def last_row_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [r, heads, t, head_dim]
    key: torch.Tensor,  # [r, kv_heads, t, head_dim]: the replayed tokens' keys
    value: torch.Tensor,  # [r, kv_heads, t, head_dim]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    kvdrift_replay: _Replay | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The replay's attention (registered as :data:`REPLAY_ATTENTION`): exact causal attention
    of the replayed tokens over P's prompt entries 0..n-2 (shared by every row) and the
    replayed tokens before them, the prompt and the history each in one fused call merged by
    log-sum-exps; and hands the sink each row's last query's weights on the n prompt positions
    (entries 0..n-2, then the replayed last prompt token)."""
    if kvdrift_replay is None:
        raise RuntimeError(f"the {REPLAY_ATTENTION!r} attention needs kvdrift_replay= in the "
                           "model's forward (it is the attribution's replay)")
    rows, heads, t, dim = query.shape
    kv_heads = key.shape[1]
    g = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    layer = module.layer_idx
    n = kvdrift_replay.reference.n_prompt
    prompt_keys = kvdrift_replay.reference.keys[layer][0, :, :n - 1]  # [kv, n-1, dim]
    prompt_values = kvdrift_replay.reference.values[layer][0, :, :n - 1]
    q = query.reshape(rows, kv_heads, g * t, dim) * scale  # head h = kv * g + its index in g
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    bias = hidden_bias(~causal.repeat(g, 1), q.dtype)[None, None]  # [1, 1, g t, t]
    out, lse_h = _fused_attention(q, key, value, bias)  # [r, kv, g t, dim], [r, kv, g t]
    lse_p = torch.full_like(lse_h, float("-inf"))  # a one-token prompt: no entry before
    if n > 1:
        shared = q.permute(1, 0, 2, 3).reshape(kv_heads, rows * g * t, dim)
        out_p, lse_p = _prompt_attention(shared, prompt_keys, prompt_values, None)
        out_p = out_p.reshape(kv_heads, rows, g * t, dim).permute(1, 0, 2, 3)
        lse_p = lse_p.reshape(kv_heads, rows, g * t).permute(1, 0, 2)  # [r, kv, g t]
        out = _merge(out_p, lse_p, out, lse_h)  # [r, kv, g t, dim]
    kvdrift_replay.sink(layer, _last_row(q, key, prompt_keys, lse_p, lse_h, kvdrift_replay.last))
    out = out.reshape(rows, kv_heads, g, t, dim).permute(0, 3, 1, 2, 4)
    return out.reshape(rows, t, heads, dim).to(query.dtype), None


def _last_row(q: torch.Tensor, key: torch.Tensor, prompt_keys: torch.Tensor,
              lse_p: torch.Tensor, lse_h: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """``[r, heads, n]`` (float32 at least): each row's last query's softmax weights on
    prompt entries 0..n-2 and on the replayed last prompt token (the history's first entry),
    from its scores and the log-sum-exps of the two parts of its attention."""
    rows, kv_heads, gt, dim = q.shape
    t = key.shape[2]
    g = gt // t
    dtype = torch.promote_types(q.dtype, torch.float32)
    at = torch.arange(rows, device=q.device)
    query = q.reshape(rows, kv_heads, g, t, dim)[at, :, :, last].to(dtype)  # [r, kv, g, dim]
    total = torch.logaddexp(lse_p.reshape(rows, kv_heads, g, t)[at, :, :, last],
                            lse_h.reshape(rows, kv_heads, g, t)[at, :, :, last]).to(dtype)
    scores = torch.cat([torch.einsum("rkgd,knd->rkgn", query, prompt_keys.to(dtype)),
                        torch.einsum("rkgd,rkd->rkg", query, key[:, :, 0].to(dtype))[..., None]],
                       dim=-1)  # [r, kv, g, n]
    return torch.exp(scores - total[..., None]).reshape(rows, kv_heads * g, -1)


def lost_contexts(model: Any, reference: PromptCache, compressed: PromptCache,
                  prompt_ids: torch.Tensor, histories: Sequence[torch.Tensor],
                  top: int = TOP_POSITIONS, rows: int = REPLAY_ROWS) -> list[LostContext]:
    """For each history (a divergent replicate's x_1..x_{tau-1}), the prompt positions Q had
    lost, ranked by P's attention at the step after it (module docstring); ``rows`` histories
    are replayed per forward."""
    if compressed is reference or not histories:
        return [LostContext((), (), 0.0) for _ in histories]
    w = loss_weights(reference, compressed)  # [layers, kv_heads, n]
    masses = torch.zeros(len(histories), reference.n_prompt, dtype=torch.float64,
                         device=w.device)  # [R, n]

    def add(chunk: Sequence[int]) -> RowSink:
        index = torch.tensor(list(chunk), device=w.device)

        def sink(layer: int, weights: torch.Tensor) -> None:  # [r, heads, n]
            per_kv = weights.shape[1] // w.shape[1]
            lost = weights.double() * w[layer].repeat_interleave(per_kv, dim=0)
            masses.index_add_(0, index, lost.mean(1))  # the mean over query heads
        return sink

    replay(model, reference, prompt_ids, histories, add, rows)
    return ranked(masses / w.shape[0], top)  # and over layers


def ranked(masses: torch.Tensor, top: int = TOP_POSITIONS) -> list[LostContext]:
    """Each row of ``masses`` ``[R, n]`` (m(j) of a history) as its :class:`LostContext`."""
    out = []
    for mass in masses:
        order = torch.argsort(mass, descending=True, stable=True)[:top]
        chosen = [int(j) for j in order if float(mass[j]) > 0]
        out.append(LostContext(tuple(chosen), tuple(float(mass[j]) for j in chosen),
                               float(mass.sum())))
    return out


# kvpress wraps every attention function registered when it is imported; shared_attention
# (imported above) imports kvpress first, so this one stays unwrapped.
AttentionInterface.register(REPLAY_ATTENTION, last_row_attention)
