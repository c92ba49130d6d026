"""Which prompt position each entry of Q's cache holds, in memory linear in the prompt length.

kvpress stores a layer's kept entries in its own order and records no positions, so Q's entries
are matched to P's (docs/method.md, section 8): each held (key, value) entry of a KV head is
the nearest of P's entries of the same layer and KV head (RoPE makes P's entries distinct).

An eviction press keeps P's entries as they are (kvpress gathers them), so most held entries are
bit for bit one of P's: those are found by their bits (:func:`exact_positions`, a hash of every
entry, a sort and a binary search: no ``[kept, n]`` matrix). The others (a quantized or
re-rotated entry, or one whose bits P holds twice under one hash) are matched by distance
(:func:`nearest_positions`) in chunks of at most :data:`MATCH_DISTANCES` distances, so memory
stays linear in the prompt length whatever the press did.
"""

from __future__ import annotations

import torch

#: Distances computed at once per chunk when matching by distance (float32: 64 MiB).
MATCH_DISTANCES = 1 << 24
#: Entries hashed or compared at once per chunk in the exact lookup.
HASH_ENTRIES = 1 << 12
_HASH_SEED = 45


def held_positions(entries: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``[kv_heads, m]`` long: for each held entry (``held`` ``[kv_heads, m, c]``) the position
    of P's entry (``entries`` ``[kv_heads, n, c]``, same dtype) it is: the one with the same bits
    where there is one, else the nearest (the first of equally near ones, as ``argmin``)."""
    positions, exact = exact_positions(entries, held)
    for g in range(held.shape[0]):
        rest = (~exact[g]).nonzero().flatten()
        if rest.numel():
            positions[g, rest] = nearest_positions(entries[g], held[g, rest])
    return positions


def exact_positions(entries: torch.Tensor, held: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``([kv_heads, m] long, [kv_heads, m] bool)``: for each held entry the first of P's
    entries with the same bits, and whether there is one (the positions are meaningless where
    not). Each entry's bits are hashed to one int64 (a random linear form in wrapping-free
    integer arithmetic, so the order of the sum cannot change it); equal hashes are confirmed
    bit for bit."""
    if entries.dtype != held.dtype or entries.shape[-1] != held.shape[-1]:
        raise ValueError(f"held entries {held.dtype} {tuple(held.shape)} and P's "
                         f"{entries.dtype} {tuple(entries.shape)} must have one dtype and width")
    words_p, words_q = _words(entries), _words(held)  # [kv, n, w], [kv, m, w] int16
    multipliers = _multipliers(words_p.shape[-1], entries.device)
    hashes, order = torch.sort(_hash(words_p, multipliers), dim=-1, stable=True)  # [kv, n]
    wanted = _hash(words_q, multipliers)  # [kv, m]
    at = torch.searchsorted(hashes, wanted).clamp_max(hashes.shape[-1] - 1)
    positions = order.gather(-1, at)  # the first position in P's order among equal hashes
    exact = torch.empty(positions.shape, dtype=torch.bool, device=positions.device)
    for start in range(0, positions.shape[-1], HASH_ENTRIES):
        part = positions[:, start:start + HASH_ENTRIES]
        found = words_p.gather(1, part[..., None].expand(-1, -1, words_p.shape[-1]))
        exact[:, start:start + HASH_ENTRIES] = (found == words_q[:, start:start + part.shape[1]]
                                                ).all(-1)
    return positions, exact


def nearest_positions(entries: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``[m]`` long: the nearest of P's entries ``[n, c]`` (Euclidean, float32) to each held
    entry ``[m, c]``, the first of equally near ones; :data:`MATCH_DISTANCES` distances at a
    time."""
    entries = entries.float()[None]
    chunk = max(1, MATCH_DISTANCES // entries.shape[1])
    return torch.cat([torch.cdist(held[start:start + chunk].float()[None], entries)[0].argmin(-1)
                      for start in range(0, held.shape[0], chunk)])


def _words(t: torch.Tensor) -> torch.Tensor:
    """The bits of each entry as 16-bit words ``[..., c * itemsize / 2]``."""
    t = t.contiguous()
    return t.view(torch.int16) if t.element_size() % 2 == 0 else t.view(torch.int8).short()


def _multipliers(width: int, device: torch.device) -> torch.Tensor:
    """``[width]`` int64 in [1, 2^M) with ``width * 2^15 * 2^M < 2^63``: the hash's sum of
    products of 16-bit words never overflows."""
    bits = 62 - 15 - max(1, (width - 1).bit_length())
    gen = torch.Generator().manual_seed(_HASH_SEED)
    return torch.randint(1, 1 << bits, (width,), generator=gen, dtype=torch.long).to(device)


def _hash(words: torch.Tensor, multipliers: torch.Tensor) -> torch.Tensor:
    """``[kv, n]`` int64: each entry's words times ``multipliers``, summed (by chunks of
    :data:`HASH_ENTRIES` entries, so the int64 products stay small)."""
    return torch.cat([(words[:, start:start + HASH_ENTRIES].long() * multipliers).sum(-1)
                      for start in range(0, words.shape[1], HASH_ENTRIES)], dim=1)
